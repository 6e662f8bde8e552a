"""CodeRunClient: create a CodeRun, wait for it with a watch, read the typed result. The SDK's only I/O module."""
from __future__ import annotations

import base64
import json
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from ..api.models import GROUP, PLURAL, VERSION, CodeRunSpec, Limits
from .connection import connect
from .errors import CodeRunError, PolicyDenied, RunRejected, RunTimeout
from .request import CLIENT_LABEL, DEFAULT_NAME_PREFIX, RunRequest, build_body
from .result import RunResult, result_from_object
from .runtimes import RuntimeInfo, effective_policy, offered_runtimes
from ..api.coderunpolicy import NAMESPACE_DEFAULT_POLICY, POLICY_PLURAL
from .waiting import WaitStats, WatchDropped, is_transient, refuse, wait_until_finished

# The caller's default wait: the run's own time limit plus room for scheduling and sandbox start-up.
STARTUP_ALLOWANCE_SECONDS = 120
UNKNOWN_RUN_TIMEOUT_SECONDS = 60
DEFAULT_WAIT_SECONDS = 300
# One watch request lasts at most this long server-side; then the client lists and watches again.
DEFAULT_WATCH_SECONDS = 60
API_REQUEST_TIMEOUT = 30

_NETWORK_ERRORS = (urllib3.exceptions.HTTPError, OSError)


def default_wait_seconds(run_timeout: int | None) -> float:
    return (run_timeout or UNKNOWN_RUN_TIMEOUT_SECONDS) + STARTUP_ALLOWANCE_SECONDS


def raise_if_rejected(result: RunResult) -> RunResult:
    if result.rejected:
        raise (PolicyDenied if result.reason == "PolicyDenied" else RunRejected)(result)
    return result


class CodeRunClient:
    """Runs code through coderun from a kubeconfig or in-cluster.

    >>> client = CodeRunClient()
    >>> client.run("print(6*7)").stdout
    '42\\n'

    `run` raises PolicyDenied / RunRejected when the operator refused the run and RunTimeout when the caller's
    wait ran out; a program that failed (non-zero exit, its own Timeout, OOMKilled) is a normal RunResult.
    """

    def __init__(self, namespace: str | None = None, *, kubeconfig: str | None = None, context: str | None = None,
                 api_client: client.ApiClient | None = None, client_name: str = "sdk",
                 watch_seconds: float = DEFAULT_WATCH_SECONDS):
        if api_client is None:
            api_client, default_namespace = connect(kubeconfig, context)
        else:
            default_namespace = "default"
        self.namespace = namespace or default_namespace
        self.client_name = client_name
        self.watch_seconds = watch_seconds
        self._api_client = api_client
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    # ---- the one call an agent needs
    def run(self, code: str, language: str = "python", *, files: Mapping[str, str | bytes] | list | None = None,
            stdin: str | None = None, limits: Limits | Mapping[str, Any] | None = None,
            timeout: int | None = None, wait: bool = True, wait_timeout: float | None = None,
            namespace: str | None = None, labels: Mapping[str, str] | None = None,
            on_update: Callable[[RunResult], None] | None = None) -> RunResult:
        """Run `code` and return its result. `timeout` is the program's own limit in seconds (reason Timeout
        when exceeded); `wait_timeout` bounds the caller's wait (RunTimeout when exceeded; default: the
        program's limit plus 120 s). `files` maps sandbox paths to text or bytes. wait=False returns at once."""
        request = RunRequest(code=code, language=language, files=files, stdin=stdin, timeout=timeout)
        return self.submit(request, limits=limits, wait=wait, wait_timeout=wait_timeout, namespace=namespace,
                           labels=labels, on_update=on_update)

    def submit(self, request: RunRequest, *, limits: Limits | Mapping[str, Any] | None = None, wait: bool = True,
               wait_timeout: float | None = None, namespace: str | None = None,
               labels: Mapping[str, str] | None = None,
               on_update: Callable[[RunResult], None] | None = None) -> RunResult:
        """`run` for a ready RunRequest (what the MCP tool and the agent hold)."""
        spec = request.to_spec(limits)
        created = self.create(spec, namespace=namespace, labels=labels)
        if not wait:
            return created
        run_timeout = spec.limits.timeout_seconds if spec.limits else None
        result = self.wait(created.name, namespace=created.namespace,
                           timeout=wait_timeout if wait_timeout is not None else default_wait_seconds(run_timeout),
                           on_update=on_update)
        return raise_if_rejected(result)

    # ---- the building blocks
    def create(self, spec: CodeRunSpec | RunRequest, *, namespace: str | None = None,
               labels: Mapping[str, str] | None = None, name: str | None = None,
               name_prefix: str = DEFAULT_NAME_PREFIX) -> RunResult:
        """Create the CodeRun (a unique generated name unless `name` is given); returns it without a status."""
        if isinstance(spec, RunRequest):
            spec = spec.to_spec()
        namespace = namespace or self.namespace
        body = build_body(spec, client_name=self.client_name, labels=labels, name=name, name_prefix=name_prefix)
        created = self._call("create CodeRun", self._custom.create_namespaced_custom_object,
                             GROUP, VERSION, namespace, PLURAL, body)
        return result_from_object(created)

    def get(self, name: str, *, namespace: str | None = None) -> RunResult:
        obj = self._call(f"get CodeRun {name}", self._custom.get_namespaced_custom_object,
                         GROUP, VERSION, namespace or self.namespace, PLURAL, name)
        return result_from_object(obj)

    def wait(self, name: str, *, namespace: str | None = None, timeout: float = DEFAULT_WAIT_SECONDS,
             on_update: Callable[[RunResult], None] | None = None, stats: WaitStats | None = None) -> RunResult:
        """Block until the run is finished (any terminal phase, Rejected included) and return it; RunTimeout
        when `timeout` seconds pass first. Uses a watch that is resumed after it drops."""
        namespace = namespace or self.namespace
        started = time.monotonic()
        notify = (lambda obj: on_update(result_from_object(obj))) if on_update else None
        last, finished = wait_until_finished(
            self._fetcher(namespace, name), self._watcher(namespace, name), started + timeout,
            max_watch_seconds=self.watch_seconds, on_update=notify, stats=stats)
        if not finished:
            raise RunTimeout(name, namespace, time.monotonic() - started,
                             result_from_object(last) if last else None)
        return result_from_object(last)

    def list(self, *, namespace: str | None = None, labels: Mapping[str, str] | None = None,
             mine: bool = False, all_namespaces: bool = False) -> list[RunResult]:
        """Runs, oldest first; `labels` filters by label equality, `mine` by this client's coderun.io/client."""
        wanted = {**({CLIENT_LABEL: self.client_name} if mine else {}), **(labels or {})}
        selector = ",".join(f"{k}={v}" for k, v in wanted.items()) or None
        if all_namespaces:
            listed = self._call("list CodeRuns", self._custom.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                                label_selector=selector)
        else:
            listed = self._call("list CodeRuns", self._custom.list_namespaced_custom_object, GROUP, VERSION,
                                namespace or self.namespace, PLURAL, label_selector=selector)
        results = [result_from_object(item) for item in listed.get("items", [])]
        return sorted(results, key=lambda r: (r.created_at or "", r.name))

    def delete(self, name: str, *, namespace: str | None = None, missing_ok: bool = True) -> bool:
        """Delete the run (its pod, ConfigMaps and artifacts go with it). False when it was already gone."""
        try:
            self._call(f"delete CodeRun {name}", self._custom.delete_namespaced_custom_object,
                       GROUP, VERSION, namespace or self.namespace, PLURAL, name,
                       propagation_policy="Background")
            return True
        except CodeRunError as e:
            if e.status == 404 and missing_ok:
                return False
            raise

    def artifact(self, result: RunResult, name: str) -> bytes:
        """The bytes of one artifact the program wrote to $CODERUN_OUTPUT_DIR."""
        artifact = next((a for a in result.artifacts or () if a.name == name), None)
        if artifact is None:
            offered = ", ".join(a.name for a in result.artifacts or ()) or "none"
            raise KeyError(f"run {result.name} has no artifact {name!r} (artifacts: {offered})")
        configmap = self._call(f"read ConfigMap {artifact.config_map}", self._core.read_namespaced_config_map,
                               artifact.config_map, result.namespace)
        encoded = (configmap.binary_data or {}).get(artifact.key)
        if encoded is None:
            raise CodeRunError(f"ConfigMap {artifact.config_map} has no key {artifact.key} for artifact {name}")
        return base64.b64decode(encoded)

    def artifacts(self, result: RunResult) -> dict[str, bytes]:
        return {a.name: self.artifact(result, a.name) for a in result.artifacts or ()}

    def runtimes(self, namespace: str | None = None, policy: str | None = None) -> list[RuntimeInfo]:
        """What a run in the namespace gets: the CodeRunPolicy named `policy`, else the namespace's `default`,
        else the built-in baseline (the same selection the operator makes)."""
        namespace = namespace or self.namespace
        name = policy or NAMESPACE_DEFAULT_POLICY
        try:
            found = self._call(f"get CodeRunPolicy {name}", self._custom.get_namespaced_custom_object,
                               GROUP, VERSION, namespace, POLICY_PLURAL, name)
        except CodeRunError as e:
            if e.status != 404 or policy not in (None, NAMESPACE_DEFAULT_POLICY):
                raise
            found = None
        return offered_runtimes(effective_policy(found))

    # ---- API plumbing
    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, _request_timeout=API_REQUEST_TIMEOUT, **kwargs)
        except ApiException as e:
            raise refuse(what, e.status, _api_message(e)) from e
        except _NETWORK_ERRORS as e:
            raise CodeRunError(f"{what} failed: the API server did not answer ({e})") from e

    def _fetcher(self, namespace: str, name: str):
        def fetch() -> tuple[dict[str, Any] | None, str]:
            with _transient_failures_dropped(f"list CodeRun {name}"):
                listed = self._custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, field_selector=f"metadata.name={name}",
                    _request_timeout=API_REQUEST_TIMEOUT)
            items = listed.get("items") or []
            return (items[0] if items else None), listed["metadata"]["resourceVersion"]
        return fetch

    def _watcher(self, namespace: str, name: str):
        def watch_from(resource_version: str, seconds: float) -> Iterator[tuple[str, Mapping[str, Any]]]:
            watcher = watch.Watch()
            try:
                with _transient_failures_dropped(f"watch CodeRun {name}"):
                    for event in watcher.stream(
                            self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                            field_selector=f"metadata.name={name}", resource_version=resource_version,
                            allow_watch_bookmarks=True, timeout_seconds=max(1, int(seconds)),
                            # A connection that goes silent is noticed instead of hanging past the deadline.
                            _request_timeout=(API_REQUEST_TIMEOUT, seconds + 10)):
                        yield event["type"], event["object"]
            finally:
                watcher.stop()
        return watch_from


@contextmanager
def _transient_failures_dropped(what: str) -> Iterator[None]:
    """While waiting: a transient failure means list and watch again (WatchDropped); a refusal is final."""
    try:
        yield
    except ApiException as e:
        if is_transient(e.status):
            raise WatchDropped(f"{what} answered {e.status} {e.reason}") from e
        raise refuse(what, e.status, _api_message(e)) from e
    except _NETWORK_ERRORS as e:
        raise WatchDropped(f"{what}: connection lost ({e})") from e


def _api_message(e: ApiException) -> str:
    """The API server's own message (it names the refused field), else the HTTP reason."""
    try:
        return json.loads(e.body).get("message") or e.reason
    except (TypeError, ValueError, AttributeError):
        return e.reason or ""
