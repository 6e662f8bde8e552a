"""What the operator knows of the cluster: runs and sandbox pods as the watches and its own writes left them.

Fed by kopf's watch events and by the answers to our own writes, so decisions never wait for the API
server and the idle cost does not grow with the number of finished runs. What is read besides the watches: a
namespace's runs once after a start (before its queue is counted), the policies once after a start, the nodes
(cached 30 s) when a pending pod or an image digest needs them, and, polled by the tick, the sandbox log of a
session run whose attach stream is gone (an operator restart, a broken stream) until its frame is there.
A watch event older than what we already hold (a lagging stream, our own write seen first) is ignored.

A finished run is kept as a slim projection (identity, outcome, what the expiry and the cache look up), never
whole: a run holds up to ~1 MiB of code, output and artifacts list, finished runs stay for their TTL, and a
restarted leader is handed all of them at once. The cache reads the one run it answers from by name.
"""
from __future__ import annotations

import heapq
import threading
from datetime import datetime
from typing import Any, Iterator, Mapping

from coderun.api.models import CodeRunSpec
from coderun.api.reasons import TERMINAL_PHASES
from ..builders import LABEL_POOL
from ..builders.names import LABEL_SESSION_UID
from ..kube_api import KubeApi
from ..policy import Decision, Denial

# A run's spec parsed (or the InvalidSpec denial), and the decision its status records (None until it does).
Typed = tuple[CodeRunSpec | Denial | None, Decision | Denial | None]


def resource_version(obj: Mapping[str, Any]) -> int | None:
    try:
        return int(obj["metadata"].get("resourceVersion"))
    except (TypeError, ValueError):
        return None


def owner_uid(pod: Mapping[str, Any]) -> str | None:
    for owner in pod["metadata"].get("ownerReferences") or ():
        if owner.get("kind") == "CodeRun" and owner.get("controller"):
            uid = owner.get("uid")
            return uid if isinstance(uid, str) else None
    return None


def is_terminal(run: Mapping[str, Any]) -> bool:
    return (run.get("status") or {}).get("phase") in TERMINAL_PHASES


_KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "generation")
_KEPT_SPEC = ("policyRef", "ttlSecondsAfterFinished", "session")  # the expiry's, the session's
# the cache's, the pod's, and a session's (its runs' count and its idle clock)
_KEPT_STATUS = ("phase", "reason", "startTime", "completionTime", "podName", "startMode", "cacheKey", "cachedFrom")


def _picked(mapping: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: mapping[k] for k in keys if k in mapping}


def finished_projection(run: Mapping[str, Any]) -> dict[str, Any]:
    """What the controller needs of a finished run: identity, outcome, its pod's name, the cache's fields and
    the TTL its expiry is computed from, in fresh dicts, so nothing keeps the whole object alive."""
    meta, spec, status = run["metadata"], run.get("spec") or {}, run.get("status") or {}
    projected = {"metadata": _picked(meta, _KEPT_METADATA), "spec": _picked(spec, _KEPT_SPEC),
                 "status": _picked(status, _KEPT_STATUS)}
    ttl = (status.get("decision") or {}).get("ttlSecondsAfterFinished")
    if ttl is not None:
        projected["status"]["decision"] = {"ttlSecondsAfterFinished": ttl}  # only this, never a whole record
    kept_until = (status.get("dataGrant") or {}).get("expires")
    if kept_until is not None:  # when its stored artifacts go (the store's sweep), never the grant itself
        projected["status"]["dataGrant"] = {"expires": kept_until}
    return projected


def list_runs_once(api: KubeApi, store: Store, namespace: str) -> None:
    """Once per namespace after a start: the watch may not have delivered every run yet (a restart, a burst),
    and a run a slot's count or a session's queue misses would break the cap or the order."""
    if namespace not in store.listed_namespaces:
        for listed in api.list_runs(namespace):
            store.put_run(listed)
        store.listed_namespaces.add(namespace)


class Store:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, dict[str, Any]] = {}  # by the owning run's uid
        self._pool: dict[str, dict[str, Any]] = {}  # unclaimed warm pool pods, by pod uid
        self._expiries: list[tuple[datetime, str]] = []
        self._scheduled: set[str] = set()
        # namespace -> CodeRunPolicy name -> Policy, or InvalidPolicyMark for one that cannot be applied
        self._policies: dict[str, dict[str, Any]] = {}
        # (namespace, name) -> the newest resourceVersion seen of that policy, deletions included: the startup
        # list may answer older than an event already applied, and must not bring back a deleted policy
        self._policy_versions: dict[tuple[str, str], int] = {}
        # Every CodeRunPolicy was listed once since start: until then nothing is admitted (a run without
        # policyRef would get the built-in baseline in a namespace whose policies are not loaded yet).
        self.policies_listed = False
        # namespaces whose runs were listed once since start: every run there is known, not only those the
        # watch has delivered so far
        self.listed_namespaces: set[str] = set()
        # run uid -> (its spec parsed, or the InvalidSpec denial; the decision its status records, once it does):
        # the spec is immutable and a recorded decision final, so each is parsed once per run, not per reconcile
        self._typed: dict[str, Typed] = {}

    # ---- runs
    def put_run(self, run: Mapping[str, Any]) -> dict[str, Any]:
        """Keep the newer of what we hold and `run` (a finished run as its projection); returns what we hold."""
        uid = run["metadata"]["uid"]
        with self._lock:
            held = self._runs.get(uid)
            if held is not None and (resource_version(held) or 0) > (resource_version(run) or 0):
                return held
            if is_terminal(run):
                self._runs[uid] = finished_projection(run)
                self._typed.pop(uid, None)
            else:
                self._runs[uid] = dict(run)
            return self._runs[uid]

    def forget_run(self, uid: str) -> None:
        with self._lock:
            self._runs.pop(uid, None)
            self._pods.pop(uid, None)
            self._typed.pop(uid, None)
            self._scheduled.discard(uid)
            if len(self._expiries) > 2 * len(self._scheduled) + 64:
                # Mostly runs deleted before their time (by their owners): drop their entries, so the heap
                # stays the size of what is still scheduled.
                self._expiries = [entry for entry in self._expiries if entry[1] in self._scheduled]
                heapq.heapify(self._expiries)

    def run(self, uid: str) -> dict[str, Any] | None:
        with self._lock:
            return self._runs.get(uid)

    def typed(self, uid: str) -> Typed:
        """(spec, recorded decision) as kept by `keep_typed`; (None, None) when nothing is kept."""
        with self._lock:
            return self._typed.get(uid, (None, None))

    def keep_typed(self, uid: str, spec: CodeRunSpec | Denial, decision: Decision | Denial | None) -> None:
        with self._lock:
            if uid in self._runs and not is_terminal(self._runs[uid]):
                self._typed[uid] = (spec, decision)

    def unfinished(self) -> list[str]:
        with self._lock:
            return [uid for uid, run in self._runs.items() if not is_terminal(run)]

    def unfinished_in(self, namespace: str) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self._runs.values()
                    if r["metadata"].get("namespace") == namespace and not is_terminal(r)]

    def active_count(self) -> int:
        with self._lock:
            return sum(1 for run in self._runs.values() if not is_terminal(run))

    def finished_in(self, namespace: str, cache_key: str) -> Iterator[dict[str, Any]]:
        """Finished runs of a namespace with this cache key, as projections: the cache picks from memory (no list
        call) and reads only the one it answers from."""
        with self._lock:
            found = [r for r in self._runs.values() if r["metadata"].get("namespace") == namespace
                     and (r.get("status") or {}).get("cacheKey") == cache_key and is_terminal(r)]
        return iter(found)

    def finished_runs_of(self, namespace: str, session: str) -> list[dict[str, Any]]:
        """Finished runs of a namespace that named this CodeRunSession (as projections)."""
        with self._lock:
            return [r for r in self._runs.values() if r["metadata"].get("namespace") == namespace
                    and (r.get("spec") or {}).get("session") == session and is_terminal(r)]

    # ---- policies
    def put_policy(self, namespace: str, name: str, policy: Any, version: int | None = None) -> None:
        with self._lock:
            if not self._newer_policy_version(namespace, name, version):
                return
            self._policies.setdefault(namespace, {})[name] = policy

    def forget_policy(self, namespace: str, name: str, version: int | None = None) -> None:
        with self._lock:
            if self._newer_policy_version(namespace, name, version):
                self._policies.get(namespace, {}).pop(name, None)

    def _newer_policy_version(self, namespace: str, name: str, version: int | None) -> bool:
        """Whether `version` is not older than what was seen of that policy (and remember it)."""
        held = self._policy_versions.get((namespace, name))
        if version is not None and held is not None and version < held:
            return False
        if version is not None:
            self._policy_versions[(namespace, name)] = version
        return True

    def policies(self, namespace: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._policies.get(namespace, {}))

    def all_policies(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return {namespace: dict(policies) for namespace, policies in self._policies.items()}

    # ---- pods
    def put_pod(self, pod: Mapping[str, Any]) -> str | None:
        """A run's pod (returns the run's uid), or an unclaimed warm pool pod (kept apart; returns None). A pool pod
        a session claimed keeps the pool's labels (for its routes) but is the session's, not the pool's."""
        uid = owner_uid(pod)
        pod_uid = pod["metadata"].get("uid")
        labels = pod["metadata"].get("labels") or {}
        if uid is None and LABEL_POOL in labels and LABEL_SESSION_UID not in labels:
            with self._lock:
                held = self._pool.get(pod_uid)
                if held is None or (resource_version(held) or 0) <= (resource_version(pod) or 0):
                    self._pool[pod_uid] = dict(pod)
            return None
        if uid is not None:
            with self._lock:
                self._pool.pop(pod_uid, None)
                held = self._pods.get(uid)
                if held is None or held["metadata"].get("uid") != pod["metadata"].get("uid") or \
                        (resource_version(held) or 0) <= (resource_version(pod) or 0):
                    self._pods[uid] = dict(pod)
        return uid

    def forget_pod(self, pod: Mapping[str, Any]) -> str | None:
        uid = owner_uid(pod)
        with self._lock:
            self._pool.pop(pod["metadata"].get("uid"), None)
            held = self._pods.get(uid) if uid is not None else None
            if uid is not None and held is not None and held["metadata"].get("uid") == pod["metadata"].get("uid"):
                del self._pods[uid]
        return uid

    def pod(self, run_uid: str) -> dict[str, Any] | None:
        with self._lock:
            return self._pods.get(run_uid)

    def pool_pods(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._pool.values())

    # ---- expiry: a heap of (when, run uid), so nothing scans finished runs
    def expire_at(self, when: datetime, uid: str) -> None:
        """Schedule a finished run's deletion, once."""
        with self._lock:
            if uid not in self._scheduled:
                self._scheduled.add(uid)
                heapq.heappush(self._expiries, (when, uid))

    def due_expiries(self, now: datetime) -> list[str]:
        due = []
        with self._lock:
            while self._expiries and self._expiries[0][0] <= now:
                uid = heapq.heappop(self._expiries)[1]
                self._scheduled.discard(uid)
                due.append(uid)
        return due

    def active_by_namespace(self) -> dict[str, int]:
        """Unfinished runs per namespace, only namespaces that have some: the metrics gauge's series stay as many
        as the namespaces running something now."""
        counts: dict[str, int] = {}
        with self._lock:
            for run in self._runs.values():
                if not is_terminal(run):
                    namespace = run["metadata"].get("namespace", "")
                    counts[namespace] = counts.get(namespace, 0) + 1
        return counts
