"""The controller: one reconcile per run, driven by watch events and a timer, over the in-memory store.

Stages live beside this file: `admission` (policy, children, the Pending status), `collection` (follow the
pod, read the result, finish). This module holds what every stage shares: the per-run lock, the one
terminal-status writer (with its ladder of smaller statuses when the API server refuses one), Events and
metrics, and the one place API failures are handled:

- `k8s.Transient`: logged in one line; the next event or tick reconciles again;
- anything else: a bug or an object we cannot handle. After `MAX_FAILURES` attempts the run ends Failed /
  InternalError with the exception named, so no run is left without a terminal status.
"""
from __future__ import annotations

import logging
import threading
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping

from .. import k8s as real_k8s
from .. import metrics
from coderun.api.identity import APPROVED_BY
from coderun.api.coderunpolicy import spec_digest
from coderun.api.models import CodeRunStatus
from coderun.api.reasons import Phase, Reason, StartMode
from coderun.api.text import one_line
from ..results.budget import smaller_statuses, status_budget
from ..results.lifecycle import expiry_time
from ..results.status import Outcome, terminal_status
from .identity import IdentityGuard
from .store import Store, is_terminal, resource_version

log = logging.getLogger("coderun")

MAX_FAILURES = 3
EXPIRY_RETRY_SECONDS = 30
# Every this many ticks (a minute at the default 5 s) the tick looks at every unfinished run, the level pass
# behind missed watch events; the other ticks only at runs with work due (see `_due`).
FULL_PASS_TICKS = 12


def to_wire(status: Mapping[str, Any]) -> dict[str, Any]:
    """The status through the model that generates the CRD: a misspelt or undeclared field fails here, loudly,
    instead of being pruned by the API server. Fields set to None stay, as null, to clear stale values.
    Messages (which quote error messages, identities and names) leave with control characters escaped: kubectl
    prints them to terminals."""
    wire = CodeRunStatus.model_validate(dict(status)).model_dump(by_alias=True, exclude_unset=True, mode="json")
    if wire.get("message"):
        wire["message"] = one_line(wire["message"])
    for condition in wire.get("conditions") or ():
        condition["message"] = one_line(condition.get("message") or "")
    return wire


class Controller:
    def __init__(self, api=real_k8s, clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)):
        self.api = api
        self.now = clock
        self.store = Store()
        self._locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()
        self._failures: dict[str, int] = {}
        self._retrying: set[str] = set()  # runs whose last step met a transient API failure
        self._ticks = 0
        # image (as the policy names it) -> sha256 digest the kubelet last reported for it on a sandbox pod
        self.seen_digests: dict[str, str] = {}
        self._namespace_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        # namespaces where a run finished: their queued runs are looked at once no run lock is held
        self._freed: set[str] = set()
        # The warm pool (warm.py): run uid -> the thread feeding its claimed pod; runs that must start cold
        # (their warm pod failed); warm runs whose runner announced its input to an earlier operator.
        self.sessions: dict[str, threading.Thread] = {}
        self.cold_only: set[str] = set()
        self.accepted_elsewhere: set[str] = set()
        self._pool_wakeup = threading.Event()
        self._pool_ready_seen: set[str] = set()
        self.identity = IdentityGuard(api, clock)
        self._policies_listing = threading.Lock()

    # ------------------------------------------------------------------ entry points (handlers call these)
    def on_run(self, run: Mapping[str, Any], deleted: bool) -> None:
        uid = run["metadata"]["uid"]
        if deleted:
            self.store.forget_run(uid)
            with self._locks_guard:
                self._locks.pop(uid, None)
            self._failures.pop(uid, None)
            self._retrying.discard(uid)
            self.cold_only.discard(uid)
            self.accepted_elsewhere.discard(uid)
            if not is_terminal(run):  # a run deleted with its sandbox frees a slot
                self._freed.add(run["metadata"]["namespace"])
                self._start_queued()
            return
        self.store.put_run(run)
        self.reconcile(uid)

    def on_pod(self, pod: Mapping[str, Any], deleted: bool) -> None:
        from . import warm
        self._note_digest(pod)
        uid = self.store.forget_pod(pod) if deleted else self.store.put_pod(pod)
        if uid is None:
            warm.observe_ready(pod, self._pool_ready_seen)
            if deleted:
                self._pool_ready_seen.discard(pod["metadata"].get("uid"))
                self.wake_pool()
            return
        run = self.store.run(uid)
        # Only the deletion of the pod the run follows ends it (not a warm pod it gave up for a cold start).
        current = run is not None and (run.get("status") or {}).get("podName") == pod["metadata"]["name"]
        self.reconcile(uid, pod_event_deleted=deleted and current)

    def with_run(self, uid: str, step: Callable[[dict[str, Any]], None]) -> None:
        """Run `step` on the run as the store holds it now, under its lock, unless it is gone or finished (for
        threads other than the event handlers, e.g. a warm pod's session)."""
        with self._lock(uid):
            run = self.store.run(uid)
            if run is not None and not is_terminal(run):
                self._guarded(uid, run, lambda: step(run))
        self._start_queued()

    # ------------------------------------------------------------------ the warm pool
    def wake_pool(self) -> None:
        self._pool_wakeup.set()

    def keep_pools(self, interval_seconds: float, stop: threading.Event) -> None:
        """The pool loop (a thread of its own): refill when a claim or a deletion wakes it, else every interval."""
        from . import warm
        while not stop.is_set():
            self._pool_wakeup.wait(interval_seconds)
            self._pool_wakeup.clear()
            try:
                warm.refill(self)
            except real_k8s.Transient as e:
                log.warning("warm pool: %s; will retry", e)
            except Exception as e:  # noqa: BLE001 - the loop must outlive any one pass
                log.error("warm pool: %s: %s", type(e).__name__, str(e)[:300])

    def on_policy(self, policy: Mapping[str, Any], deleted: bool) -> None:
        """Keep the namespace's policies current; runs already admitted keep the decision they recorded."""
        meta = policy["metadata"]
        if deleted:
            self.store.forget_policy(meta["namespace"], meta["name"], resource_version(policy))
            return
        from ..policy import InvalidPolicyMark
        from ..policy.load import InvalidPolicy, policy_from_object
        held = self.store.policies(meta["namespace"]).get(meta["name"])
        if getattr(held, "uid", None) == meta.get("uid") and \
                getattr(held, "digest", None) == spec_digest(policy.get("spec") or {}):
            return  # the same policy (uid and spec digest): keep what it compiled
        try:
            loaded = policy_from_object(policy)
        except InvalidPolicy as e:
            log.warning("policy %s/%s cannot be applied: %s", meta["namespace"], meta["name"], e)
            loaded = InvalidPolicyMark(str(e))
        self.store.put_policy(meta["namespace"], meta["name"], loaded, resource_version(policy))

    def ensure_policies_listed(self) -> None:
        """List every CodeRunPolicy once before the first admission or webhook answer after a start (or a leader
        change): the watch may not have delivered them yet. A failure raises Transient: the run waits and is
        reconciled again by the tick."""
        if self.store.policies_listed:
            return
        with self._policies_listing:
            if not self.store.policies_listed:
                for policy in self.api.list_policies():
                    self.on_policy(policy, deleted=False)
                self.store.policies_listed = True

    def namespace_lock(self, namespace: str) -> threading.Lock:
        with self._locks_guard:
            return self._namespace_locks[namespace]

    def tick(self) -> None:
        """Every few seconds: runs with work due (a clock to watch, a retry), due expiries; and now and then
        every unfinished run. Queued and approval-waiting runs move on events (a finish, an annotation), so
        a long queue costs no writes and no reconciles per tick."""
        self._ticks += 1
        full_pass = self._ticks % FULL_PASS_TICKS == 0
        for uid in self.store.unfinished():
            run = self.store.run(uid)
            if run is not None and (full_pass or self._due(uid, run)):
                self.reconcile(uid)
        for uid in self.store.due_expiries(self.now()):
            run = self.store.run(uid)
            if run is not None:
                self._guarded(uid, run, lambda: self._expire(run))

    def _due(self, uid: str, run: Mapping[str, Any]) -> bool:
        """Work the clock brings: a retry, an admission not done yet, a pod that must start within its deadline,
        a warm pod's input or Running status (warm.py times both), an approval given but not yet believed (its
        admission policy is checked again once the check's cache expires; no event says it was repaired)."""
        status = run.get("status") or {}
        return (uid in self._failures or uid in self._retrying or not status.get("phase")
                or (status.get("phase") == Phase.PENDING and bool(status.get("podName")))
                or status.get("startMode") == StartMode.WARM
                or (status.get("reason") == Reason.AWAITING_APPROVAL
                    and APPROVED_BY in (run["metadata"].get("annotations") or {})))

    def _note_digest(self, pod: Mapping[str, Any]) -> None:
        for container in (pod.get("status") or {}).get("containerStatuses") or ():
            image, image_id = container.get("image") or "", container.get("imageID") or ""
            if "sha256:" in image_id and "@" not in image:
                self.seen_digests[image] = image_id[image_id.rindex("sha256:"):]

    # ------------------------------------------------------------------ reconcile
    def reconcile(self, uid: str, pod_event_deleted: bool = False) -> None:
        with self._lock(uid):
            run = self.store.run(uid)
            if run is not None:
                self._guarded(uid, run, lambda: self._reconcile(run, pod_event_deleted))
        self._start_queued()

    def _start_queued(self) -> None:
        """A run finished: queued runs of its namespace may start now, oldest first (not under any run lock,
        so two finishing runs never wait on each other)."""
        while self._freed:
            try:
                namespace = self._freed.pop()
            except KeyError:
                return
            waiting = [r for r in self.store.unfinished_in(namespace)
                       if (r.get("status") or {}).get("reason") == Reason.QUEUED]
            full: set[str] = set()  # policies whose oldest waiting run found no slot: the younger ones wait too
            for run in sorted(waiting, key=lambda r: (r["metadata"].get("creationTimestamp") or "",
                                                       r["metadata"]["name"])):
                policy = run["status"].get("policy")
                if policy in full:
                    continue
                with self._lock(run["metadata"]["uid"]):
                    current = self.store.run(run["metadata"]["uid"])
                    if current is not None and not is_terminal(current):
                        self._guarded(run["metadata"]["uid"], current, lambda: self._reconcile(current, False))
                    after = self.store.run(run["metadata"]["uid"])
                    if after is not None and (after.get("status") or {}).get("reason") == Reason.QUEUED:
                        full.add(policy)

    def _lock(self, uid: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks[uid]

    def _guarded(self, uid: str, run: Mapping[str, Any], step: Callable[[], None]) -> None:
        meta = run["metadata"]
        try:
            step()
            self._failures.pop(uid, None)
            self._retrying.discard(uid)
        except real_k8s.Transient as e:
            self._retrying.add(uid)
            log.warning("run %s/%s: %s; will retry", meta.get("namespace"), meta.get("name"), e)
        except Exception as e:  # noqa: BLE001 - never let one run stop the others, never loop silently
            failures = self._failures[uid] = self._failures.get(uid, 0) + 1
            log.error("run %s/%s: %s: %s (attempt %d of %d)", meta.get("namespace"), meta.get("name"),
                      type(e).__name__, str(e)[:500], failures, MAX_FAILURES)
            log.debug("details", exc_info=True)
            if failures >= MAX_FAILURES and not is_terminal(self.store.run(uid) or run):
                self._give_up(run, e)

    def _give_up(self, run: Mapping[str, Any], error: Exception) -> None:
        try:
            self.finish(run, Outcome(Phase.FAILED, Reason.INTERNAL_ERROR,
                                     f"the operator could not process this run ({type(error).__name__}: "
                                     f"{str(error)[:300]}); this is a coderun bug, please report it"))
        except Exception as e:  # noqa: BLE001
            log.error("run %s: could not record the failure: %s: %s", run["metadata"].get("name"),
                      type(e).__name__, str(e)[:300])

    def _reconcile(self, run: Mapping[str, Any], pod_event_deleted: bool) -> None:
        from . import admission, collection  # the stages import this module
        uid = run["metadata"]["uid"]
        if is_terminal(run):
            pod = self.store.pod(uid)
            if pod is not None and not pod["metadata"].get("deletionTimestamp"):
                self.api.delete_pod(run["metadata"]["namespace"], pod["metadata"]["name"])
            self._schedule_expiry(run)
            return
        if not (run.get("status") or {}).get("podName"):
            admission.admit(self, run)
            if not (run.get("status") or {}).get("phase"):
                # Until looked at, it counted as ahead of every queued run of its namespace; now it does only if
                # it took a slot, so queued runs may start (e.g. it waits for approval instead).
                self._freed.add(run["metadata"]["namespace"])
        else:
            collection.advance(self, run, self.store.pod(uid), pod_event_deleted)

    # ------------------------------------------------------------------ writing status
    def write_status(self, run: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any] | None:
        """Patch /status; when the API server refuses it, ever smaller versions. The status written, or None
        when the run is gone. The store takes the API server's answer, so no stale event undoes it."""
        meta, refusals = run["metadata"], []
        for candidate in smaller_statuses(status, status_budget(run), refusals):
            try:
                written = self.api.patch_run_status(meta["namespace"], meta["name"], to_wire(candidate))
            except real_k8s.Refused as e:
                refusals.append(str(e))
                log.warning("run %s/%s: status refused (%s); writing a smaller one", meta["namespace"],
                            meta["name"], str(e)[:300])
                continue
            if written is None:
                return None
            self.store.put_run(written)
            return candidate
        raise real_k8s.Refused(f"every status for this run was refused: {refusals[-1]}", 422)

    def finish(self, run: Mapping[str, Any], outcome: Outcome) -> dict[str, Any] | None:
        """The one writer of terminal statuses: write, tell people (an Event), count (metrics)."""
        meta = run["metadata"]
        written = self.write_status(run, terminal_status(run, outcome, self.now()))
        if written is None:
            return None
        self._freed.add(meta["namespace"])
        self.event(run, "Normal" if outcome.phase == Phase.SUCCEEDED else "Warning", outcome.reason,
                   written.get("message") or outcome.message)
        metrics.observe_finished(written, metrics.language_label((run.get("spec") or {}).get("language")))
        log.info("run %s/%s %s/%s", meta["namespace"], meta["name"], outcome.phase, outcome.reason)
        self._schedule_expiry(self.store.run(meta["uid"]) or run)
        return written

    def event(self, run: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        try:
            self.api.post_event(run, type_, reason, one_line(message))
        except (real_k8s.Transient, real_k8s.Refused) as e:  # an Event is a courtesy, never a reason to retry
            log.warning("run %s: event not posted: %s", run["metadata"].get("name"), e)

    # ------------------------------------------------------------------ lifecycle
    def _schedule_expiry(self, run: Mapping[str, Any]) -> None:
        when = expiry_time(run, self.store.policies(run["metadata"]["namespace"]))
        if when is not None:
            self.store.expire_at(when, run["metadata"]["uid"])

    def _expire(self, run: Mapping[str, Any]) -> None:
        meta = run["metadata"]
        try:
            self.api.delete_run(meta["namespace"], meta["name"], meta["uid"])
        except real_k8s.Transient:
            self.store.expire_at(self.now() + timedelta(seconds=EXPIRY_RETRY_SECONDS), meta["uid"])
            raise
        log.info("run %s/%s deleted after its ttlSecondsAfterFinished", meta["namespace"], meta["name"])
