"""e2e fixtures: the real local cluster (started if needed), a namespace per test, polling helpers.

Synchronisation is always a predicate polled against the API with a deadline, never a fixed sleep.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity

REPO = Path(__file__).resolve().parents[1]
KUBECONFIG = REPO / ".cluster" / "kubeconfig"
from coderun.api.coderunpolicy import POLICY_PLURAL  # noqa: E402
from coderun.api.models import GROUP, PLURAL, VERSION  # noqa: E402 - the API constants, never re-declared
from coderun.client.request import creator_annotations  # noqa: E402
from coderun.api.reasons import TERMINAL_PHASES as TERMINAL  # noqa: E402
from framework.standins import StandinHits  # noqa: E402


def _kubectl_path() -> str:
    out = subprocess.run(["bash", "-c", "source e2e/cluster/versions.sh && echo $CODERUN_CACHE/bin/"
                          "kubernetes-$KUBERNETES_VERSION/kubectl"], cwd=REPO, capture_output=True, text=True)
    return out.stdout.strip()


def parse_timestamp(value: str | None) -> datetime | None:
    """A time as the API writes it (RFC 3339; Python 3.11 reads its Z)."""
    return datetime.fromisoformat(value) if value else None


def millicpu(quantity: str) -> int:
    """A CPU quantity ("250m", "1", "1.5") in millicores, parsed as the operator parses quantities."""
    return int(parse_quantity(quantity) * 1000)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll until predicate returns something truthy; fail naming what we waited for."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except ApiException as e:
            last_error = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f" ({last_error})" if last_error else ""))


class Cluster:
    def __init__(self):
        config.load_kube_config(str(KUBECONFIG))
        self.api = client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.networking = client.NetworkingV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.kubectl_bin = _kubectl_path()
        self._identities: dict[str | None, dict[str, str]] = {}  # identity(): kubectl auth whoami, by --as user

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([self.kubectl_bin, "--kubeconfig", str(KUBECONFIG), *args], input=input,
                                capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def node_ip(self) -> str:
        node = self.core.list_node().items[0]
        return next(a.address for a in node.status.addresses if a.type == "InternalIP")

    def free_millicpu(self) -> int:
        """The node's allocatable CPU less what its unfinished pods request (their RuntimeClass overhead too), as
        the scheduler counts it: the room a suite may fill without its pods waiting on each other."""
        node = self.core.list_node().items[0]
        taken = 0
        for pod in self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node.metadata.name}").items:
            if pod.status.phase in ("Succeeded", "Failed"):
                continue
            requests = [(c.resources.requests or {}).get("cpu") for c in pod.spec.containers if c.resources]
            taken += sum(millicpu(r) for r in requests if r) + millicpu((pod.spec.overhead or {}).get("cpu") or "0")
        return millicpu(node.status.allocatable["cpu"]) - taken

    # ---- pods
    def create_pod(self, namespace: str, name: str, command: list[str], runtime_class: str | None = "gvisor",
                   image: str = "coderun.local/busybox:1.36", labels: dict | None = None,
                   owner: dict | None = None) -> dict:
        """A pod that Pod Security `restricted` admits: non-root, no privilege escalation, no capabilities."""
        metadata = {"name": name, "labels": labels or {}}
        if owner:
            metadata["ownerReferences"] = [owner]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
               "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534,
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                        "command": command,
                                        "securityContext": {"allowPrivilegeEscalation": False,
                                                            "capabilities": {"drop": ["ALL"]}}}]}}
        if runtime_class:
            pod["spec"]["runtimeClassName"] = runtime_class
        self.core.create_namespaced_pod(namespace, pod)
        return pod

    def pod_phase(self, namespace: str, name: str) -> str:
        return self.core.read_namespaced_pod(name, namespace).status.phase

    def wait_pod_done(self, namespace: str, name: str, timeout: float = 90) -> str:
        return wait_for(lambda: self.pod_phase(namespace, name) in ("Succeeded", "Failed")
                        and self.pod_phase(namespace, name), timeout, f"pod {namespace}/{name} to finish")

    def pod_ip(self, namespace: str, name: str, timeout: float = 60) -> str:
        return wait_for(lambda: self.core.read_namespaced_pod(name, namespace).status.pod_ip, timeout,
                        f"pod {namespace}/{name} to get an IP")

    def run_pods(self, namespace: str) -> list:
        """The namespace's pods other than waiting warm pool pods (a claimed one is a run's pod)."""
        return [p for p in self.core.list_namespaced_pod(namespace).items
                if "coderun.io/pool" not in (p.metadata.labels or {}) or "coderun.io/run" in p.metadata.labels]

    def logs(self, namespace: str, name: str) -> str:
        return self.core.read_namespaced_pod_log(name, namespace)

    # ---- coderuns
    def identity(self, user: str | None = None) -> dict[str, str]:
        """The creator annotations the admin (or `user`, as kubectl --as makes them) states, as the SDK states its
        own: from `kubectl auth whoami`, what the API server says the requester is."""
        if user not in self._identities:
            who = json.loads(self.kubectl(*(("--as", user) if user else ()), "auth", "whoami", "-o", "json").stdout)
            self._identities[user] = creator_annotations(who["status"]["userInfo"]["username"],
                                                         who["status"]["userInfo"].get("groups") or ())
        return self._identities[user]

    def create_run(self, namespace: str, spec: dict, name: str | None = None, **meta) -> str:
        """Create a CodeRun as the admin, stating its creator as the SDK does (meta's annotations win)."""
        name = name or f"run-{uuid.uuid4().hex[:8]}"
        meta["annotations"] = {**self.identity(), **(meta.get("annotations") or {})}
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRun",
                "metadata": {"name": name, **meta}, "spec": spec}
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        return name

    def get_run(self, namespace: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def run_names(self, namespace: str) -> list[str]:
        return [r["metadata"]["name"] for r in
                self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]]

    def wait_running(self, namespace: str, name: str, timeout: float = 60) -> str:
        """The sandbox pod's name, once the run reports Running."""
        def running_pod():
            status = self.get_run(namespace, name).get("status") or {}
            return status.get("phase") == "Running" and status["podName"]
        return wait_for(running_pod, timeout, f"CodeRun {namespace}/{name} to start")

    def wait_run(self, namespace: str, name: str, timeout: float = 90) -> dict:
        """The run once it reached a terminal phase (polls its status, as a client would)."""
        def done():
            run = self.get_run(namespace, name)
            return run if (run.get("status") or {}).get("phase") in TERMINAL else None
        return wait_for(done, timeout, f"CodeRun {namespace}/{name} to finish")

    def node_ipv6_addresses(self) -> list[str]:
        """The node's IPv6 addresses: those in its status and, when this host is the node (the local cluster),
        every non-loopback address of its interfaces, link-local ones included (without a scope)."""
        import ipaddress
        import socket
        node = self.core.list_node().items[0]
        found = [a.address for a in node.status.addresses if a.type == "InternalIP" and ":" in a.address]
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.bind((self.node_ip(), 0))
            local = True
        except OSError:
            local = False
        finally:
            probe.close()
        if local and os.path.exists("/proc/net/if_inet6"):
            for line in open("/proc/net/if_inet6"):
                raw, ifname = line.split()[0], line.split()[-1]
                if ifname != "lo":
                    found.append(str(ipaddress.IPv6Address(int(raw, 16))))
        return sorted(set(found))


def _cluster_reachable() -> bool:
    if not KUBECONFIG.exists():
        return False
    try:
        config.load_kube_config(str(KUBECONFIG))
        client.VersionApi().get_code(_request_timeout=3)
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    """The running local cluster; `make cluster-up` starts it when it is not there."""
    if not _cluster_reachable():
        subprocess.run(["make", "cluster-up"], cwd=REPO, check=True)
    return Cluster()


# Which operator the suite runs against: "host" (default; `make up-host`, the checkout as a host process) or
# "chart" (`make up`: the operator image and the Helm chart, two replicas, as users install it).
OPERATOR_MODE = os.environ.get("CODERUN_E2E_OPERATOR", "host")


class HostOperator:
    """The host-process operator (e2e/operator.sh): its endpoints on this host, its log file."""
    log_file = REPO / ".cluster" / "logs" / "operator.log"

    def healthz_url(self) -> str:
        return "http://127.0.0.1:8080/healthz"

    def metrics_url(self) -> str:
        return "http://127.0.0.1:9108/metrics"

    def log_mark(self) -> Any:
        return self.log_file.stat().st_size if self.log_file.exists() else 0

    def log_since(self, mark: Any) -> str:
        data = self.log_file.read_bytes() if self.log_file.exists() else b""
        return data[mark if len(data) >= mark else 0:].decode("utf-8", "replace")

    def control(self, action: str) -> None:
        """kill (SIGKILL), stop, start."""
        subprocess.run(["bash", "e2e/operator.sh", action], cwd=REPO, check=True, capture_output=True)


class ChartOperator:
    """The chart's operator (e2e/install.sh): the leading replica's endpoints, every replica's log."""
    # The operator's pods alone: the egress proxy's share the release's other labels.
    namespace, selector = "coderun-system", "app.kubernetes.io/instance=coderun,app.kubernetes.io/component=operator"

    def __init__(self, cluster: "Cluster"):
        self.cluster = cluster

    def leader(self):
        def one():
            pods = [p for p in self.cluster.core.list_namespaced_pod(self.namespace, label_selector=self.selector).items
                    if not p.metadata.deletion_timestamp and p.status.pod_ip
                    and (p.metadata.labels or {}).get("coderun.io/leader") == "true"]
            return pods[0] if len(pods) == 1 else None
        return wait_for(one, 60, "one leading operator replica")

    def healthz_url(self) -> str:  # the health server's /healthz asks kopf's own liveness endpoint
        return f"http://{self.leader().status.pod_ip}:8081/healthz"

    def metrics_url(self) -> str:
        return f"http://{self.leader().status.pod_ip}:9108/metrics"

    def log_mark(self) -> Any:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def log_since(self, mark: Any) -> str:
        return self.cluster.kubectl("logs", "-n", self.namespace, "-l", self.selector, "--since-time", mark,
                                    "--tail=-1", "--prefix", check=False).stdout

    def control(self, action: str) -> None:
        """kill: SIGKILL the leader's container and remove its pod (the standby takes over when the Lease
        expires); stop: no replicas; start: the chart's replicas back, with a leader."""
        deployment = ["-n", self.namespace, "deployment/coderun"]
        if action == "kill":
            leader = self.leader()
            container = leader.status.container_statuses[0].container_id.split("://", 1)[1]
            ctr = subprocess.run(["bash", "-c", "source e2e/cluster/versions.sh && echo "
                                  "$CODERUN_CACHE/bin/containerd-$CONTAINERD_VERSION/ctr"], cwd=REPO,
                                 capture_output=True, text=True, check=True).stdout.strip()
            subprocess.run([ctr, "--address", str(REPO / ".cluster" / "containerd" / "containerd.sock"), "-n",
                            "k8s.io", "tasks", "kill", "--signal", "SIGKILL", container], check=True,
                           capture_output=True)
            self.cluster.kubectl("delete", "pod", "-n", self.namespace, leader.metadata.name, "--wait=false",
                                 "--grace-period=0", "--force")
        elif action == "stop":
            self.cluster.kubectl("scale", *deployment, "--replicas=0")
            wait_for(lambda: not self.cluster.core.list_namespaced_pod(self.namespace,
                                                                       label_selector=self.selector).items,
                     90, "the operator replicas to be gone")
        elif action == "start":
            self.cluster.kubectl("scale", *deployment, "--replicas=2")
            self.leader()
        else:
            raise ValueError(action)


@pytest.fixture(scope="session")
def operator(cluster) -> Cluster:
    """The operator running from this checkout (restarted once per session, so it runs the code under test);
    `cluster.operator` controls it and says where its endpoints and log are."""
    if OPERATOR_MODE == "chart":
        if not os.environ.get("CODERUN_E2E_UP"):  # `make test` brought it up once for every pass
            subprocess.run(["make", "up"], cwd=REPO, check=True, capture_output=True)
        cluster.operator = ChartOperator(cluster)
        return cluster
    subprocess.run(["make", "up-host"], cwd=REPO, check=True, capture_output=True)
    if not os.environ.get("CODERUN_E2E_KEEP_OPERATOR"):
        subprocess.run(["bash", "e2e/operator.sh", "restart"], cwd=REPO, check=True)
    cluster.operator = HostOperator()
    return cluster


def _namespace_name(node_name: str) -> str:
    base = re.sub(r"[^a-z0-9-]", "-", node_name.lower())[:40].strip("-")
    return f"e2e-{base}-{uuid.uuid4().hex[:5]}"


# CODERUN_E2E_WARM=1 (`make test-e2e-warm`): every test namespace gets a `default` CodeRunPolicy that is the
# built-in policy plus a warm pool, and the fixture waits for the pool, so the suite's runs take warm pods.
WARM_MODE = os.environ.get("CODERUN_E2E_WARM") == "1"
# 10m: a waiting pod reserves 60m with the RuntimeClass overhead, so this pool and the next test's (made ahead,
# see SpareWarmNamespaces) reserve less together (480m) than a pool of 50m pods alone did, and a 1-core cold run
# still fits the 2-core node beside them.
WARM_POOL = {"size": 2, "cpuRequest": "10m"}
START_MODES: defaultdict[str, int] = defaultdict(int)


def apply_warm_pool(cluster, namespace: str, warm_pool: dict | None = None, ready: int | None = None,
                    wait: bool = True, **spec) -> None:
    """A `default` policy like the built-in one (admission Record) with a warm pool; waits for `ready` pods."""
    warm_pool = warm_pool or WARM_POOL
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy", "metadata": {"name": "default"},
        "spec": {"admission": "Record", "warmPool": warm_pool, **spec}})
    if wait:
        wait_for_pool(cluster, namespace, warm_pool, ready)


def wait_for_pool(cluster, namespace: str, warm_pool: dict | None = None, ready: int | None = None) -> None:
    warm_pool = warm_pool or WARM_POOL
    languages = len(warm_pool.get("languages") or ("python", "javascript"))
    wait_for(lambda: pool_ready(cluster, namespace) >= (warm_pool["size"] * languages if ready is None else ready),
             120, f"the warm pool of {namespace}")


def pool_ready(cluster, namespace: str, language: str | None = None) -> int:
    """Unclaimed warm pool pods whose runner runs (of one language, or all): a claimed pod keeps the pool's labels,
    owned by its run or session."""
    selector = f"coderun.io/pool-language={language}" if language else "coderun.io/pool"
    return sum(1 for p in cluster.core.list_namespaced_pod(namespace, label_selector=selector).items
               if not any(o.kind in ("CodeRun", "CodeRunSession") for o in p.metadata.owner_references or ())
               and not p.metadata.deletion_timestamp and p.status.container_statuses
               and p.status.container_statuses[0].state.running)


NAMESPACE_LABELS = {"pod-security.kubernetes.io/enforce": "restricted", "coderun.io/e2e": "true"}


class SpareWarmNamespaces:
    """Warm mode's test namespaces, one made ahead: while a test runs, the next test's namespace and pool start,
    so a test waits for its pool only when the last test was shorter than a pool's start (about 11 s under load,
    once per test before this). The spare left at the end is deleted with the session."""

    def __init__(self, cluster):
        self.cluster = cluster
        self._maker = ThreadPoolExecutor(1, thread_name_prefix="spare-namespace")
        self._next: Future | None = None

    def _make(self) -> str:
        name = f"e2e-warm-{uuid.uuid4().hex[:8]}"
        self.cluster.core.create_namespace({"metadata": {"name": name, "labels": NAMESPACE_LABELS}})
        apply_warm_pool(self.cluster, name, wait=False)
        return name

    def take(self, test: str) -> str:
        name = (self._next or self._maker.submit(self._make)).result()
        self._next = self._maker.submit(self._make)
        self.cluster.core.patch_namespace(name, {"metadata": {"annotations": {"coderun.io/e2e-test": test[:200]}}})
        wait_for_pool(self.cluster, name)
        return name

    def close(self) -> None:
        if self._next and not self._next.exception():
            self.cluster.core.delete_namespace(self._next.result(), propagation_policy="Background")
        self._maker.shutdown()


@pytest.fixture(scope="session")
def spare_warm_namespaces(cluster):
    spares = SpareWarmNamespaces(cluster)
    yield spares
    spares.close()


@pytest.fixture
def standin_hits(cluster) -> StandinHits:
    """What reaches the stand-ins for the internet and a metadata service from now on (framework/standins.py)."""
    return StandinHits()


@pytest.fixture
def namespace(cluster, request) -> str:
    """A fresh namespace for one test, labelled Pod Security `restricted` as the chart labels run namespaces."""
    marker = request.node.get_closest_marker("namespace_labels")
    warm = WARM_MODE and not request.node.get_closest_marker("cold_only")
    if warm and not marker:
        name = request.getfixturevalue("spare_warm_namespaces").take(request.node.nodeid)
    else:
        name = _namespace_name(request.node.name)
        labels = marker.args[0] if marker else NAMESPACE_LABELS
        cluster.core.create_namespace({"metadata": {"name": name, "labels": labels}})
        if warm:
            apply_warm_pool(cluster, name)
    yield name
    count_start_modes(cluster, name)
    cluster.core.delete_namespace(name, propagation_policy="Background")


def count_start_modes(cluster, namespace: str) -> None:
    """Warm mode's tally: how many of a namespace's runs took a warm pod (the session summary prints it)."""
    if WARM_MODE:
        for run in cluster.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
            START_MODES[(run.get("status") or {}).get("startMode") or "none"] += 1


def pytest_collection_modifyitems(config, items) -> None:
    """Warm mode proves the warm transport, so it runs the tests that start runs (those that take the operator);
    a test of the cluster alone proved what it proves in the chart pass and is not run twice."""
    if not WARM_MODE:
        return
    cluster_only = [item for item in items if "operator" not in getattr(item, "fixturenames", ())]
    if cluster_only:
        config.hook.pytest_deselected(items=cluster_only)
        items[:] = [item for item in items if item not in cluster_only]


def pytest_terminal_summary(terminalreporter) -> None:
    if WARM_MODE:
        terminalreporter.write_line(f"warm mode: runs by startMode {dict(START_MODES)}")


class _WatchCensus:
    """A watch from before the first run, in a thread of its own, each event handed to `_count`."""

    def __init__(self, list_call, *args):
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._record, args=(list_call, args), daemon=True)
        self._thread.start()

    def _record(self, list_call, args):
        try:
            for event in self._watch.stream(list_call, *args, timeout_seconds=300):
                self._count(event)
        except Exception:  # stop() closes the stream under the reader; nothing is lost by then
            pass

    def _count(self, event) -> None:
        raise NotImplementedError

    def stop(self):
        self._watch.stop()


class PodCensus(_WatchCensus):
    """Every sandbox pod ever created in a namespace, by run."""

    BARRIER = "e2e.coderun.io/census-barrier"

    def __init__(self, cluster, namespace):
        self.pods_by_run: defaultdict[str, set[str]] = defaultdict(set)
        self._marks: set[str] = set()
        self._cluster, self._namespace = cluster, namespace
        super().__init__(cluster.core.list_namespaced_pod, namespace)

    def _count(self, event) -> None:
        pod = event["object"]
        run = (pod.metadata.labels or {}).get("coderun.io/run")
        if run:
            self.pods_by_run[run].add(pod.metadata.uid)
        mark = (pod.metadata.annotations or {}).get(self.BARRIER)
        if mark:
            self._marks.add(mark)

    def catch_up(self, timeout: float = 30) -> None:
        """Return once the census has counted every pod event up to now: it annotates a pod of the namespace and
        waits for that change, which a watch delivers after every earlier one (resourceVersion order)."""
        mark = uuid.uuid4().hex
        patched = []

        def seen() -> bool:
            if not patched:
                for pod in self._cluster.core.list_namespaced_pod(self._namespace).items:
                    try:
                        self._cluster.core.patch_namespaced_pod(pod.metadata.name, self._namespace, {
                            "metadata": {"annotations": {self.BARRIER: mark}}})
                    except ApiException:
                        continue  # gone meanwhile: another
                    patched.append(pod.metadata.name)
                    break
            return mark in self._marks
        wait_for(seen, timeout, "the pod census to catch up with a change made after the runs")


class RunWriteCensus(_WatchCensus):
    """How many times each CodeRun of a namespace was written after its creation (its watch's MODIFIED events)."""

    def __init__(self, cluster, namespace):
        self.writes: defaultdict[str, int] = defaultdict(int)
        super().__init__(cluster.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL)

    def _count(self, event) -> None:
        if event["type"] == "MODIFIED":
            self.writes[event["object"]["metadata"]["name"]] += 1


# ---- people: kubectl impersonation (`--as=alice`) with the RBAC a namespace owner gives them
CODERUNS = [{"apiGroups": [GROUP], "resources": [PLURAL]}]
CREATOR_VERBS = ["create", "get", "list", "watch", "patch"]
APPROVER_VERBS = ["get", "list", "watch", "patch", "approve"]  # the chart's coderun-approver ClusterRole


def grant(cluster, namespace: str, user: str, verbs: list[str], rules=CODERUNS, names: list[str] | None = None) -> None:
    """A Role with `verbs` on `rules` and a RoleBinding to `user`, as a namespace owner writes them."""
    role = f"{user}-{'-'.join(verbs)[:40]}-{uuid.uuid4().hex[:4]}"
    rule = {**rules[0], "verbs": verbs, **({"resourceNames": names} if names else {})}
    manifest = [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": role}, "rules": [rule]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                         "items": manifest}))
    resource = f"{rules[0]['resources'][0]}.{rules[0]['apiGroups'][0]}" + (f"/{names[0]}" if names else "")
    wait_for(lambda: cluster.kubectl("auth", "can-i", verbs[-1], resource, "-n", namespace, "--as", user,
                                     check=False).stdout.strip() == "yes", 20, f"{user} to be allowed {verbs[-1]}")


def create_as(cluster, user: str, namespace: str, spec: dict, annotations: dict | None = None, check: bool = True):
    """`kubectl --as=USER create -f -`, stating USER as its creator (as the SDK would; `annotations` win): the
    run's name, or (with check=False) kubectl's result."""
    name = f"run-{uuid.uuid4().hex[:8]}"
    manifest = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRun",
                "metadata": {"name": name, "annotations": {**cluster.identity(user), **(annotations or {})}},
                "spec": spec}
    result = cluster.kubectl("--as", user, "create", "-n", namespace, "-f", "-", input=json.dumps(manifest),
                             check=check)
    return name if check else result
