"""The controller: one reconcile per run, driven by watch events and a timer, over the in-memory store.

Every run goes admit -> place -> follow -> collect -> finish, each step read off what the store holds (level-
triggered), whatever runs its program: a run without a pod is admitted (its decision source: its policy, with
approval, the cache and a slot; or its session) and placed (placement.py: its session's sandbox; else a warm pod
if its pool has one, else a cold pod of its own); a placed run is followed by its placement until its frame is
collected; every status goes through the one writer (writer.py), every terminal one through `_finish`, after
which the placement lets the sandbox go. A placement given up before the program ran (a warm pod gone cold) is a
status write (no pod) followed by another reconcile.

Order matters for "nothing is lost": children are created before the status names them, artifacts are stored
before the status lists them, and the pod is deleted only after the result is written, so a crash at any
point is repaired by the next reconcile. API failures are handled in one place (`_guarded`):

- `k8s.Transient`: logged in one line; the next event or tick reconciles again;
- anything else: a bug or an object we cannot handle. After `MAX_FAILURES` attempts the run ends Failed /
  InternalError with the exception named, so no run is left without a terminal status.
"""
from __future__ import annotations

import logging
import threading
from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping

from ..kube_api import KubeApi
from .. import k8s as real_k8s
from .. import metrics
from coderun.api.coderunpolicy import spec_digest
from coderun.api.identity import APPROVED_BY
from coderun.api.models import CodeRunSpec
from coderun.api.reasons import Phase, Reason
from ..builders.egress import credential_expiry, uses_proxy
from ..builders.objects import POD_DEADLINE_MARGIN_SECONDS
from ..policy import Decision, Denial, InvalidPolicyMark, Policy
from ..policy.approval import approval_verdict, shown_identity
from ..policy.decide import no_requester, parse_spec, verdict
from ..policy.load import InvalidPolicy, policy_from_object
from ..policy.patterns import redactor
from ..results.cache import (CACHE_LABEL, cache_key, image_digest, is_reusable, is_same_source, label_value,
                             pick_reusable, reused_outcome)
from ..audit import AuditAgent
from ..proxy import EgressProxy, ProxyUnavailable, access_for, cannot_start
from ..data.grant import artifact_name_problem
from ..data_plane import DATA_ERRORS, INPUT_REASONS, INPUT_UNAVAILABLE, DataPlane, InputProblem, UploadsAwaited
from ..results.frame import FrameArtifact, FrameError, RunnerFrame
from ..results.lifecycle import ttl_seconds
from ..results.network import log_text, merged, summarise, with_network
from ..results.pod_state import container_status, eviction, image_with_digest
from ..results.status import (Outcome, approved_status, decision_fields, outcome_from_frame, outcome_without_frame,
                              parse_time, refusal_fields, rfc3339)
from .audit import ask_agent, audited, oom_evidence
from .children import ArtifactsConflict, copy_artifacts, ensure_data_route, store_artifacts, store_network_log
from .cold import ColdPlacement
from .identity import IdentityGuard, creator_may_use, recorded_creator
from .placement import Admitted, Again, Collected, Decide, Placement
from .policy_status import PolicyStatusWriter
from .session import SessionBook, SessionReconciler, SessionRuns
from .session.placement import SessionPlacement
from .store import Store, is_terminal, list_runs_once, resource_version
from .warm import Claims, Refill
from .warm.placement import WarmPlacement
from .workqueue import WorkQueue
from .writer import StatusWriter

log = logging.getLogger("coderun")

MAX_FAILURES = 3
EXPIRY_RETRY_SECONDS = 30
# Every this many ticks (a minute at the default 5 s) the tick looks at every unfinished run, the level pass
# behind missed watch events; the other ticks only at runs with work due (see `_due`).
FULL_PASS_TICKS = 12
WAITING_FOR_UPLOAD = "WaitingForUpload"
DATA_SWEEP_TICKS = 120  # ten minutes at the default 5 s tick


class Controller:
    def __init__(self, api: KubeApi = real_k8s, clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 proxy: EgressProxy | None = None, audit: AuditAgent | None = None,
                 own_namespace: str = "coderun-system", data: DataPlane | None = None):
        self.api = api
        self.now = clock
        self.proxy = proxy  # the egress proxy, when the chart runs one (runs with host rules go through it)
        self.data = data  # the data service and the store, when the chart runs them (docs/data.md)
        self._data_routed: set[str] = set()  # namespaces whose sandboxes were let reach the data service
        self._data_gone: WorkQueue[tuple[str, str]] = WorkQueue()  # (namespace, uid) of deleted runs: their objects
        self.audit = audit  # the node audit agents, when the chart installs them (docs/audit.md)
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
        self._freed: WorkQueue[str] = WorkQueue()
        self.writer = StatusWriter(api, self.store, clock, on_finished=self._freed.add)
        self.policy_status = PolicyStatusWriter(api, clock)
        self.pool = Refill(api, self.store, proxy, on_pools=self.policy_status.pools, clock=clock)
        self.claims = Claims(api, self.store, self.writer, clock, self.pool.wake, self._streamed)
        self.identity = IdentityGuard(api, clock)
        self._policies_listing = threading.Lock()
        # own_namespace: where the sessions' key Secret lives (the operator's namespace)
        # a session's own lifecycle, and its runs' side: they share what both read in one book
        self.sessions = SessionReconciler(SessionBook(), api, self.store, self.writer, clock, own_namespace,
                                          self.identity, proxy, self.claims)
        self.session_runs = SessionRuns(self.sessions, self._session_streamed)
        # where a run's program runs (placement.py): chosen once per start, then named by its status's startMode
        self.cold = ColdPlacement(api, self.store, self.writer, clock, data)
        self.warm = WarmPlacement(self.claims)
        self.in_session = SessionPlacement(self.session_runs)
        self._placed: dict[str, Placement] = {p.mode: p for p in (self.cold, self.warm, self.in_session)}

    # ------------------------------------------------------------------ entry points (handlers call these)
    def on_run(self, run: Mapping[str, Any], deleted: bool) -> None:
        uid = run["metadata"]["uid"]
        if deleted:
            self.store.forget_run(uid)
            with self._locks_guard:
                self._locks.pop(uid, None)
            self._failures.pop(uid, None)
            self._retrying.discard(uid)
            self.claims.forget(uid)
            if self.data is not None:  # its stored artifacts go with it (on the tick: the store may be slow)
                self._data_gone.add((run["metadata"]["namespace"], uid))
            self.session_runs.finished(run)  # a session run's frame, held for its finish
            if (run.get("spec") or {}).get("session"):
                self.sessions.wake_queue(run)  # the run behind it, once its document (if any) is in
                self._wake_session_runs()
            if not is_terminal(run):  # a run deleted with its sandbox frees a slot
                self._freed.add(run["metadata"]["namespace"])
                self._start_queued()
            return
        self.store.put_run(run)
        self.reconcile(uid)

    def on_session(self, session: Mapping[str, Any], deleted: bool) -> None:
        self.sessions.on_session(session, deleted, self.ensure_policies_listed)
        self._wake_session_runs()

    def on_pod(self, pod: Mapping[str, Any], deleted: bool) -> None:
        self._note_digest(pod)
        if self.sessions.on_pod(pod, deleted, self.ensure_policies_listed):
            self.store.forget_pod(pod)  # a pool pod a session claimed is no longer the pool's
            self._wake_session_runs()
            return
        uid = self.store.forget_pod(pod) if deleted else self.store.put_pod(pod)
        if uid is None:
            self.pool.on_pool_pod(pod, deleted)
            return
        run = self.store.run(uid)
        # Only the deletion of the pod the run follows ends it (not a warm pod it gave up for a cold start).
        current = run is not None and (run.get("status") or {}).get("podName") == pod["metadata"]["name"]
        self.reconcile(uid, pod_event_deleted=deleted and current)

    def on_policy(self, policy: Mapping[str, Any], deleted: bool) -> None:
        """Keep the namespace's policies current; runs already admitted keep the decision they recorded."""
        meta = policy["metadata"]
        if deleted:
            self.store.forget_policy(meta["namespace"], meta["name"], resource_version(policy))
            self.policy_status.forget(meta["namespace"], meta["name"])
            return
        held = self.store.policies(meta["namespace"]).get(meta["name"])
        if getattr(held, "uid", None) == meta.get("uid") and \
                getattr(held, "digest", None) == spec_digest(policy.get("spec") or {}):
            return  # the same policy (uid and spec digest): keep what it compiled
        loaded: Policy | InvalidPolicyMark
        try:
            loaded = policy_from_object(policy, proxy_enabled=self.proxy is not None)
        except InvalidPolicy as e:
            log.warning("policy %s/%s cannot be applied: %s", meta["namespace"], meta["name"], e)
            loaded = InvalidPolicyMark(str(e))
        self.store.put_policy(meta["namespace"], meta["name"], loaded, resource_version(policy))
        self.policy_status.accepted(policy, loaded.message if isinstance(loaded, InvalidPolicyMark) else None)

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
        self.sessions.tick(self.ensure_policies_listed)
        self._wake_session_runs()
        self.policy_status.flush()
        if self.data is not None:
            self._forget_data(sweep=self._ticks % DATA_SWEEP_TICKS == 0 and self._ticks >= 2 * FULL_PASS_TICKS)

    def _forget_data(self, sweep: bool) -> None:
        """Deleted runs' objects out of the store; and now and then a sweep for runs deleted while no operator
        watched (only once two full passes have seen every run, so a run not yet listed is never taken for gone)
        and for stored artifacts past their time (the policy's artifactTTLSeconds: status.dataGrant.expires).
        The store away: retried on a later tick, the run's objects are never lost track of by the sweep."""
        assert self.data is not None
        data = self.data

        def forget(key: tuple[str, str]) -> None:
            try:
                data.forget(*key)
            except DATA_ERRORS as e:  # the sweep finds them later
                log.warning("run %s/%s: its stored objects not deleted yet: %s", key[0], key[1], str(e)[:200])
        self._data_gone.drain(forget)
        if sweep:
            try:
                gone = data.sweep(self._keeps_data, self.now())
            except DATA_ERRORS as e:
                log.warning("the store sweep failed: %s", str(e)[:200])
                return
            if gone:
                log.info("the store sweep deleted the objects of %d runs that are gone", gone)

    def _keeps_data(self, uid: str) -> bool:
        """The store keeps a run's objects while the run exists and its stored artifacts' time has not passed."""
        run = self.store.run(uid)
        if run is None:
            return False
        until = parse_time(((run.get("status") or {}).get("dataGrant") or {}).get("expires"))
        return until is None or self.now() < until

    def _streamed(self, uid: str, pod_name: str, text: str | None, nonce: str) -> None:
        """What a warm pod's attach brought back (from its thread): no input sent (None), or the stream's frame."""
        self._with_run(uid, lambda run: self._conclude(run, self.warm, self.warm.streamed(run, pod_name, text,
                                                                                          nonce)))

    def _session_streamed(self, uid: str, pod_name: str, sent: bool, text: str, nonce: str) -> None:
        """What a session run's stream brought back (from its thread): its frame, through the finish every run's
        goes through; or why it has none. A run it did not end (not sent, or its frame still to come) moves its
        session all the same (the run is sent again, or the session's status moves)."""
        self._with_run(uid, lambda run: self._conclude(run, self.in_session,
                                                       self.in_session.streamed(run, sent, text, nonce)))
        run = self.store.run(uid)
        if run is not None and not is_terminal(run):
            self.session_runs.after_run(run, self.ensure_policies_listed)

    def _wake_session_runs(self) -> None:
        """The runs a change of their session may move (a session's event, a run's end), outside every lock."""
        self.sessions.woken.drain(self.reconcile)

    # ------------------------------------------------------------------ reconcile
    def reconcile(self, uid: str, pod_event_deleted: bool = False) -> None:
        self._with_run(uid, lambda run: self._reconcile(run, pod_event_deleted), unfinished_only=False)

    def _with_run(self, uid: str, step: Callable[[dict[str, Any]], None], unfinished_only: bool = True) -> None:
        """Run `step` on the run as the store holds it now, under its lock, unless it is gone (or finished, for
        threads other than the event handlers, e.g. a warm pod's attach); then start what a finish freed."""
        with self._lock(uid):
            run = self.store.run(uid)
            if run is not None and not (unfinished_only and is_terminal(run)):
                self._guarded(uid, run, lambda: step(run))
        self._start_queued()
        self.in_session.pass_turns(self.ensure_policies_listed)
        self._wake_session_runs()

    def _reconcile(self, run: Mapping[str, Any], pod_event_deleted: bool) -> None:
        uid = run["metadata"]["uid"]
        if is_terminal(run):
            pod = self.store.pod(uid)
            if pod is not None and not pod["metadata"].get("deletionTimestamp"):
                self.api.delete_pod(run["metadata"]["namespace"], pod["metadata"]["name"])
            self.writer.schedule_expiry(run)
            return
        if not (run.get("status") or {}).get("podName"):
            self._admit(run)
            if not (run.get("status") or {}).get("phase"):
                # Until looked at, it counted as ahead of every queued run of its namespace; now it does only if
                # it took a slot, so queued runs may start (e.g. it waits for approval instead).
                self._freed.add(run["metadata"]["namespace"])
            return
        placement = self._placement_of(run)
        _, decision = self._decide(run)
        self._conclude(run, placement, placement.follow(run, decision if isinstance(decision, Decision) else None,
                                                        pod_event_deleted))

    def _placements(self, run: Mapping[str, Any]) -> tuple[Decide, tuple[Placement, ...]]:
        """Where a run not placed yet may go, and what decides it: a run naming a session, its session; any
        other, its policy, then a warm pod when its pool has one, else cold."""
        if (run.get("spec") or {}).get("session"):
            return self.in_session.decide, (self.in_session,)
        return self._admission, (self.warm, self.cold)

    def _placement_of(self, run: Mapping[str, Any]) -> Placement:
        """Where a placed run is, as its status names it."""
        return self._placed.get((run.get("status") or {}).get("startMode") or "", self.cold)

    def _conclude(self, run: Mapping[str, Any], placement: Placement,
                  result: Collected | Outcome | Again | None) -> None:
        """What a placement says of a run: its frame to finish from, an outcome to end it with, or a placement
        given up (the run is placed anew)."""
        if isinstance(result, Again):
            self._place_again(run)
        elif isinstance(result, Collected):
            self._finish_collected(run, placement, result)
        elif isinstance(result, Outcome):
            self._finish(run, result)
            placement.release(run, (run.get("status") or {}).get("podName"))

    def _place_again(self, run: Mapping[str, Any]) -> None:
        """A placement given up: reconcile the run once its status says it has no sandbox. Not when that write
        did not land (the run is gone): its stored copy still names the pod, and another pass would give the same
        pod up again, and again."""
        current = self.store.run(run["metadata"]["uid"])
        if current is not None and not (current.get("status") or {}).get("podName"):
            self._reconcile(current, False)

    def _decide(self, run: Mapping[str, Any], may_use: Callable[[str], Denial | None] = no_requester
                ) -> tuple[CodeRunSpec | None, Decision | Denial]:
        """policy.decide.decide() with the store's memory: the spec parsed once per run, a recorded decision read
        once; a decision not recorded yet is asked of the live policies every time."""
        uid, recorded = run["metadata"]["uid"], (run.get("status") or {}).get("decision")
        spec, decision = self.store.typed(uid)
        if spec is None:
            spec = parse_spec(run.get("spec") or {})
        if isinstance(spec, Denial):
            self.store.keep_typed(uid, spec, None)
            return None, spec
        if decision is None or not recorded:
            decision = verdict(spec, recorded, self.store.policies(run["metadata"]["namespace"]), may_use)
        self.store.keep_typed(uid, spec, decision if recorded else None)
        return spec, decision

    # ------------------------------------------------------------------ admit
    def _admit(self, run: Mapping[str, Any]) -> None:
        """Decide, then place: a slot (when the policy caps its runs) and the egress access first, then the first
        placement that takes the run."""
        decide, placements = self._placements(run)
        self.ensure_policies_listed()
        admitted = decide(run)
        if isinstance(admitted, Outcome):
            self._conclude(run, placements[-1], admitted)
            return
        if admitted is None:
            return
        if not admitted.takes_slot:
            self._place(run, admitted, placements)
            return
        with self._namespace_lock(run["metadata"]["namespace"]):  # the count and the start are one step: the cap
            if self._slot_free(run, admitted.decision):           # holds exactly
                self._place(run, admitted, placements)

    def _admission(self, run: Mapping[str, Any]) -> Admitted | Outcome | None:
        """A run's policy decides (its creator may name it), a person approves when the policy says so, and an
        earlier run's result answers it when its cache allows (no pod at all)."""
        spec, decision = self._decide(run, creator_may_use(self.api, self.identity, run))
        if isinstance(decision, Denial):
            return Outcome(Phase.REJECTED, decision.reason, decision.message, refusal_fields(decision))
        assert spec is not None  # a spec that does not parse is a Denial
        if decision.policy.approval_required() and not self._approved(run, decision):
            return None
        digest = image_digest(decision.runtime.image, self._node_images())
        # a run with inputs by reference is never a cache's question nor its answer (the code hash covers the
        # spec, not the bytes an input names)
        key = cache_key(spec, decision, digest) if not spec.inputs else None
        if spec.cache and spec.cache.enabled and key and digest and \
                self._answer_from_cache(run, spec, spec.cache.ttl_seconds, decision, digest, key):
            return None
        return Admitted(spec, decision, key, takes_slot=decision.policy.max_concurrent_runs is not None)

    def _place(self, run: Mapping[str, Any], admitted: Admitted, placements: tuple[Placement, ...]) -> None:
        """The run's egress access (the proxy pod it is pinned to, its credential), then the first placement that
        takes it."""
        decision = admitted.decision
        try:
            egress = access_for(self.proxy, decision.policy.egress, run["metadata"]["uid"])
        except ProxyUnavailable as e:
            self._conclude(run, placements[-1], Outcome(Phase.FAILED, Reason.START_FAILED,
                                                        cannot_start(e, decision.policy.name),
                                                        decision_fields(decision)))
            return
        run_data = self._run_data(run, admitted, placements[-1])
        if run_data is None:
            return
        admitted = replace(admitted, run_data=run_data or None)
        for placement in placements:
            placed = placement.place(run, admitted, egress)
            if isinstance(placed, Outcome):
                self._conclude(run, placement, placed)
                return
            if placed:
                return

    def _run_data(self, run: Mapping[str, Any], admitted: Admitted, last: Placement) -> dict[str, Any] | None:
        """run.json's `data` for the run (its inputs resolved and its grant: data_plane.py), {} when it goes
        without the store (none configured, or a run without inputs while the data service is away: its
        artifacts then stay inline), or None when it waits for its caller's uploads or ended here."""
        spec, decision = admitted.spec, admitted.decision
        fields = decision_fields(decision)
        if self.data is None:
            if spec.inputs:
                self._conclude(run, last, Outcome(Phase.FAILED, INPUT_UNAVAILABLE, (
                    "this installation runs no data service, so spec.inputs cannot be fetched: install the chart "
                    "with data.enabled (docs/data.md), or send small files inline in spec.files"), fields))
                return None
            return {}
        expires = credential_expiry(decision, POD_DEADLINE_MARGIN_SECONDS, self.now().timestamp())
        creator = recorded_creator(run)

        def same_creator(earlier: Mapping[str, Any]) -> bool:
            """Only while the API server guards the creators (else anyone could state another's name)."""
            theirs = recorded_creator(earlier)
            return (creator is not None and theirs is not None and theirs[0] == creator[0]
                    and self.identity.problem() is None)

        try:
            ensure = run["metadata"]["namespace"] not in self._data_routed
            prepared = self.data.prepare(run, spec, decision, expires,
                                         lambda ns, name: self.api.get_run(ns, name), same_creator,
                                         self.now().timestamp())
            if ensure and not ensure_data_route(self.api, run["metadata"]["namespace"], self.data.route()):
                self._data_routed.add(run["metadata"]["namespace"])
        except DATA_ERRORS as e:
            if not spec.inputs:
                log.warning("run %s: the data plane is unavailable (%s); its artifacts stay inline",
                            run["metadata"]["name"], str(e)[:300])
                return {}
            self._conclude(run, last, Outcome(Phase.FAILED, INPUT_UNAVAILABLE, (
                f"{str(e)[:300]}; the inputs cannot be fetched: try again later, or ask the platform team to repair "
                "the data service (docs/data.md)"), fields))
            return None
        if isinstance(prepared, InputProblem):
            self._conclude(run, last, Outcome(Phase.FAILED, prepared.reason, prepared.message, fields))
            return None
        if isinstance(prepared, UploadsAwaited):
            waited = (run.get("status") or {}).get("upload") or prepared.upload
            deadline = parse_time(waited.get("expires"))
            if deadline is None or self.now() >= deadline:
                names = ", ".join(f["path"] for f in prepared.upload["files"])
                self._conclude(run, last, Outcome(Phase.FAILED, INPUT_UNAVAILABLE, (
                    f"the upload of {names} did not come by {waited['expires']} (the policy's "
                    "data.uploadWaitSeconds): create the run again and upload its files"), fields))
                return None
            names = ", ".join(f"{f['path']} ({f['size']} bytes)" for f in prepared.upload["files"])
            self.writer.wait(run, decision, WAITING_FOR_UPLOAD,
                             f"waiting for the upload of {names}: PUT each to {prepared.upload['url']}/v1/uploads/"
                             "<sha256> with status.upload.token (the SDK and the CLI do it)", upload=waited)
            return None
        return prepared

    def _approved(self, run: Mapping[str, Any], decision: Decision) -> bool:
        """The supervisor pattern: approved-by lets the run go on, rejected-by ends it, each as the API server
        recorded who set it; until then, and while that record cannot be trusted, it waits with the decision
        recorded and a message that says why. An approval acted on is kept in status.approval."""
        if ((run.get("status") or {}).get("approval") or {}).get("approvedBy"):
            return True
        verdict = approval_verdict(run["metadata"].get("annotations") or {}, decision.policy.name,
                                   decision.policy.allow_self_approval, self.identity.problem())
        if verdict.rejected or verdict.refused:
            self.writer.finish(run, Outcome(Phase.REJECTED, Reason.REJECTED_BY_APPROVER if verdict.rejected
                                            else Reason.POLICY_DENIED, verdict.message,
                                            {**decision_fields(decision), "policyRule": "approval",
                                             "approval": verdict.record(rfc3339(self.now()))}))
            return False
        if not verdict.go:
            self.writer.wait(run, decision, Reason.AWAITING_APPROVAL, verdict.message)
            return False
        if self.writer.write(run, approved_status(verdict.record(rfc3339(self.now())))) is None:
            return False  # the run is gone
        self.writer.event(run, "Normal", Reason.APPROVED, f"approved by {shown_identity(verdict.approver)}")
        return True

    def _slot_free(self, run: Mapping[str, Any], decision: Decision) -> bool:
        """Runs of the same policy with a sandbox, plus those queued before this one, against maxConcurrentRuns:
        waiting runs start in creation order. Runs in a session are not counted: they wait in their session's
        own queue, in its pod."""
        meta, policy = run["metadata"], decision.policy
        list_runs_once(self.api, self.store, meta["namespace"])
        ahead = 0
        for other in self.store.unfinished_in(meta["namespace"]):
            status = other.get("status") or {}
            if other["metadata"]["uid"] == meta["uid"] or (other.get("spec") or {}).get("session"):
                continue
            if not status and _created_before(other, run):
                ahead += 1  # created earlier, not looked at yet (events of a burst arrive in any order): it goes first
                continue
            if status.get("policy") != policy.name:
                continue
            if status.get("podName") or (status.get("reason") == Reason.QUEUED and _created_before(other, run)):
                ahead += 1
        if policy.max_concurrent_runs is None or ahead < policy.max_concurrent_runs:
            return True
        # (no position in the words: it would cost a write per finish)
        self.writer.wait(run, decision, Reason.QUEUED,
                         f"policy {policy.name!r} allows {policy.max_concurrent_runs} concurrent runs in this "
                         "namespace; this one starts when a slot frees, in creation order")
        return False

    def _answer_from_cache(self, run: Mapping[str, Any], spec: CodeRunSpec, ttl_seconds: int, decision: Decision,
                           digest: str, key: str) -> bool:
        """A finished run with the same inputs and decision within the TTL answers this one: no pod at all. The
        store keeps finished runs slim, so the one picked is read whole from the API server (one GET)."""
        meta, now = run["metadata"], self.now()
        candidates = (r for r in self.store.finished_in(meta["namespace"], key)
                      if r["metadata"]["uid"] != meta["uid"])
        picked = pick_reusable(candidates, key, ttl_seconds, now)
        if picked is None:
            return False
        source = self.api.get_run(meta["namespace"], picked["metadata"]["name"])
        if source is None or not is_same_source(source, picked, key):
            return False  # gone or replaced since: run for real
        try:
            artifacts = copy_artifacts(self.api, run, source)
        except ArtifactsConflict:
            return False  # run for real; collection then reports the conflict with the program's own result
        if artifacts is None:
            return False  # the earlier run's artifacts are gone or not genuine: run again rather than answer wrong
        outcome = reused_outcome(source, spec, decision, digest, artifacts,
                                 redactor(decision.policy, self.store.policies(meta["namespace"])), now
                                 ).with_fields(cacheKey=key)
        if self.writer.finish(run, outcome) is not None:
            metrics.CACHE_HITS.labels(metrics.language_label(spec.language)).inc()
        return True

    # ------------------------------------------------------------------ finish
    def _finish_collected(self, run: Mapping[str, Any], placement: Placement, collected: Collected) -> None:
        """Store artifacts and the audit record, write the status, let the sandbox go, in that order (a crash in
        between is repaired). A frame that proves the program never ran there places the run anew."""
        if isinstance(placement.vet(run, collected), Again):
            self._place_again(run)  # (never finished from this frame: its program did not run there)
            return
        meta, status = run["metadata"], run.get("status") or {}
        ns, pod, frame = meta["namespace"], collected.pod, collected.frame
        spec, decision = self._decide(run)
        policy = decision.policy if isinstance(decision, Decision) else None
        effective = decision.limits if isinstance(decision, Decision) else None
        redact = redactor(policy, self.store.policies(ns))
        answer = ask_agent(self.audit, run, pod, placement.keeps_state(run))
        if isinstance(frame, FrameError):
            outcome = eviction(pod, effective) or outcome_without_frame(
                str(frame), frame.truncated, container_status(pod), effective, oom_evidence(collected, answer))
        else:
            inline = [a for a in frame.artifacts if not a.stored]
            try:
                artifacts, skipped, conflict = *store_artifacts(self.api, run, inline), None
            except ArtifactsConflict as e:
                artifacts, skipped, conflict = [], [], e
            stored, unvouched = self._stored_artifacts(run, [a for a in frame.artifacts if a.stored])
            assert spec is not None  # a run whose spec does not parse is refused before it has a sandbox
            outcome = outcome_from_frame(spec, frame, redact, oom_evidence(collected, answer), effective,
                                         parse_time(status.get("startTime")), artifacts + stored,
                                         [s.model_dump() for s in frame.artifactsSkipped] + skipped + unvouched)
            outcome = self._with_data(run, spec, frame, outcome, stored)
            if conflict:
                outcome = replace(outcome, phase=Phase.FAILED, reason=Reason.NAME_CONFLICT, message=str(conflict))
        outcome = audited(self.api, answer, run, outcome, redact)
        image = image_with_digest(pod, status.get("image") or "")
        # a shared sandbox's result depends on the runs before it: never a cache's answer
        key = cache_key(spec, decision, image_digest(image)) if isinstance(decision, Decision) and spec and \
            not placement.shares_sandbox and not spec.inputs and \
            not any(a.get("stored") for a in outcome.fields.get("artifacts") or ()) else None
        outcome = outcome.with_fields(
            image=image, metrics={**(status.get("metrics") or {}), **(outcome.fields.get("metrics") or {})},
            cacheKey=key)
        written = self._finish(run, outcome)
        if key and written and is_reusable(written):
            labelled = self.api.label_run(ns, meta["name"], {CACHE_LABEL: label_value(key)})
            if labelled is not None:
                self.store.put_run(labelled)
        placement.release(run, pod["metadata"]["name"])

    def _stored_artifacts(self, run: Mapping[str, Any], reported: list[FrameArtifact]
                          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The artifacts the runner put in the store, each listed only once the store holds what it said (size,
        and the sha256 the data service computed as the bytes came); the others are skipped ("corrupt")."""
        listed: list[dict[str, Any]] = []
        skipped: list[dict[str, Any]] = []
        for artifact in reported:
            entry = {"name": artifact.name, "size": artifact.size, "sha256": artifact.sha256}
            if artifact_name_problem(artifact.name):  # never a key the data service would have taken
                skipped.append({"name": artifact.name, "why": "corrupt"})
                continue
            try:
                vouched = self.data is not None and self.data.verify_stored(run, entry)
            except DATA_ERRORS as e:  # the store away: the artifact cannot be vouched for
                log.warning("run %s: artifact %s not checked in the store: %s", run["metadata"]["name"],
                            artifact.name, str(e)[:200])
                vouched = False
            (listed if vouched else skipped).append({**entry, "stored": True} if vouched else
                                                    {"name": artifact.name, "why": "corrupt"})
        return listed, skipped

    def _with_data(self, run: Mapping[str, Any], spec: CodeRunSpec, frame: RunnerFrame, outcome: Outcome,
                   stored: list[dict[str, Any]]) -> Outcome:
        """The inputs as laid out (checked against their pins once more), why the program did not start when an
        input failed, and the grant that reads the stored artifacts until the run expires."""
        fields: dict[str, Any] = {}
        sources = {i.path: i.source() for i in spec.inputs or ()}
        if frame.inputs:
            fields["inputs"] = [{"path": i.path, "source": sources.get(i.path, "?"), "size": i.size,
                                 "sha256": i.sha256} for i in frame.inputs if i.path in sources]
        if frame.inputError is not None:
            failed = frame.inputError
            reason = failed.reason if failed.reason in INPUT_REASONS else INPUT_UNAVAILABLE
            outcome = replace(outcome, phase=Phase.FAILED, reason=reason,
                              message=f"input {failed.path}: {failed.message or reason}; the program did not run")
        if stored and self.data is not None:
            # The run is about to finish now: it expires its ttlSecondsAfterFinished later, its stored artifacts
            # then or at the policy's artifactTTLSeconds if sooner; the grant says until when (the sweep reads it).
            ttl = ttl_seconds(run, self.store.policies(run["metadata"]["namespace"]))
            _, decision = self._decide(run)
            artifact_ttl = decision.policy.data.artifact_ttl_seconds if isinstance(decision, Decision) else None
            keep = min(ttl, artifact_ttl) if artifact_ttl else ttl
            try:
                grant = self.data.read_grant(run, stored, int(self.now().timestamp()) + keep)
            except DATA_ERRORS as e:  # the grant is a convenience: the artifacts stay listed
                log.warning("run %s: no data grant: %s", run["metadata"]["name"], str(e)[:200])
                grant = None
            if grant:
                fields["dataGrant"] = grant
        return outcome.with_fields(**fields) if fields else outcome

    def _finish(self, run: Mapping[str, Any], outcome: Outcome) -> dict[str, Any] | None:
        """The end of a run that had a sandbox: through the egress proxy, its credential revoked and its requests
        in its status and its log ConfigMap (results/network.py), then the terminal status."""
        _, decision = self._decide(run)
        had_sandbox = bool((run.get("status") or {}).get("startMode"))  # not one refused before it started
        if self.proxy is not None and had_sandbox and isinstance(decision, Decision) and \
                uses_proxy(decision.policy.egress):
            outcome = self._with_network(self.proxy, run, decision, outcome)
        return self.writer.finish(run, outcome)

    def _with_network(self, proxy: EgressProxy, run: Mapping[str, Any], decision: Decision,
                      outcome: Outcome) -> Outcome:
        """Revoke first (a program's children may outlive it for a moment), then what every proxy pod logged."""
        expires = credential_expiry(decision, POD_DEADLINE_MARGIN_SECONDS, self.now().timestamp())
        try:
            answers, complete = proxy.end_run(run["metadata"]["uid"], expires)
        except ProxyUnavailable as e:
            log.warning("run %s: %s; its requests are not in its status", run["metadata"]["name"], e)
            answers, complete = [], False
        records = merged(answers)
        text, truncated = log_text(records)
        log_name = store_network_log(self.api, run, text) if records else None
        summary = summarise(answers, complete, log_name, truncated,
                            ((run.get("status") or {}).get("network") or {}).get("proxyPod"))
        return with_network(outcome, summary, decision.policy.egress_budget, decision.policy.name)

    # ------------------------------------------------------------------ bookkeeping
    def _start_queued(self) -> None:
        """A run finished: queued runs of its namespace may start now, oldest first (not under any run lock,
        so two finishing runs never wait on each other)."""
        self._freed.drain(self._start_queued_in)

    def _start_queued_in(self, namespace: str) -> None:
        # (a session's queued runs wait for their session, not for a slot: its after_run moves them)
        waiting = [r for r in self.store.unfinished_in(namespace)
                   if (r.get("status") or {}).get("reason") == Reason.QUEUED and not (r.get("spec") or {}).get(
                       "session")]
        full: set[str] = set()  # policies whose oldest waiting run found no slot: the younger ones wait too
        for run in sorted(waiting, key=_creation_order):
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

    def _due(self, uid: str, run: Mapping[str, Any]) -> bool:
        """Work the clock brings: a retry, an admission not done yet, a pod that must start within its deadline,
        a warm pod's input or Running status (warm/claim.py times both), a session run with no stream to bring its
        frame (the sandbox's log or end will), an approval given but not yet believed (its admission policy is
        checked again once the check's cache expires; no event says it was repaired)."""
        status = run.get("status") or {}
        return (uid in self._failures or uid in self._retrying or not status.get("phase")
                or (bool(status.get("podName")) and self._placement_of(run).due(run))
                or status.get("reason") == WAITING_FOR_UPLOAD  # its uploads are looked for in the store
                or (status.get("reason") == Reason.AWAITING_APPROVAL
                    and APPROVED_BY in (run["metadata"].get("annotations") or {})))

    def _note_digest(self, pod: Mapping[str, Any]) -> None:
        for container in (pod.get("status") or {}).get("containerStatuses") or ():
            image, image_id = container.get("image") or "", container.get("imageID") or ""
            if "sha256:" in image_id and "@" not in image:
                self.seen_digests[image] = image_id[image_id.rindex("sha256:"):]

    def _node_images(self) -> list[Mapping[str, Any]]:
        """What the nodes say they hold (repo digests on a registry-backed cluster), then the digest of the image
        last seen on a sandbox pod, for images imported without a repo digest."""
        images = [image for node in self.api.nodes() for image in (node.get("status") or {}).get("images") or ()]
        return images + [{"names": [tag, f"{tag.rsplit(':', 1)[0]}@{digest}"]}
                         for tag, digest in self.seen_digests.items()]

    def _lock(self, uid: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks[uid]

    def _namespace_lock(self, namespace: str) -> threading.Lock:
        with self._locks_guard:
            return self._namespace_locks[namespace]

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
            self.writer.finish(run, Outcome(Phase.FAILED, Reason.INTERNAL_ERROR,
                                            f"the operator could not process this run ({type(error).__name__}: "
                                            f"{str(error)[:300]}); this is a coderun bug, please report it"))
        except Exception as e:  # noqa: BLE001
            log.error("run %s: could not record the failure: %s: %s", run["metadata"].get("name"),
                      type(e).__name__, str(e)[:300])

    def _expire(self, run: Mapping[str, Any]) -> None:
        meta = run["metadata"]
        try:
            self.api.delete_run(meta["namespace"], meta["name"], meta["uid"])
        except real_k8s.Transient:
            self.store.expire_at(self.now() + timedelta(seconds=EXPIRY_RETRY_SECONDS), meta["uid"])
            raise
        log.info("run %s/%s deleted after its ttlSecondsAfterFinished", meta["namespace"], meta["name"])


def _creation_order(run: Mapping[str, Any]) -> tuple[str, str]:
    return run["metadata"].get("creationTimestamp") or "", run["metadata"]["name"]


def _created_before(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return _creation_order(a) < _creation_order(b)
