"""An in-memory stand-in for coderun_operator.k8s, the controller's only seam to the API server.

It keeps objects by (kind, namespace, name), answers like the real module (None when created, the existing
object on AlreadyExists, None for a missing object) and can be told to refuse or fail calls, so controller
tests exercise every verdict and every refusal without a cluster.
"""
from __future__ import annotations

import copy
import itertools
from typing import TYPE_CHECKING, Any, Callable, Union

from coderun.api.identity import admission_policies
from coderun_operator.k8s import Conflict, Refused, Transient
from coderun_operator.kube_api import KubeApi, Obj

__all__ = ["Conflict", "FakeK8s", "Refused", "Transient"]

# What an attached pod answers: a function of the bytes sent, or the exception its attach raises.
AttachAnswer = Union[Callable[[bytes | None], bytes], Exception]


class FakeK8s:
    Conflict = Conflict
    Refused = Refused
    Transient = Transient

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.events: list[tuple[str, str, str]] = []
        self.logs: dict[str, tuple[str, bool]] = {}
        self.calls: list[str] = []
        self.call_args: list[tuple[Any, ...]] = []  # beside calls, the arguments of each
        self.nodes_ = [{"status": {"allocatable": {"cpu": "2", "memory": "8Gi"},
                                   "images": [{"names": ["coderun.local/sandbox-python:v2",
                                                         "coderun.local/sandbox-python@sha256:" + "f" * 64]}]}}]
        # call name -> function(args) that may raise, to simulate the API server refusing or failing
        self.fail: dict[str, Callable[..., Any]] = {}
        self._versions = itertools.count(100)
        self._names = itertools.count(1)
        self.attach_answers: dict[str, AttachAnswer] = {}
        self.sent: dict[str, bytes] = {}
        # cluster-scoped admission objects by (kind, name): the chart's, installed unless a test removes them
        self.admission: dict[tuple[str, str], Obj] = {
            (o["kind"], o["metadata"]["name"]): o for o in copy.deepcopy(admission_policies())}
        self.policies: list[dict[str, Any]] = []  # what list_policies answers
        # (user or group, verb, resource, namespace, name) the authorizer allows
        self.grants: set[tuple[str, str, str, str, str]] = set()

    def _hook(self, name: str, *args: Any) -> None:
        self.calls.append(name)
        self.call_args.append(args)
        if name in self.fail:
            self.fail[name](*args)

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"]["resourceVersion"] = str(next(self._versions))
        return obj

    # ---- children
    def create_or_get(self, obj: Obj) -> Obj | None:
        self._hook("create_or_get", obj)
        key = (obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])
        if key in self.objects:
            return copy.deepcopy(self.objects[key])
        self.objects[key] = self._stamp(copy.deepcopy(obj))
        return None

    def replace_network_policy(self, obj: Obj, resource_version: str) -> None:
        self._hook("replace_network_policy", obj)
        self.objects[("NetworkPolicy", obj["metadata"]["namespace"], obj["metadata"]["name"])] = \
            self._stamp(copy.deepcopy(obj))

    def get_pod(self, namespace: str, name: str) -> Obj | None:
        self._hook("get_pod", namespace, name)
        return copy.deepcopy(self.objects.get(("Pod", namespace, name)))

    def delete_pod(self, namespace: str, name: str, resource_version: str | None = None) -> None:
        self._hook("delete_pod", namespace, name)
        pod = self.objects.get(("Pod", namespace, name))
        if pod is not None and resource_version not in (None, pod["metadata"]["resourceVersion"]):
            return  # the precondition failed: the pod changed since the caller saw it
        self.objects.pop(("Pod", namespace, name), None)

    # ---- the warm pool
    def create_pod(self, pod: Obj) -> Obj:
        self._hook("create_pod", pod)
        pod = copy.deepcopy(pod)
        meta = pod["metadata"]
        meta["name"] = meta.pop("generateName") + str(next(self._names))
        meta["uid"] = f"pod-uid-{meta['name']}"
        meta["creationTimestamp"] = "2026-11-22T09:00:00Z"
        self.objects[("Pod", meta["namespace"], meta["name"])] = self._stamp(pod)
        return copy.deepcopy(pod)

    def claim_pod(self, namespace: str, name: str, patch: list[Obj]) -> Obj | None:
        """JSON patch with the API server's semantics for what the claim uses: test, then replace."""
        self._hook("claim_pod", namespace, name, patch)
        pod = self.objects.get(("Pod", namespace, name))
        if pod is None:
            return None
        patched = copy.deepcopy(pod)
        for op in patch:
            *parents, leaf = op["path"].strip("/").split("/")
            target = patched
            for part in parents:
                target = target[part]
            if op["op"] == "test":
                if target.get(leaf) != op["value"]:
                    return None
            else:
                target[leaf] = copy.deepcopy(op["value"])
        self.objects[("Pod", namespace, name)] = self._stamp(patched)
        return copy.deepcopy(patched)

    def resize_pod_cpu(self, namespace: str, name: str, container: str, cpu: str) -> None:
        self._hook("resize_pod_cpu", namespace, name, container, cpu)
        pod = self.objects[("Pod", namespace, name)]
        (found,) = [c for c in pod["spec"]["containers"] if c["name"] == container]
        found["resources"]["requests"]["cpu"] = cpu
        self._stamp(pod)

    def attach(self, namespace: str, pod: str, container: str) -> _FakeAttached:
        """`attach_answers[pod]`: a function(input bytes) -> stdout bytes, or an exception to raise."""
        self._hook("attach", namespace, pod)
        answer = self.attach_answers.get(pod)
        if isinstance(answer, Exception) or answer is None:
            raise answer or Transient(f"attach to pod {pod}: no such stream")
        return _FakeAttached(answer, self.sent, pod)

    def read_log(self, namespace: str, pod: str, container: str, limit_bytes: int, since_seconds: int | None = None,
                 timeout: float | None = None) -> tuple[str, bool]:
        """`logs[pod]`: (text, complete); a log of a pod that is gone is not found (Transient, as k8s.py says)."""
        self._hook("read_log", namespace, pod)
        if pod not in self.logs and ("Pod", namespace, pod) not in self.objects:
            raise Transient(f"log of pod {pod}: API server answered 404 Not Found")
        text, complete = self.logs.get(pod, ("", True))
        return text[:limit_bytes], complete and len(text) <= limit_bytes

    def read_configmap(self, namespace: str, name: str) -> Obj | None:
        self._hook("read_configmap", namespace, name)
        return copy.deepcopy(self.objects.get(("ConfigMap", namespace, name)))

    # ---- runs
    def add_run(self, run: Obj) -> Obj:
        run = self._stamp(copy.deepcopy(run))
        self.objects[("CodeRun", run["metadata"]["namespace"], run["metadata"]["name"])] = run
        return copy.deepcopy(run)

    def run(self, namespace: str, name: str) -> Obj | None:
        return self.objects.get(("CodeRun", namespace, name))

    def list_runs(self, namespace: str) -> list[Obj]:
        self._hook("list_runs", namespace)
        return [copy.deepcopy(o) for (kind, ns, _), o in self.objects.items() if kind == "CodeRun" and ns == namespace]

    def get_run(self, namespace: str, name: str) -> Obj | None:
        self._hook("get_run", namespace, name)
        return copy.deepcopy(self.run(namespace, name))

    def patch_run_status(self, namespace: str, name: str, status: Obj) -> Obj | None:
        self._hook("patch_run_status", namespace, name, status)
        run = self.run(namespace, name)
        if run is None:
            return None
        merged = {**(run.get("status") or {}), **status}
        run["status"] = {k: v for k, v in merged.items() if v is not None}
        return copy.deepcopy(self._stamp(run))

    def label_run(self, namespace: str, name: str, labels: dict[str, str]) -> Obj | None:
        self._hook("label_run", namespace, name, labels)
        run = self.run(namespace, name)
        if run is None:
            return None
        run["metadata"].setdefault("labels", {}).update(labels)
        return copy.deepcopy(self._stamp(run))

    def delete_run(self, namespace: str, name: str, uid: str) -> None:
        self._hook("delete_run", namespace, name, uid)
        run = self.run(namespace, name)
        if run is not None and run["metadata"]["uid"] == uid:
            del self.objects[("CodeRun", namespace, name)]

    def list_policies(self) -> list[Obj]:
        self._hook("list_policies")
        return copy.deepcopy(self.policies)

    def patch_policy_status(self, namespace: str, name: str, status: Obj) -> Obj | None:
        self._hook("patch_policy_status", namespace, name, status)
        policy = next((p for p in self.policies if (p["metadata"]["namespace"], p["metadata"]["name"]) ==
                       (namespace, name)), None)
        if policy is None:
            return None
        merged = {**(policy.get("status") or {}), **status}
        policy["status"] = {k: v for k, v in merged.items() if v is not None}
        return copy.deepcopy(self._stamp(policy))

    # ---- identity
    def read_admission_policy(self, name: str) -> Obj | None:
        self._hook("read_admission_policy", name)
        return copy.deepcopy(self.admission.get(("ValidatingAdmissionPolicy", name)))

    def read_admission_policy_binding(self, name: str) -> Obj | None:
        self._hook("read_admission_policy_binding", name)
        return copy.deepcopy(self.admission.get(("ValidatingAdmissionPolicyBinding", name)))

    def allowed(self, user: str, groups: list[str], verb: str, resource: str, namespace: str, name: str) -> bool:
        self._hook("allowed", user, groups, verb, resource, namespace, name)
        return any((who, verb, resource, namespace, name) in self.grants for who in [user, *groups])

    # ---- nodes, events
    def nodes(self) -> list[Obj]:
        self._hook("nodes")
        return copy.deepcopy(self.nodes_)

    def post_event(self, obj: Obj, type_: str, reason: str, message: str) -> None:
        self._hook("post_event", obj, type_, reason, message)
        self.events.append((type_, reason, message))

    # ---- the egress proxy
    def read_service(self, namespace: str, name: str) -> Obj | None:
        self._hook("read_service", namespace, name)
        return copy.deepcopy(self.objects.get(("Service", namespace, name)))

    def list_pods(self, namespace: str, labels: dict[str, str]) -> list[Obj]:
        self._hook("list_pods", namespace, labels)
        return [copy.deepcopy(o) for (kind, ns, _), o in self.objects.items() if kind == "Pod" and ns == namespace
                and labels.items() <= (o["metadata"].get("labels") or {}).items()]

    # ---- sessions
    def add_session(self, session: Obj) -> Obj:
        session = self._stamp(copy.deepcopy(session))
        self.objects[("CodeRunSession", session["metadata"]["namespace"], session["metadata"]["name"])] = session
        return copy.deepcopy(session)

    def get_session(self, namespace: str, name: str) -> Obj | None:
        self._hook("get_session", namespace, name)
        return copy.deepcopy(self.objects.get(("CodeRunSession", namespace, name)))

    def patch_session_status(self, namespace: str, name: str, status: Obj) -> Obj | None:
        self._hook("patch_session_status", namespace, name, status)
        session = self.objects.get(("CodeRunSession", namespace, name))
        if session is None:
            return None
        merged = {**(session.get("status") or {}), **status}
        session["status"] = {k: v for k, v in merged.items() if v is not None}
        return copy.deepcopy(self._stamp(session))

    def delete_session(self, namespace: str, name: str, uid: str) -> None:
        self._hook("delete_session", namespace, name, uid)
        session = self.objects.get(("CodeRunSession", namespace, name))
        if session is not None and session["metadata"]["uid"] == uid:
            del self.objects[("CodeRunSession", namespace, name)]

    # ---- webhook TLS
    def read_secret(self, namespace: str, name: str) -> Obj | None:
        self._hook("read_secret", namespace, name)
        return copy.deepcopy(self.objects.get(("Secret", namespace, name)))

    def write_secret(self, namespace: str, name: str, secret: Obj, resource_version: str | None) -> None:
        self._hook("write_secret", namespace, name)
        held = self.objects.get(("Secret", namespace, name))
        if (held or {}).get("metadata", {}).get("resourceVersion") != resource_version:
            raise Conflict(f"Secret {name}: 409")
        body = copy.deepcopy(secret)
        body["metadata"] = {**body.get("metadata", {}), "name": name, "namespace": namespace}
        self.objects[("Secret", namespace, name)] = self._stamp(body)

    def read_webhook_configuration(self, name: str) -> Obj | None:
        self._hook("read_webhook_configuration", name)
        return copy.deepcopy(self.objects.get(("ValidatingWebhookConfiguration", "", name)))

    def set_webhook_ca_bundle(self, name: str, webhook_names: list[str], ca_bundle: str) -> None:
        self._hook("set_webhook_ca_bundle", name)
        for hook in self.objects[("ValidatingWebhookConfiguration", "", name)]["webhooks"]:
            if hook["name"] in webhook_names:
                hook.setdefault("clientConfig", {})["caBundle"] = ca_bundle


class _FakeAttached:
    def __init__(self, answer: Callable[[bytes | None], bytes], sent: dict[str, bytes], pod: str) -> None:
        self._answer, self._sent, self._pod = answer, sent, pod
        self._input: bytes | None = None
        self.closed = False

    def still_open(self) -> bool:
        return not self.closed

    def send(self, data: bytes) -> None:
        self._input = self._sent[self._pod] = data

    def read_until(self, done: Callable[[bytes], bool], limit_bytes: int, seconds: float) -> bytes:
        return self._answer(self._input)

    def close(self) -> None:
        self.closed = True


if TYPE_CHECKING:
    # The fake stands in for the real module: mypy checks it has every call of the seam, with the same signature.
    _seam: KubeApi = FakeK8s()
