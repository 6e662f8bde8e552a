"""The egress proxy as the operator uses it (docs/egress.md): where its pods are and the key that signs runs'
credentials (read from its Service and its Secret, kept a minute), the one ready pod each run is pinned to when
it starts (read afresh), and each ready proxy pod's admin endpoint, asked when a run ends: revoke the run's
credential first, then fetch what the pod logged of the run.

The chart configures it through the environment; without CODERUN_EGRESS_PROXY there is no proxy and the policy
loader refuses host rules (policy/egress.py).

    CODERUN_EGRESS_PROXY         <namespace>/<Service> (ports named `proxy` and `admin`)
    CODERUN_EGRESS_KEYS_SECRET   the Secret of signing keys in that namespace, one entry per key id
    CODERUN_EGRESS_KEY_ID        the entry that signs (the proxy verifies with all of them: rotation)
    CODERUN_EGRESS_KEYS_CREATE   true: the operator creates that Secret with a random key if it is absent, as it
                                 makes the webhook's certificate (nothing secret is in the chart's render)
"""
from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from coderun.api.models import EgressRule
from coderun.egress.credential import KEY_ID_PATTERN, MIN_KEY_BYTES, admin_bearer
from . import bounded_http
from .bounded_http import Transport
from .builders.egress import EgressAccess, ProxyRoute, is_ready, pinned, socket_address, uses_proxy
from .key_secret import ensure_key, read_key
from .policy.egress import PROXY_VARIABLE
from .results.network import PodAnswer

if TYPE_CHECKING:
    from .kube_api import KubeApi

log = logging.getLogger("coderun")

CACHE_SECONDS = 60
END_RUN_SECONDS = 10  # a run's end at the proxy pods, both calls at every pod: one deadline for all
LATE_SECONDS = 1  # beyond it, for a call that stopped at the deadline to hand back what it got
MAX_PODS_AT_ONCE = 16  # threads asking the proxy pods at one run's end (the chart's default is 2 pods)
MAX_LOG_BYTES = 2 * 1024 * 1024  # what one pod may hand back of one run (it keeps 1 MiB); never read past


class ProxyUnavailable(Exception):
    """The proxy's Service or signing key is missing or malformed: runs with host rules cannot start."""


def cannot_start(e: ProxyUnavailable, policy: str, what: str = "this run") -> str:
    """The message of a run (or session) refused because its policy's egress proxy is unavailable."""
    return (f"{e}; runs of policy {policy!r} reach their spec.egress names through it, so {what} cannot start: "
            "the platform team must repair the egress proxy")


@dataclass(frozen=True)
class ProxySettings:
    namespace: str
    service: str
    keys_secret: str
    key_id: str
    create_keys: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "ProxySettings | None":
        namespace, _, service = (env.get(PROXY_VARIABLE) or "").partition("/")
        if not service:
            return None
        return cls(namespace, service, env.get("CODERUN_EGRESS_KEYS_SECRET") or f"{service}-keys",
                   env.get("CODERUN_EGRESS_KEY_ID") or "k1", env.get("CODERUN_EGRESS_KEYS_CREATE") == "true")


def http(method: str, url: str, bearer: str, body: bytes | None,
         deadline: float) -> tuple[int, bytes, Mapping[str, str]]:
    """One call to a proxy pod (bounded_http.call), reading no more than MAX_LOG_BYTES: a pod that cannot be asked
    in time leaves the run's log incomplete and never fails the run."""
    return bounded_http.call(method, url, bearer, body, deadline, MAX_LOG_BYTES)


def access_for(proxy: "EgressProxy | None", egress: Sequence[EgressRule], run_uid: str | None = None) -> EgressAccess | None:
    """How runs of a policy with these egress rules reach the proxy, and with `run_uid` the pod that run is pinned
    to: None for a policy without host rules; ProxyUnavailable when it has some and no proxy is configured, the
    proxy's Service or key is broken, or (for a run) none of its pods is ready."""
    if not uses_proxy(egress):
        return None
    if proxy is None:
        raise ProxyUnavailable("no egress proxy is configured, and the policy's runs reach its host rules through one")
    return proxy.access() if run_uid is None else proxy.pinned(run_uid)


def from_environment(api: KubeApi, env: Mapping[str, str]) -> "EgressProxy | None":
    """The proxy the chart configured, or None."""
    settings = ProxySettings.from_env(env)
    return EgressProxy(api, settings) if settings else None


class EgressProxy:
    def __init__(self, api: KubeApi, settings: ProxySettings, transport: Transport = http,
                 clock: Callable[[], float] = time.monotonic):
        self.api, self.settings, self._transport, self._clock = api, settings, transport, clock
        self._lock = threading.Lock()
        self._cached: tuple[float, EgressAccess, int] | None = None  # (read at, access, admin port)
        self._refreshing = False  # a call is reading the stale cache's values again

    def ensure_keys(self) -> None:
        """The signing key's Secret, created with a random key when it is absent and the chart asked for that; the
        proxy's pods start once it exists."""
        s = self.settings
        if s.create_keys:
            ensure_key(self.api, s.namespace, s.keys_secret, s.key_id, "egress proxy signing key")

    def access(self) -> EgressAccess:
        """The Service's address and the signing key, read again after CACHE_SECONDS (a rotated key, a new
        Service). ProxyUnavailable when either is missing; the API's Transient passes through."""
        return self._read()[0]

    def pinned(self, uid: str) -> EgressAccess:
        """The access of one run, pinned to one ready proxy pod (builders.egress.pinned), which alone sees and
        counts its requests. The pods are listed afresh (a pod that stopped being ready is never chosen);
        ProxyUnavailable when none is ready."""
        access = self.access()
        chosen = pinned(access, self.api.list_pods(access.route.namespace, dict(access.route.pod_labels)), uid)
        if chosen is None:
            s = self.settings
            raise ProxyUnavailable(f"no pod of the egress proxy (the pods behind Service {s.namespace}/{s.service}) "
                                   "is ready")
        return chosen

    def _read(self) -> tuple[EgressAccess, int]:
        """The cached values, or read again outside the lock (the API reads may take their timeout, 30 s each):
        once they are stale one call reads them while the others get the last good ones; a call finding nothing
        cached reads for itself. A failed read raises to the call that made it; the next call tries again."""
        with self._lock:
            cached = self._cached
            if cached is not None and (self._refreshing or self._clock() - cached[0] <= CACHE_SECONDS):
                return cached[1], cached[2]
            refreshing = cached is not None
            if refreshing:
                self._refreshing = True
        try:
            access, admin_port = self._read_from_api()
            with self._lock:
                self._cached = (self._clock(), access, admin_port)
            return access, admin_port
        finally:
            if refreshing:
                with self._lock:
                    self._refreshing = False

    def _read_from_api(self) -> tuple[EgressAccess, int]:
        s = self.settings
        service = self.api.read_service(s.namespace, s.service)
        if service is None:
            raise ProxyUnavailable(f"the egress proxy's Service {s.namespace}/{s.service} does not exist")
        spec = service.get("spec") or {}
        ports = {p.get("name"): p for p in spec.get("ports") or ()}
        if not {"proxy", "admin"} <= set(ports) or not spec.get("selector"):
            raise ProxyUnavailable(f"the egress proxy's Service {s.namespace}/{s.service} needs a pod selector and "
                                   "ports named proxy and admin")
        route = ProxyRoute(s.namespace, tuple(sorted(spec["selector"].items())), target_port(ports["proxy"]))
        return EgressAccess(s.key_id, self._key(), route), target_port(ports["admin"])

    def _key(self) -> bytes:
        s = self.settings
        if s.create_keys and self.api.read_secret(s.namespace, s.keys_secret) is None:
            self.ensure_keys()  # not made at start (the API server was away): now, then
        key = read_key(self.api, s.namespace, s.keys_secret, s.key_id)
        if not KEY_ID_PATTERN.match(s.key_id) or len(key) < MIN_KEY_BYTES:
            raise ProxyUnavailable(f"the egress proxy's Secret {s.namespace}/{s.keys_secret} has no key {s.key_id!r} "
                                   f"of {MIN_KEY_BYTES} bytes or more")
        return key

    def end_run(self, uid: str, expires: int) -> tuple[list[PodAnswer], bool]:
        """At every ready proxy pod: revoke the run's credential, then take its records. The answers, and whether
        every pod answered both (a pod that did not: the credential's expiry is the bound, the log may lack its
        share of the run's requests). The pods are asked at once, with one deadline END_RUN_SECONDS away: a pod
        that has not answered by then counts as not asked, and the run's end waits for it no longer."""
        access, admin_port = self._read()
        pods = self.api.list_pods(access.route.namespace, dict(access.route.pod_labels))
        deadline = time.monotonic() + END_RUN_SECONDS
        complete, asking = True, {}
        for pod in pods:
            address = (pod.get("status") or {}).get("podIP")
            if not address or not is_ready(pod):
                complete = complete and not _serving(pod)  # a pod still starting served nobody
                continue
            asking[pod["metadata"]["name"]] = f"http://{socket_address(address, admin_port)}/runs/{uid}"
        if not asking:
            return [], complete
        bearer, revocation = admin_bearer(access.key), json.dumps({"expires": expires}).encode()
        pool = ThreadPoolExecutor(min(len(asking), MAX_PODS_AT_ONCE), thread_name_prefix="coderun-egress-admin")
        try:
            asked = {name: pool.submit(self._ask, name, base, bearer, revocation, deadline)
                     for name, base in asking.items()}
            answered, _ = wait(asked.values(), timeout=max(0.0, deadline - time.monotonic()) + LATE_SECONDS)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # a call past the deadline is left to end on its own
        for name in (name for name, future in asked.items() if future not in answered):
            log.warning("egress proxy pod %s: no answer within %s s", name, END_RUN_SECONDS)
        answers = [a for a in (future.result() for future in asked.values() if future in answered) if a is not None]
        return answers, complete and len(answers) == len(asked)

    def _ask(self, pod: str, base: str, bearer: str, revocation: bytes, deadline: float) -> PodAnswer | None:
        """One pod's revocation, then its records of the run; None (logged) when it could not be asked."""
        try:
            revoked, _, _ = self._transport("POST", f"{base}/revoke", bearer, revocation, deadline)
            status, body, headers = self._transport("GET", f"{base}/log", bearer, None, deadline)
        except OSError as e:
            log.warning("egress proxy pod %s: %s: %s", pod, type(e).__name__, str(e)[:200])
            return None
        if revoked != 204 or status != 200:
            log.warning("egress proxy pod %s answered %s/%s", pod, revoked, status)
            return None
        return _answer(body, headers)


def _answer(body: bytes, headers: Mapping[str, str]) -> PodAnswer:
    records = []
    for line in body.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by the pod's cap
        if isinstance(record, dict):
            records.append(record)
    return PodAnswer(tuple(records), _count(headers, "X-Coderun-Requests"), _count(headers, "X-Coderun-Bytes-Sent"),
                     _count(headers, "X-Coderun-Bytes-Received"), _count(headers, "X-Coderun-Dropped"),
                     _count(headers, "X-Coderun-Admitted"))


def _count(headers: Mapping[str, str], name: str) -> int:
    value = str(headers.get(name) or "0")
    return int(value) if value.isdigit() and len(value) < 19 else 0


def target_port(port: Mapping[str, Any]) -> int:
    """The pod port a Service port leads to (its targetPort when a number, else its own port)."""
    target = port.get("targetPort")
    return target if isinstance(target, int) else int(port["port"])


def _serving(pod: Mapping[str, Any]) -> bool:
    """A pod that may have served the run although it cannot be asked now (running, perhaps being deleted)."""
    return (pod.get("status") or {}).get("phase") == "Running"
