"""The only module that talks to the API server. Everything returns plain dicts; API failures become two
kinds of exception, handled in one place by the controller:

- `Transient`: the API server is away or busy (5xx, 429, a timeout): try again later, the run is unchanged;
- `Refused`: the API server will not take this object as it is (400, 403, 413, 422): trying the same again
  cannot help, so the caller changes what it sends (a smaller status) or ends the run saying why.

404 on reads and deletes means "gone" and returns None; 409 on create returns the object that is there, so
the caller can check who owns it instead of assuming it is its own.
"""
from __future__ import annotations

import functools
import json
import time
from datetime import datetime, timezone
from typing import Any, Callable

from kubernetes import client, config
from kubernetes.client import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import WSClient

from coderun.api.coderunpolicy import POLICY_PLURAL
from coderun.api.coderunsession import SESSION_PLURAL
from coderun.api.models import GROUP, PLURAL, VERSION
from .metrics import API_REQUESTS

# The API server's own requests time out here rather than hanging a worker thread.
REQUEST_TIMEOUT_SECONDS = 30
# The Lease's reads and writes: well below the leader's renew deadline, so a leader cut off from the API server
# learns it within that deadline, before a standby may take over, instead of after one 30 s request.
LEASE_REQUEST_TIMEOUT_SECONDS = 3
NODE_CACHE_SECONDS = 30


class Transient(Exception):
    """The API server could not answer now; the same call may succeed later."""


class Refused(Exception):
    """The API server refuses the object as it is (quota, admission, validation, size)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


@functools.cache
def _api() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def _core() -> client.CoreV1Api:
    return client.CoreV1Api(_api())


def _networking() -> client.NetworkingV1Api:
    return client.NetworkingV1Api(_api())


def _custom() -> client.CustomObjectsApi:
    return client.CustomObjectsApi(_api())


def _coordination() -> client.CoordinationV1Api:
    return client.CoordinationV1Api(_api())


def _admissionregistration() -> client.AdmissionregistrationV1Api:
    return client.AdmissionregistrationV1Api(_api())


def _authorization() -> client.AuthorizationV1Api:
    return client.AuthorizationV1Api(_api())


def _plain(obj: Any) -> dict[str, Any]:
    plain: dict[str, Any] = _api().sanitize_for_serialization(obj)
    return plain


def api_message(e: ApiException) -> str:
    """The API server's own sentence for a failure (it names the field or the quota)."""
    try:
        return str(json.loads(e.body or "")["message"])[:1024]
    except (ValueError, KeyError, TypeError):
        return f"{e.status} {e.reason}"


def _failure(what: str, e: ApiException) -> Exception:
    if e.status in (400, 403, 413, 422):
        return Refused(f"the API server refused {what}: {api_message(e)}", e.status)
    return Transient(f"{what}: API server answered {e.status} {e.reason}")


def _call(what: str, call: Callable[..., Any], *args: Any, missing_ok: bool = False,
          timeout: float = REQUEST_TIMEOUT_SECONDS, **kwargs: Any) -> Any:
    """One API call with the failure kinds above; `missing_ok` turns 404 into None."""
    API_REQUESTS.labels(call.__name__).inc()
    try:
        return call(*args, _request_timeout=timeout, **kwargs)
    except ApiException as e:
        if e.status == 404 and missing_ok:
            return None
        raise _failure(what, e) from e
    except (OSError, ValueError) as e:  # connection refused/reset, timeouts (urllib3 errors are OSErrors)
        raise Transient(f"{what}: {type(e).__name__}: {str(e)[:200]}") from e


def _custom_object(what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
    """A call about one custom object (the client answers with it as a dict); None when it is gone."""
    found: dict[str, Any] | None = _call(what, call, *args, missing_ok=True, **kwargs)
    return found


# ------------------------------------------------------------------------------------------ children
# kind -> the client's call (looked up per call: each builds an API object on the shared client)
_READ: dict[str, Callable[[], Callable[..., Any]]] = {
    "Pod": lambda: _core().read_namespaced_pod, "ConfigMap": lambda: _core().read_namespaced_config_map,
    "NetworkPolicy": lambda: _networking().read_namespaced_network_policy}
_CREATE: dict[str, Callable[[], Callable[..., Any]]] = {
    "Pod": lambda: _core().create_namespaced_pod, "ConfigMap": lambda: _core().create_namespaced_config_map,
    "NetworkPolicy": lambda: _networking().create_namespaced_network_policy}


def create_or_get(obj: dict[str, Any]) -> dict[str, Any] | None:
    """Create a child. None when created; the object already there (whoever made it) on AlreadyExists."""
    ns, kind, name = obj["metadata"]["namespace"], obj["kind"], obj["metadata"]["name"]
    API_REQUESTS.labels(f"create_{kind.lower()}").inc()
    try:
        _CREATE[kind]()(ns, obj, _request_timeout=REQUEST_TIMEOUT_SECONDS)
        return None
    except ApiException as e:
        if e.status != 409:
            raise _failure(f"{kind} {name}", e) from e
    except (OSError, ValueError) as e:
        raise Transient(f"{kind} {name}: {type(e).__name__}: {str(e)[:200]}") from e
    existing = _call(f"{kind} {name}", _READ[kind](), name, ns, missing_ok=True)
    if existing is None:  # deleted between the two calls: try once more
        return create_or_get(obj)
    return _plain(existing)


def replace_network_policy(obj: dict[str, Any], resource_version: str) -> None:
    meta = obj["metadata"]
    body = {**obj, "metadata": {**meta, "resourceVersion": resource_version}}
    _call(f"NetworkPolicy {meta['name']}", _networking().replace_namespaced_network_policy, meta["name"],
          meta["namespace"], body)


def get_pod(namespace: str, name: str) -> dict[str, Any] | None:
    pod = _call(f"pod {name}", _core().read_namespaced_pod, name, namespace, missing_ok=True)
    return _plain(pod) if pod is not None else None


def delete_pod(namespace: str, name: str, resource_version: str | None = None) -> None:
    """Delete a pod at once; with `resource_version`, only if it is still as we saw it (else nothing happens)."""
    body = {"preconditions": {"resourceVersion": resource_version}} if resource_version else None
    try:
        _call(f"pod {name}", _core().delete_namespaced_pod, name, namespace, grace_period_seconds=0, body=body,
              missing_ok=True)
    except Transient as e:
        if not (resource_version and isinstance(e.__cause__, ApiException) and e.__cause__.status == 409):
            raise


def create_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """Create a pod named by generateName (a warm pool pod): the pod as created."""
    return _plain(_call("a warm pool pod", _core().create_namespaced_pod, pod["metadata"]["namespace"], pod))


def claim_pod(namespace: str, name: str, patch: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Apply a JSON patch whose first operation tests the resourceVersion: the pod as patched, or None when
    somebody changed it first (the test failed), or it is gone. Never a half-claimed pod: one patch is atomic."""
    API_REQUESTS.labels("claim_pod").inc()
    try:
        return _plain(_core().patch_namespaced_pod(name, namespace, patch, _request_timeout=REQUEST_TIMEOUT_SECONDS))
    except ApiException as e:
        if e.status in (404, 409, 422):
            return None
        raise _failure(f"pod {name}", e) from e
    except (OSError, ValueError) as e:
        raise Transient(f"pod {name}: {type(e).__name__}: {str(e)[:200]}") from e


def resize_pod_cpu(namespace: str, name: str, container: str, cpu: str) -> None:
    """Raise a running pod's CPU request in place (pods/resize): the kubelet then gives it that share of the
    node, or marks the resize pending when the node has no room (the pod runs on as it was)."""
    body = {"spec": {"containers": [{"name": container, "resources": {"requests": {"cpu": cpu}}}]}}
    _call(f"pod {name}", _core().patch_namespaced_pod_resize, name, namespace, body)


class Attached:
    """A container's stdin and stdout through the API server (pods/attach over a WebSocket)."""

    def __init__(self, socket: WSClient):
        self._socket = socket

    def send(self, data: bytes) -> None:
        try:
            self._socket.write_stdin(data)
        except Exception as e:  # noqa: BLE001 - websocket errors are many; any of them means the stream broke
            raise Transient(f"attach: sending failed: {type(e).__name__}: {str(e)[:200]}") from e

    def read_until(self, done: Callable[[bytes], bool], limit_bytes: int, seconds: float) -> bytes:
        """Stdout until `done(stdout so far)`, the stream closes, `limit_bytes` arrived or `seconds` passed."""
        received, deadline = b"", time.monotonic() + seconds
        try:
            while self._socket.is_open() and not done(received) and len(received) <= limit_bytes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._socket.update(timeout=min(remaining, 1.0))
                received += self._socket.read_stdout(timeout=0) or b""
            # The client also keeps a copy of everything read (capture_all, which `stream` always sets), and
            # whatever came past the frame: neither is wanted, and on an attach kept for a session's every run
            # they would grow with each run.
            self._socket.read_all()
        except Exception as e:  # noqa: BLE001
            raise Transient(f"attach: reading failed: {type(e).__name__}: {str(e)[:200]}") from e
        return received

    def still_open(self) -> bool:
        """Whether the stream is open, once what already arrived (the other side's close among it) is read."""
        try:
            self._socket.update(timeout=0)
            return bool(self._socket.is_open())
        except Exception as e:  # noqa: BLE001
            raise Transient(f"attach: reading failed: {type(e).__name__}: {str(e)[:200]}") from e

    def close(self) -> None:
        try:
            self._socket.close(timeout=0)  # not waiting for the other side's close frame (up to 3 s)
        except Exception:  # noqa: BLE001, S110 - closing a broken stream is best effort
            pass


def attach(namespace: str, pod: str, container: str) -> Attached:
    """Attach to a running container's stdin and stdout (RBAC: pods/attach). Each attach has its own client:
    the stream helper swaps the client's transport while it connects, which other threads must not see."""
    API_REQUESTS.labels("attach").inc()
    core = client.CoreV1Api(client.ApiClient(_api().configuration))
    try:
        socket = stream(core.connect_get_namespaced_pod_attach, pod, namespace, container=container, stdin=True,
                        stdout=True, stderr=False, tty=False, binary=True, _preload_content=False,
                        _request_timeout=REQUEST_TIMEOUT_SECONDS)
    except ApiException as e:  # the stream helper reports every failure, 403 included, as status 0
        raise Transient(f"attach to pod {pod}: {e.reason or e.status}"[:300]) from e
    except (OSError, ValueError) as e:
        raise Transient(f"attach to pod {pod}: {type(e).__name__}: {str(e)[:200]}") from e
    return Attached(socket)


def read_log(namespace: str, pod: str, container: str, limit_bytes: int, since_seconds: int | None = None,
             timeout: float = REQUEST_TIMEOUT_SECONDS) -> tuple[str, bool]:
    """The container log from the start (or of its last `since_seconds`), at most limit_bytes; says whether the
    whole of that was read."""
    raw = _call(f"log of pod {pod}", _core().read_namespaced_pod_log, pod, namespace, container=container,
                limit_bytes=limit_bytes + 1, since_seconds=since_seconds, _preload_content=False,
                timeout=timeout).data
    return raw[:limit_bytes].decode("utf-8", "replace"), len(raw) <= limit_bytes


def read_configmap(namespace: str, name: str) -> dict[str, Any] | None:
    """A ConfigMap as the API server holds it (binaryData base64-encoded); None when it is gone."""
    cm = _call(f"ConfigMap {name}", _core().read_namespaced_config_map, name, namespace, missing_ok=True)
    return None if cm is None else _plain(cm)


# ------------------------------------------------------------------------------------------ runs
def get_run(namespace: str, name: str) -> dict[str, Any] | None:
    return _custom_object(f"CodeRun {name}", _custom().get_namespaced_custom_object, GROUP, VERSION, namespace,
                          PLURAL, name)


def list_runs(namespace: str) -> list[dict[str, Any]]:
    """Every CodeRun of a namespace, as the API server holds them now."""
    listed = _call(f"the CodeRuns of {namespace}", _custom().list_namespaced_custom_object, GROUP, VERSION,
                   namespace, PLURAL)
    return list((listed or {}).get("items") or ())


def patch_run_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
    """One merge patch of /status (null removes a field); the run as it is now, None if it is gone."""
    return _custom_object(f"the status of CodeRun {name}", _custom().patch_namespaced_custom_object_status, GROUP,
                          VERSION, namespace, PLURAL, name, {"status": status})


def label_run(namespace: str, name: str, labels: dict[str, str]) -> dict[str, Any] | None:
    return _custom_object(f"CodeRun {name}", _custom().patch_namespaced_custom_object, GROUP, VERSION, namespace,
                          PLURAL, name, {"metadata": {"labels": labels}})


def delete_run(namespace: str, name: str, uid: str) -> None:
    """Delete this run, only if it is still the same object (a new run may have taken the name)."""
    _call(f"CodeRun {name}", _custom().delete_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name,
          body={"preconditions": {"uid": uid}}, missing_ok=True)


def list_policies() -> list[dict[str, Any]]:
    """Every CodeRunPolicy of the cluster: loaded once before any run is admitted (the watch may not have
    delivered them all yet)."""
    listed = _call("the CodeRunPolicies", _custom().list_cluster_custom_object, GROUP, VERSION, POLICY_PLURAL)
    return list((listed or {}).get("items") or ())


def patch_policy_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
    """One merge patch of a CodeRunPolicy's /status; None if it is gone."""
    return _custom_object(f"the status of CodeRunPolicy {name}", _custom().patch_namespaced_custom_object_status,
                          GROUP, VERSION, namespace, POLICY_PLURAL, name, {"status": status})


# ------------------------------------------------------------------------------------------ identity
def read_admission_policy(name: str) -> dict[str, Any] | None:
    """A ValidatingAdmissionPolicy, None when it is not installed."""
    found = _call(f"ValidatingAdmissionPolicy {name}", _admissionregistration().read_validating_admission_policy,
                  name, missing_ok=True)
    return _plain(found) if found is not None else None


def read_admission_policy_binding(name: str) -> dict[str, Any] | None:
    found = _call(f"ValidatingAdmissionPolicyBinding {name}",
                  _admissionregistration().read_validating_admission_policy_binding, name, missing_ok=True)
    return _plain(found) if found is not None else None


def allowed(user: str, groups: list[str], verb: str, resource: str, namespace: str, name: str) -> bool:
    """A SubjectAccessReview: may this user (with these groups) do `verb` on coderun.io `resource`/`name`?"""
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "groups": groups, "resourceAttributes": {
                  "group": GROUP, "resource": resource, "verb": verb, "namespace": namespace, "name": name}}}
    answer = _call(f"a SubjectAccessReview for {verb} {resource}/{name}", _authorization().create_subject_access_review,
                   review)
    return bool(_plain(answer).get("status", {}).get("allowed"))


# ------------------------------------------------------------------------------------------ leader election
class Conflict(Exception):
    """Somebody else wrote the object since we read it (409): our write did not happen."""


def read_lease(namespace: str, name: str) -> dict[str, Any] | None:
    lease = _call(f"Lease {name}", _coordination().read_namespaced_lease, name, namespace, missing_ok=True,
                  timeout=LEASE_REQUEST_TIMEOUT_SECONDS)
    return _plain(lease) if lease is not None else None


def write_lease(namespace: str, name: str, spec: dict[str, Any], resource_version: str | None) -> None:
    """Create the Lease (no resourceVersion) or replace the one read at `resource_version`; Conflict when another
    writer got there first, so two replicas can never both believe they hold it."""
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": spec}
    _create_or_replace(f"Lease {name}", _coordination().create_namespaced_lease,
                       _coordination().replace_namespaced_lease, namespace, name, body, resource_version,
                       timeout=LEASE_REQUEST_TIMEOUT_SECONDS)


def _create_or_replace(what: str, create: Callable[..., Any], replace: Callable[..., Any], namespace: str, name: str,
                       body: dict[str, Any], resource_version: str | None,
                       timeout: float = REQUEST_TIMEOUT_SECONDS) -> None:
    """Create (no resourceVersion) or replace what was read at `resource_version`; Conflict when another writer
    got there first."""
    body = {**body, "metadata": {**body.get("metadata", {}), "name": name, "namespace": namespace,
                                 **({"resourceVersion": resource_version} if resource_version else {})}}
    try:
        if resource_version:
            _call(what, replace, name, namespace, body, timeout=timeout)
        else:
            _call(what, create, namespace, body, timeout=timeout)
    except Transient as e:
        if isinstance(e.__cause__, ApiException) and e.__cause__.status == 409:
            raise Conflict(str(e)) from e
        raise


# ------------------------------------------------------------------------------------------ sessions
def get_session(namespace: str, name: str) -> dict[str, Any] | None:
    """A CodeRunSession as the API server holds it; None when there is none (a run naming it is refused)."""
    return _custom_object(f"CodeRunSession {name}", _custom().get_namespaced_custom_object, GROUP,
                          VERSION, namespace, SESSION_PLURAL, name)


def patch_session_status(namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
    """One merge patch of a CodeRunSession's /status (null removes a field); None if it is gone."""
    return _custom_object(f"the status of CodeRunSession {name}", _custom().patch_namespaced_custom_object_status,
                          GROUP, VERSION, namespace, SESSION_PLURAL, name, {"status": status})


def delete_session(namespace: str, name: str, uid: str) -> None:
    """Delete this ended session, only if it is still the same object (a new session may have taken the name)."""
    _call(f"CodeRunSession {name}", _custom().delete_namespaced_custom_object, GROUP,
          VERSION, namespace, SESSION_PLURAL, name, body={"preconditions": {"uid": uid}}, missing_ok=True)


# ------------------------------------------------------------------------------------------ webhook TLS
def read_secret(namespace: str, name: str) -> dict[str, Any] | None:
    """The webhook's serving certificate and the egress proxy's signing keys: the only Secrets the operator may
    read, by name, in its own namespace."""
    secret = _call(f"Secret {name}", _core().read_namespaced_secret, name, namespace, missing_ok=True)
    return _plain(secret) if secret is not None else None


def write_secret(namespace: str, name: str, secret: dict[str, Any], resource_version: str | None) -> None:
    _create_or_replace(f"Secret {name}", _core().create_namespaced_secret, _core().replace_namespaced_secret,
                       namespace, name, secret, resource_version)


def read_webhook_configuration(name: str) -> dict[str, Any] | None:
    found = _call(f"ValidatingWebhookConfiguration {name}",
                  _admissionregistration().read_validating_webhook_configuration, name, missing_ok=True)
    return _plain(found) if found is not None else None


def set_webhook_ca_bundle(name: str, webhook_names: list[str], ca_bundle: str) -> None:
    """Each webhook's clientConfig.caBundle (a strategic merge by webhook name: nothing else changes)."""
    patch = {"webhooks": [{"name": n, "clientConfig": {"caBundle": ca_bundle}} for n in webhook_names]}
    _call(f"ValidatingWebhookConfiguration {name}",
          _admissionregistration().patch_validating_webhook_configuration, name, patch)


# ------------------------------------------------------------------------------------------ the egress proxy
def read_service(namespace: str, name: str) -> dict[str, Any] | None:
    """The egress proxy's Service (its address, ports and pod selector); None when it is not there."""
    service = _call(f"Service {name}", _core().read_namespaced_service, name, namespace, missing_ok=True)
    return _plain(service) if service is not None else None


def list_pods(namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """The pods of a namespace with these labels (the egress proxy's, in the operator's own namespace)."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    listed = _call(f"the pods of {namespace} labelled {selector}", _core().list_namespaced_pod, namespace,
                   label_selector=selector)
    return [_plain(pod) for pod in listed.items]


def label_pod(namespace: str, name: str, labels: dict[str, str | None]) -> None:
    """Set (or, with None, remove) labels on a pod: the operator's own, to mark the replica that leads."""
    _call(f"pod {name}", _core().patch_namespaced_pod, name, namespace, {"metadata": {"labels": labels}})


# ------------------------------------------------------------------------------------------ nodes, events
@functools.lru_cache(maxsize=1)
def _nodes(ttl_bucket: int) -> tuple[dict[str, Any], ...]:
    return tuple(_plain(n) for n in _call("nodes", _core().list_node).items)


def nodes() -> tuple[dict[str, Any], ...]:
    """Every node, cached for half a minute (nodes change rarely)."""
    return _nodes(int(time.monotonic() // NODE_CACHE_SECONDS))


def post_event(obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
    """A core/v1 Event about a CodeRun (kubectl describe shows it). Best effort: callers ignore failures."""
    meta = obj["metadata"]
    now = datetime.now(timezone.utc)
    event = {
        "metadata": {"generateName": f"{meta['name'][:200]}.", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": obj.get("apiVersion", f"{GROUP}/{VERSION}"), "kind": obj.get("kind", "CodeRun"),
                           "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
        "type": type_, "reason": reason, "message": message[:1024],
        "firstTimestamp": now.isoformat(), "lastTimestamp": now.isoformat(), "count": 1,
        "source": {"component": "coderun"}, "reportingComponent": "coderun.io/operator",
    }
    _call(f"event for {meta['name']}", _core().create_namespaced_event, meta["namespace"], event)
