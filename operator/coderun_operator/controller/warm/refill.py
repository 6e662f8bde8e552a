"""The refill loop (a thread of its own): keep every pool at its size. Its state (when it started, pools whose
pods were refused, pool pods already seen ready) lives in a `Refill` object."""
from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from coderun.api.coderunpolicy import WarmPoolStatus
from ...kube_api import KubeApi
from ... import metrics
from ...builders import LABEL_POOL, LABEL_POOL_LANGUAGE, build_pool_pod
from ...builders.names import fit_name
from ...policy import Decision
from ...results.status import parse_time
from ...builders.egress import ProxyRoute
from ...proxy import EgressProxy, ProxyUnavailable, access_for
from ..children import ensure_namespace_default_deny, ensure_pool_routes
from ..store import Store, owner_uid
from .trust import POOL_IDLE_SECONDS, is_genuine, is_ready, is_spent, key_of, outlived, wanted_pools

log = logging.getLogger("coderun")

# After a start, pool pods whose policy the watch has not delivered yet are not stale.
STARTUP_GRACE_SECONDS = 30
# Pool pods starting at once per pool: a gVisor start costs about a CPU-second, which claimed pods need more.
MAX_STARTING = 4
# A pool whose pods the API server refused is not asked again before this (a quota does not lift at once).
REFUSED_RETRY_SECONDS = 30


class Refill:
    """`on_pools` is told, after each pass, how every policy's pool stands ((namespace, policy) -> size, ready)."""

    def __init__(self, api: KubeApi, store: Store, proxy: EgressProxy | None = None,
                 on_pools: Callable[[Mapping[tuple[str, str], WarmPoolStatus]], None] = lambda stands: None,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)):
        self.api, self.store, self.proxy, self.clock = api, store, proxy, clock
        self._on_pools = on_pools
        self.started = time.monotonic()
        self._wakeup = threading.Event()
        self._ready_seen: set[str] = set()
        self._refused_until: dict[tuple[str, str], float] = {}

    def wake(self) -> None:
        self._wakeup.set()

    def keep(self, interval_seconds: float, stop: threading.Event) -> None:
        """Refill when a claim or a deletion wakes it, else every interval."""
        self.started = time.monotonic()  # the grace counts from when this replica leads, not from its import
        while not stop.is_set():
            self._wakeup.wait(interval_seconds)
            self._wakeup.clear()
            try:
                self.refill()
            except self.api.Transient as e:
                log.warning("warm pool: %s; will retry", e)
            except Exception as e:  # noqa: BLE001 - the loop must outlive any one pass
                log.error("warm pool: %s: %s", type(e).__name__, str(e)[:300])

    def on_pool_pod(self, pod: Mapping[str, Any], deleted: bool) -> None:
        """An unclaimed pool pod's event: time its start once; a deletion leaves a place to fill."""
        self._observe_ready(pod)
        if deleted:
            self._ready_seen.discard(pod["metadata"].get("uid"))
            self.wake()

    def refill(self) -> None:
        """Create what is missing, delete what no policy wants (changed, shrunk, removed) and pods that can
        never serve."""
        wanted: dict[tuple[str, str], tuple[str, Decision, int]] = {}
        for namespace, policies in self.store.all_policies().items():
            for policy in policies.values():
                for key, (language, decision) in wanted_pools(namespace, policy).items():
                    wanted[(namespace, key)] = (language, decision, policy.warm_pool_size)
        by_pool: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
        settled = time.monotonic() - self.started > STARTUP_GRACE_SECONDS
        now = self.clock()
        for pod in self.store.pool_pods():
            meta = pod["metadata"]
            pool = (meta.get("namespace"), key_of(pod))
            # A pod that is not what the pool builds now (an older operator's, e.g. before the input had a
            # volume of its own, or a look-alike) would never be claimed, yet fill the pool's place: replace it.
            outdated = pool in wanted and not is_genuine(pod, wanted[pool][1])
            if is_spent(pod) or outlived(pod, now) or (pool not in wanted and settled) or outdated:
                if not meta.get("deletionTimestamp"):
                    self._delete_unclaimed(pod)
                continue
            by_pool.setdefault(pool, []).append(pod)
        stands: dict[tuple[str, str], WarmPoolStatus] = {}
        for (namespace, key), (language, decision, size) in wanted.items():
            pods = sorted(by_pool.get((namespace, key), ()),
                          key=lambda p: p["metadata"].get("creationTimestamp") or "")
            ready = sum(1 for p in pods if is_ready(p))
            metrics.POOL_READY.labels(namespace, decision.policy.name, language).set(ready)
            held = stands.get((namespace, decision.policy.name), WarmPoolStatus(size=0, ready=0))
            stands[(namespace, decision.policy.name)] = WarmPoolStatus(size=held.size + size, ready=held.ready + ready)
            for extra in pods[size:]:
                self._delete_unclaimed(extra)
            starting = sum(1 for p in pods if not is_ready(p))
            missing = min(size - len(pods), MAX_STARTING - starting)
            if missing > 0:
                self._create(namespace, key, language, decision, missing)
        self._on_pools(stands)
        # only pods still in a pool can be seen ready for the first time: a claimed pod's uid would stay for good
        self._ready_seen.intersection_update(p["metadata"].get("uid") for p in self.store.pool_pods())

    def _delete_unclaimed(self, pod: Mapping[str, Any]) -> None:
        """Delete a pool pod only as we saw it: if a run claimed it meanwhile, its resourceVersion moved and the
        API server refuses the deletion."""
        meta = pod["metadata"]
        self.api.delete_pod(meta["namespace"], meta["name"], resource_version=meta.get("resourceVersion"))

    def _create(self, namespace: str, key: str, language: str, decision: Decision, count: int) -> None:
        if self._refused_until.get((namespace, key), 0) > time.monotonic():
            return
        try:
            conflict = (ensure_namespace_default_deny(self.api, namespace)
                        or ensure_pool_routes(self.api, namespace, decision.policy, self._proxy_route(decision)))
            if conflict:
                log.warning("warm pool of %s/%s: %s; no pool pods", namespace, decision.policy.name, conflict)
                return
            labels = {LABEL_POOL: fit_name(decision.policy.name), LABEL_POOL_LANGUAGE: language, "key": key}
            for _ in range(count):
                created = self.api.create_pod(build_pool_pod(namespace, decision, labels, POOL_IDLE_SECONDS))
                self.store.put_pod(created)
        # A quota, an admission policy, a namespace going away, the egress proxy down: try again later.
        except (self.api.Refused, ProxyUnavailable) as e:
            self._refused_until[(namespace, key)] = time.monotonic() + REFUSED_RETRY_SECONDS
            log.warning("warm pool of %s/%s: %s; trying again in %d s", namespace, decision.policy.name, e,
                        REFUSED_RETRY_SECONDS)

    def _proxy_route(self, decision: Decision) -> ProxyRoute | None:
        """Where the pool's pods reach the egress proxy, for a policy with host rules."""
        access = access_for(self.proxy, decision.policy.egress)
        return access.route if access else None

    def _observe_ready(self, pod: Mapping[str, Any]) -> None:
        """Refill time: a pool pod's creation to its runner running (once per pod)."""
        meta = pod["metadata"]
        if owner_uid(pod) is None and LABEL_POOL in (meta.get("labels") or {}) and is_ready(pod) \
                and meta.get("uid") not in self._ready_seen:
            self._ready_seen.add(meta["uid"])
            created = parse_time(meta.get("creationTimestamp"))
            started = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("state", {}).get(
                "running", {})
            running = parse_time(started.get("startedAt"))
            if created and running:
                metrics.POOL_REFILL_SECONDS.observe(max((running - created).total_seconds(), 0))
