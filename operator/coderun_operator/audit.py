"""The node audit agent as the operator uses it (docs/audit.md): when a run that had a sandbox ends, the agent on
the pod's node is asked, with one deadline, for what the run's container touched. Every failure is an answer
too (`Unavailable`, saying why and what to check): a run's end never waits longer than the deadline, never
fails for the audit.

The chart configures it through the environment; without CODERUN_AUDIT_AGENT no agent is installed and every
run's status.audit says so.

    CODERUN_AUDIT_AGENT             <namespace>/<app.kubernetes.io/component of the agent's pods>
    CODERUN_AUDIT_KEY_SECRET        the Secret in that namespace whose entry `key` derives the agent's bearer
                                    (default coderun-audit-key)
    CODERUN_AUDIT_KEY_CREATE        true: the operator creates that Secret with a random key if it is absent
    CODERUN_AUDIT_DEADLINE_SECONDS  the whole ask, finding the agent included (default 3)
    CODERUN_AUDIT_WAIT_MILLIS       how long the agent may wait for the record to be complete (default 1000)
"""
from __future__ import annotations

import json
import logging
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Callable, Mapping

from coderun.api.reasons import StartMode
from coderun.audit.bearer import MIN_KEY_BYTES, agent_bearer
from . import bounded_http
from .bounded_http import Transport
from .builders.names import CONTAINER_NAME
from .key_secret import ensure_key, read_key
from .results.status import parse_time

if TYPE_CHECKING:
    from .kube_api import KubeApi

log = logging.getLogger("coderun")

AGENT_VARIABLE = "CODERUN_AUDIT_AGENT"
NOT_INSTALLED = f"the audit agent is not installed ({AGENT_VARIABLE})"
COMPONENT_LABEL = "app.kubernetes.io/component"
KEY_ENTRY = "key"
DEFAULT_PORT = 9090
CACHE_SECONDS = 30      # the agents' pods per node, and the key
RELIST_SECONDS = 2      # a node missing from the cached listing is looked for again, at most this often
LATE_SECONDS = 0.5      # beyond the deadline, for the ask's thread to hand back what it got
MAX_ANSWER_BYTES = 2 * 1024 * 1024  # the summary and a record of at most 768 KiB, JSON-escaped
MAX_ASKS_AT_ONCE = 8
_CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class AuditSettings:
    namespace: str
    component: str
    key_secret: str = "coderun-audit-key"
    create_key: bool = False
    deadline_seconds: float = 3.0
    wait_millis: int = 1000

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "AuditSettings | None":
        namespace, _, component = (env.get(AGENT_VARIABLE) or "").partition("/")
        if not namespace or not component:
            return None
        return cls(namespace, component, env.get("CODERUN_AUDIT_KEY_SECRET") or "coderun-audit-key",
                   env.get("CODERUN_AUDIT_KEY_CREATE") == "true",
                   _number(env.get("CODERUN_AUDIT_DEADLINE_SECONDS"), 3.0, 0.1, 60.0),
                   int(_number(env.get("CODERUN_AUDIT_WAIT_MILLIS"), 1000, 0, 60000)))


@dataclass(frozen=True)
class AgentAnswer:
    """What the agent said of one container: its summary, its record (JSON lines), what the record cut, and
    whether the kernel's OOM killer ended the sandbox (its pod's memory cgroup, read when the sandbox ended)."""
    summary: Any
    record: str = ""
    record_cut: int = 0
    oom_killed: bool = False


def _with_error(summary: dict[str, Any], error: str) -> dict[str, Any]:
    """The summary with why the agent ended the sandbox's trace connection in its message (the audit says why it
    is incomplete, not only that it is)."""
    ended = f"the node's audit agent ended this sandbox's trace connection ({error[:300]}): what came after is missing"
    said = summary.get("message")
    return {**summary, "message": f"{said}; {ended}" if isinstance(said, str) and said else ended}


def from_environment(api: KubeApi, env: Mapping[str, str]) -> "AuditAgent | None":
    """The agent the chart installed, or None."""
    settings = AuditSettings.from_env(env)
    return AuditAgent(api, settings) if settings else None


def container_id(pod: Mapping[str, Any]) -> str | None:
    """The run container's id as the runtime reports it (`containerd://<64 hex>`), without its scheme."""
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        if status.get("name") == CONTAINER_NAME:
            found = str(status.get("containerID") or "").rpartition("://")[2]
            return found if _CONTAINER_ID.match(found) else None
    return None


def since_ns(run_status: Mapping[str, Any]) -> int:
    """Where the run's activity starts in its container's record: 0 for a cold pod (everything is the run's),
    the claim (status.startTime) for a warm pod, which ran before the run took it, and the start of a session's run
    (earlier runs of the session ran in the same container)."""
    if run_status.get("startMode") not in (StartMode.WARM, StartMode.SESSION):
        return 0
    claimed = parse_time(run_status.get("startTime"))
    return (claimed - _EPOCH) // timedelta(microseconds=1) * 1000 if claimed else 0


class AuditAgent:
    def __init__(self, api: KubeApi, settings: AuditSettings, transport: Transport | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.api, self.settings, self._clock = api, settings, clock
        self._transport = transport or (lambda method, url, bearer, body, deadline: bounded_http.call(
            method, url, bearer, body, deadline, MAX_ANSWER_BYTES))
        self._lock = threading.Lock()
        self._agents: tuple[float, dict[str, str]] | None = None  # (listed at, node -> "ip:port")
        self._key: tuple[float, bytes] | None = None
        self._pool = ThreadPoolExecutor(MAX_ASKS_AT_ONCE, thread_name_prefix="coderun-audit")

    def ensure_key(self) -> None:
        """The key's Secret, created with a random key when it is absent and the chart asked for that (the agent's
        pods start once it exists)."""
        s = self.settings
        if s.create_key:
            ensure_key(self.api, s.namespace, s.key_secret, KEY_ENTRY, "audit agent key")

    def ask(self, pod: Mapping[str, Any], since: int, wait: bool = True) -> AgentAnswer | str:
        """The agent's answer for the run's container, or why there is none (a sentence naming what to check),
        within the deadline whatever the agent and the API server do. `wait`: for the record to be complete (the
        program's processes seen ending); without, what the agent has now."""
        deadline = self._clock() + self.settings.deadline_seconds
        future = self._pool.submit(self._ask, pod, since, deadline, wait)
        try:
            return future.result(timeout=self.settings.deadline_seconds + LATE_SECONDS)
        except FutureTimeout:
            future.cancel()
            why = f"the audit agent was not asked within {self.settings.deadline_seconds:g} s"
        except Exception as e:  # noqa: BLE001 - a bug here must not end the run badly: its audit says so
            why = f"asking the audit agent failed: {type(e).__name__}: {str(e)[:200]}"
        log.warning("pod %s: %s", pod["metadata"]["name"], why)
        return why

    def _ask(self, pod: Mapping[str, Any], since: int, deadline: float, wait_complete: bool = True) -> AgentAnswer | str:
        name, node = pod["metadata"]["name"], (pod.get("spec") or {}).get("nodeName")
        container = container_id(pod)
        if not node or not container:
            return self._unavailable(name, "the sandbox pod's status names no node or no run container id")
        try:
            address = self._agent_on(node)
            key = self._read_key()
        except self.api.Transient as e:
            return self._unavailable(name, f"the API server could not be asked for the audit agent: {e}")
        s = self.settings
        if address is None:
            return self._unavailable(name, f"no ready audit agent on node {node} (pods of {s.namespace} labelled "
                                           f"{COMPONENT_LABEL}={s.component}): check the agent's DaemonSet there")
        if len(key) < MIN_KEY_BYTES:
            return self._unavailable(name, f"the audit key Secret {s.namespace}/{s.key_secret} has no entry "
                                           f"{KEY_ENTRY!r} of {MIN_KEY_BYTES} bytes or more")
        wait = max(0, min(s.wait_millis, int((deadline - self._clock()) * 1000) - 200)) if wait_complete else 0
        url = f"http://{address}/v1/containers/{container}?since={since}&wait={wait}"
        try:
            status, body, _ = self._transport("GET", url, agent_bearer(key), None, deadline)
        except OSError as e:
            self._forget(node)
            return self._unavailable(name, f"the audit agent on node {node} ({address}) did not answer: "
                                           f"{type(e).__name__}: {str(e)[:200]}")
        return self._answer(name, node, container, status, body)

    def _answer(self, name: str, node: str, container: str, status: int, body: bytes) -> AgentAnswer | str:
        try:
            document = json.loads(body)
        except ValueError:
            document = None
        if status == 404:
            return self._unavailable(name, f"the audit agent on node {node} has no trace of container "
                                           f"{container[:12]}: check that the node's runsc traces sandboxes and "
                                           "that the agent ran when the pod was created")
        if status == 401:
            return self._unavailable(name, f"the audit agent on node {node} refused the operator's key: check "
                                           f"that both read Secret {self.settings.namespace}/{self.settings.key_secret}")
        if status != 200 or not isinstance(document, dict) or not isinstance(document.get("audit"), dict):
            said = document.get("message") if isinstance(document, dict) else None
            return self._unavailable(name, f"the audit agent on node {node} answered HTTP {status}"
                                           f"{': ' + str(said)[:200] if said else ' without a summary'}")
        record, cut, connection = document.get("record"), document.get("recordCut"), document.get("connection")
        error = connection.get("error") if isinstance(connection, dict) else None
        summary = _with_error(document["audit"], error) if isinstance(error, str) and error else document["audit"]
        return AgentAnswer(summary, record if isinstance(record, str) else "",
                           cut if isinstance(cut, int) and not isinstance(cut, bool) and cut > 0 else 0,
                           isinstance(connection, dict) and connection.get("oomKilled") is True)

    @staticmethod
    def _unavailable(pod: str, why: str) -> str:
        log.warning("pod %s: %s; its run's audit is unavailable", pod, why)
        return why

    def _agent_on(self, node: str) -> str | None:
        """The ready agent's address on the node, from a listing kept CACHE_SECONDS; a node missing from it is
        looked for once more (an agent that started since), at most every RELIST_SECONDS."""
        with self._lock:
            cached = self._agents
        now = self._clock()
        if cached is not None and (node in cached[1] or now - cached[0] <= RELIST_SECONDS) \
                and now - cached[0] <= CACHE_SECONDS:
            return cached[1].get(node)
        pods = self.api.list_pods(self.settings.namespace, {COMPONENT_LABEL: self.settings.component})
        agents = {p["spec"]["nodeName"]: address for p in pods
                  if (address := _serving_address(p)) and (p.get("spec") or {}).get("nodeName")}
        with self._lock:
            self._agents = (now, agents)
        return agents.get(node)

    def _forget(self, node: str) -> None:
        """An agent that did not answer: its node is looked up again next time (it may have been replaced)."""
        with self._lock:
            if self._agents is not None and node in self._agents[1]:
                self._agents = (self._agents[0], {n: a for n, a in self._agents[1].items() if n != node})

    def _read_key(self) -> bytes:
        with self._lock:
            cached = self._key
        if cached is not None and self._clock() - cached[0] <= CACHE_SECONDS:
            return cached[1]
        s = self.settings
        key = read_key(self.api, s.namespace, s.key_secret, KEY_ENTRY)
        if not key and s.create_key:  # not made at start (the API server was away): now, then
            self.ensure_key()
            key = read_key(self.api, s.namespace, s.key_secret, KEY_ENTRY)
        if len(key) >= MIN_KEY_BYTES:
            with self._lock:
                self._key = (self._clock(), key)
        return key


def _serving_address(pod: Mapping[str, Any]) -> str | None:
    """ip:port of an agent pod that is ready (its port named `audit`), else None."""
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    if not ready or not status.get("podIP") or (pod["metadata"].get("deletionTimestamp")):
        return None
    ports = [p.get("containerPort") for c in (pod.get("spec") or {}).get("containers") or ()
             for p in c.get("ports") or () if p.get("name") == "audit"]
    port = ports[0] if ports and isinstance(ports[0], int) else DEFAULT_PORT
    ip = status["podIP"]
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _number(value: str | None, default: float, low: float, high: float) -> float:
    try:
        number = float(value) if value else default
    except ValueError:
        return default
    return min(max(number, low), high)
