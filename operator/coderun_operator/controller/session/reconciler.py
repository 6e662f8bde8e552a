"""A CodeRunSession's own lifecycle (docs/sessions.md), keepState false: admit a session (its policy allows it,
caps, maxSessions), create its sandbox pod, keep its status (results/session.compute_session_status) and end it
(idle, lifetime, pod lost, OOM, policy removed) on events and the controller's tick. It knows the session's runs only
as the store holds them; the runs' side (`runs.py`) reads the sessions and their pods in the `SessionBook` they
share. The runs a change of a session may move are queued in `woken`, which the controller drains outside every
run lock.

A session's key is derived from one key the operator keeps in a Secret of its own namespace (HMAC of the
session's uid): nothing per session to create or delete, and a restarted operator derives it again.
"""
from __future__ import annotations

import collections
import logging
from datetime import datetime
from typing import Any, Callable, Mapping, Protocol, Sequence

from pydantic import ValidationError

from coderun.api.coderunsession import CodeRunSessionSpec
from coderun.api.models import EgressRule
from coderun.api.reasons import SessionPhase, SessionReason
from ...kube_api import KubeApi
from ...builders.names import LABEL_SESSION_UID
from ...builders.ownership import controlled_by
from ...builders.session import build_session_network_policy, build_session_pod, session_inputs_room
from ...key_secret import ensure_key, read_key
from ...policy import Decision, Denial, Policy
from ...policy.evaluate import needs_use_permission, select_policy
from ...policy.session import session_verdict
from ...proxy import EgressProxy, ProxyUnavailable, access_for, cannot_start
from ...builders.egress import ProxyRoute
from ...results.lifecycle import session_expiry_time
from ...results.session import (admitted_status, compute_session_status, ended_status, reserved_sequence,
                                runs_in_order, start_failure)
from ...results.status import decision_fields
from ..children import ensure_namespace_default_deny, ensure_network_policy
from ..identity import IdentityGuard, creator_may_use
from ..store import Store
from ..workqueue import WorkQueue
from ..writer import StatusWriter, to_wire
from .book import SessionBook

log = logging.getLogger("coderun")

KEY_SECRET = "coderun-session-key"
KEY_ENTRY = "key"


class WarmPods(Protocol):
    """The warm pool as a session sees it (warm.Claims; the two parts of the controller import neither the other)."""

    def claim_for_session(self, session: Mapping[str, Any], decision: Decision,
                          lifetime_seconds: int) -> dict[str, Any] | None: ...


class SessionReconciler:
    def __init__(self, book: SessionBook, api: KubeApi, store: Store, writer: StatusWriter,
                 clock: Callable[[], datetime], key_namespace: str, identity: IdentityGuard,
                 proxy: EgressProxy | None = None, claims: WarmPods | None = None):
        self.book = book
        self.api, self.store, self.writer, self.now = api, store, writer, clock
        # a warm pool pod for a session (warm.Claims.claim_for_session): the pod as claimed, or None
        self._claims = claims
        self.proxy = proxy  # the egress proxy, for sessions of a policy with host rules
        self.key_namespace = key_namespace
        # Runs a change of their session may move: the controller reconciles them (it drains this after each
        # event and step), so the sessions' side never calls into it.
        self.woken: WorkQueue[str] = WorkQueue()
        # who created a session and its runs, and whether the API server's record of it can be trusted now
        self.identity = identity
        self._master: bytes | None = None  # master_key
        self._routes: dict[str, object] = {}  # session uid -> the routes its NetworkPolicy was last made to hold
        # session uid -> the resourceVersions of the operator's own last status writes, newest last: the watch's
        # echo of an older one is stale (the held status is newer) and must not be written back over it
        self._written: dict[str, collections.deque[str]] = {}

    # ------------------------------------------------------------------ events
    def on_session(self, session: Mapping[str, Any], deleted: bool, ensure_policies: Callable[[], None]) -> None:
        meta = session["metadata"]
        with self.book.lock:
            if deleted:
                self.book.forget(meta["namespace"], meta["name"], meta["uid"])
                self._routes.pop(meta["uid"], None)
                self._written.pop(meta["uid"], None)
            elif self._stale_echo(meta):
                return
            else:
                self.book.sessions[(meta["namespace"], meta["name"])] = held = _newest_count(
                    dict(session), self.book.sessions.get((meta["namespace"], meta["name"])))
                # The echo of its own last write while a run is in the sandbox says nothing new: a refresh would
                # write Busy for a run that is about to end (BUSY_AFTER_SECONDS writes it for one that lasts).
                if not (self._own_last_write(meta) and meta["uid"] in self.book.sending):
                    self.refresh(dict(held), ensure_policies)
        self._wake(self._runs_to_wake(meta["namespace"], meta["name"]))

    def on_pod(self, pod: Mapping[str, Any], deleted: bool, ensure_policies: Callable[[], None]) -> bool:
        """A session pod's event (False: not a session pod)."""
        uid = (pod["metadata"].get("labels") or {}).get(LABEL_SESSION_UID)
        if uid is None:
            return False
        with self.book.lock:
            session = next((s for s in self.book.sessions.values() if s["metadata"]["uid"] == uid), None)
            named = ((session or {}).get("status") or {}).get("podName")
            if named and named != pod["metadata"]["name"]:
                log.info("pod %s/%s carries session %s's label but is not its sandbox (%s); ignored",
                         pod["metadata"]["namespace"], pod["metadata"]["name"], uid, named)
                return True
            if deleted:
                self.book.pods.pop(uid, None)
                self.book.close_channel(uid)
            else:
                self.book.pods[uid] = dict(pod)
            if session is not None:
                self.refresh(session, ensure_policies)
        if session is not None:
            self._wake(self._runs_to_wake(session["metadata"]["namespace"], session["metadata"]["name"]))
        return True

    def tick(self, ensure_policies: Callable[[], None]) -> None:
        """The clocks (idle, lifetime) and the policy, for every live session; an ended one is deleted once its
        policy's ttlSecondsAfterFinished has passed."""
        for channel in list(self.book.channels.values()):  # outside the lock: closing is I/O
            channel.close_if_idle()
        with self.book.lock:
            for session in list(self.book.sessions.values()):
                try:
                    if (session.get("status") or {}).get("phase") != SessionPhase.ENDED:
                        self.refresh(session, ensure_policies)
                    else:
                        self.expire(session, ensure_policies)
                except Exception as e:  # noqa: BLE001 - one session's trouble must not stop the others' clocks
                    log.warning("session %s: %s: %s; will retry", session["metadata"]["name"],
                                type(e).__name__, str(e)[:300])

    def expire(self, session: Mapping[str, Any], ensure_policies: Callable[[], None]) -> None:
        """Deleted once its policy's TTL has passed, and never while a run of it is unfinished: a run whose frame
        is held for the container's end (an OOM kill's evidence) must end with its own reason, not PodDeleted."""
        meta = session["metadata"]
        ensure_policies()  # after a restart the policy's TTL, not the built-in one
        expires = session_expiry_time(session, self.store.policies(meta["namespace"]))
        if (expires is None or expires > self.now() or meta.get("deletionTimestamp")
                or self.waiting_runs(meta["namespace"], meta["name"])):
            return
        self.api.delete_session(meta["namespace"], meta["name"], meta["uid"])
        log.info("session %s/%s deleted after its policy's ttlSecondsAfterFinished", meta["namespace"], meta["name"])

    # ------------------------------------------------------------------ the session
    def refresh(self, session: dict[str, Any], ensure_policies: Callable[[], None]) -> None:
        status = session.get("status") or {}
        if status.get("phase") == SessionPhase.ENDED:
            self.delete_pod(session)
            return
        ensure_policies()  # after a restart the sessions' events may come before the policies'
        if not status.get("podName"):
            self.admit(session)
            return
        policy = self.store.policies(session["metadata"]["namespace"]).get(status.get("policy") or "")
        if not isinstance(policy, Policy) or policy.sessions is None or not policy.sessions.allowed:
            self.end(session, SessionReason.POLICY_REMOVED, f"policy {status.get('policy')!r} was deleted or no "
                     "longer allows sessions; create a new session under a policy that does")
            return
        pod = self.pod_of(session)
        failed = start_failure(session, pod, self.now(), policy.start_deadline_seconds, self.api.nodes)
        if failed:
            self.end(session, SessionReason.START_FAILED, f"{failed}; create a new session")
            return
        new = compute_session_status(session, pod, self.runs_of(session), self.now(),
                                     self.book.sending.get(session["metadata"]["uid"]), policy.start_deadline_seconds)
        if new is None:
            return
        wire = to_wire(new)
        wire.pop("documentsReserved", None)  # only _send moves it (a stale event may hold an old one)
        if any(status.get(k) != v for k, v in wire.items() if k not in ("conditions",)) or \
                _condition_states(status) != _condition_states(wire):
            self.write(session, wire)
        if wire.get("phase") == SessionPhase.ENDED:
            self.delete_pod(session)

    def pod_of(self, session: Mapping[str, Any]) -> dict[str, Any] | None:
        """The session's pod as the watch delivered it; else as the API server has it. A session event can come
        before its pod's (just created, or every object again after an operator restart): absence from the
        watch alone is no proof that the pod is gone, and a session must not end on it."""
        uid = session["metadata"]["uid"]
        pod = self.book.pods.get(uid)
        if pod is None:
            pod = self.api.get_pod(session["metadata"]["namespace"], session["status"]["podName"])
            if pod is not None and (pod["metadata"].get("labels") or {}).get(LABEL_SESSION_UID) == uid:
                self.book.pods[uid] = pod
            else:
                pod = None
        return pod

    def admit(self, session: dict[str, Any]) -> None:
        meta, now = session["metadata"], self.now()
        try:
            spec = CodeRunSessionSpec.model_validate(session.get("spec") or {})
        except ValidationError as e:
            first = e.errors()[0]
            self.end(session, SessionReason.INVALID_SPEC,
                     f"spec.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"[:1024])
            return
        policy = select_policy(spec.policy_ref, self.store.policies(meta["namespace"]))
        if isinstance(policy, Denial):
            self.end(session, SessionReason.POLICY_DENIED, policy.message)
            return
        refused = creator_may_use(self.api, self.identity, session)(spec.policy_ref) \
            if needs_use_permission(spec.policy_ref) else None
        if refused is not None:  # as for a run: naming a policy other than default takes the verb use
            self.end(session, SessionReason.POLICY_DENIED, refused.message)
            return
        if policy.approval_required():
            self.end(session, SessionReason.POLICY_DENIED, f"policy {policy.name!r} requires a person's approval "
                     "of each run, which sessions do not offer yet; run without a session, or under a policy "
                     "without approval")
            return
        alive = sum(1 for s in self.book.sessions.values()
                    if s["metadata"]["namespace"] == meta["namespace"] and s["metadata"]["uid"] != meta["uid"]
                    and (s.get("status") or {}).get("podName") and (s.get("status") or {}).get("policy") == policy.name
                    and (s.get("status") or {}).get("phase") != SessionPhase.ENDED)
        verdict = session_verdict(spec, policy, alive)
        if isinstance(verdict, Denial):
            self.end(session, verdict.reason, verdict.message,
                     {"policy": verdict.policy, "policyDigest": verdict.policy_digest})
            return
        try:
            access = access_for(self.proxy, policy.egress)
        except ProxyUnavailable as e:
            self.end(session, SessionReason.START_FAILED, cannot_start(e, policy.name, "this session"))
            return
        ensure_key(self.api, self.key_namespace, KEY_SECRET, KEY_ENTRY, "the sessions' key")
        ensure_namespace_default_deny(self.api, meta["namespace"])
        pod = build_session_pod(session, verdict.decision, verdict.max_lifetime_seconds)
        try:
            # its routes before its pod, as a cold run's (the namespace's deny-all until then)
            taken = self.ensure_routes(session, policy.egress, access.route if access else None)
            if taken:
                self.end(session, SessionReason.START_FAILED, taken)
                return
            existing = self.kept_or_warm_pod(session, verdict.decision, verdict.max_lifetime_seconds) or \
                self.api.create_or_get(pod)
        except self.api.Refused as refused:
            self.end(session, SessionReason.START_FAILED, f"{refused}; the namespace's quota or admission policy "
                     "must allow the session's sandbox")
            return
        if existing is not None and (existing["metadata"].get("labels") or {}).get(LABEL_SESSION_UID) != meta["uid"]:
            self.end(session, SessionReason.START_FAILED, f"a pod named {pod['metadata']['name']} exists and is not "
                     "this session's; delete it or name the session differently")
            return
        sandbox = existing or pod
        self.book.pods.setdefault(meta["uid"], sandbox)  # until the watch brings it (see pod_of)
        fields = {k: v for k, v in decision_fields(verdict.decision).items() if k != "decision"
                  and k != "runtimeClass"}
        self.write(session, to_wire(admitted_status(session, fields, sandbox["metadata"]["name"],
                                                     verdict.idle_timeout_seconds, verdict.max_lifetime_seconds, now,
                                                     warm=sandbox["metadata"]["name"] != pod["metadata"]["name"])))

    def kept_or_warm_pod(self, session: Mapping[str, Any], decision: Decision,
                          lifetime_seconds: int) -> dict[str, Any] | None:
        """The session's pod when none need be created: one already its own (made or claimed for it before an
        operator restart lost the status write), else a warm pool pod claimed now."""
        uid = session["metadata"]["uid"]
        held = self.book.pods.get(uid)
        if held is None or held["metadata"].get("deletionTimestamp"):
            # asked of the API server, not only the watch: after a restart the session's event may come first
            held = next((p for p in self.api.list_pods(session["metadata"]["namespace"], {LABEL_SESSION_UID: uid})
                         if not p["metadata"].get("deletionTimestamp")), None)
        # a pool pod has no room for inputs: a session whose policy keeps room for them gets a pod of its own
        if held is None and self._claims is not None and not session_inputs_room(decision):
            held = self._claims.claim_for_session(session, decision, lifetime_seconds)
        if held is not None:
            self.book.pods[uid] = held
        return held

    def ensure_routes(self, session: Mapping[str, Any], egress: Sequence[EgressRule],
                       proxy_route: ProxyRoute | None) -> str | None:
        """The session pod's NetworkPolicy holding the routes of its policy as it is now (made at the session's
        admission, brought up to date at a run's start when the policy's egress changed since: a policy tightened
        after an incident reaches live sessions too); why it cannot be, when its name is taken by another's."""
        wanted = build_session_network_policy(session, egress, proxy_route)
        uid = session["metadata"]["uid"]
        if self._routes.get(uid) == wanted["spec"]:
            return None
        taken = ensure_network_policy(
            self.api, wanted, lambda existing: controlled_by(existing, uid),
            lambda existing: (f"a NetworkPolicy named {wanted['metadata']['name']} exists and is not this session's; "
                              "delete it or name the session differently"))
        if taken is None:
            self._routes[uid] = wanted["spec"]
        return taken

    def end(self, session: dict[str, Any], reason: str, message: str, fields: Mapping[str, Any] | None = None) -> None:
        self.write(session, to_wire(ended_status(session, reason, message, self.now(), fields)))
        self.delete_pod(session)

    def delete_pod(self, session: Mapping[str, Any]) -> None:
        self.book.close_channel(session["metadata"]["uid"])
        pod = self.book.pods.get(session["metadata"]["uid"])
        if pod is not None and not pod["metadata"].get("deletionTimestamp"):
            self.api.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])

    def _stale_echo(self, meta: Mapping[str, Any]) -> bool:
        """The event brings the session as one of this operator's own status writes left it, and a later write
        of its own has been answered since."""
        written = self._written.get(meta["uid"])
        if not written:
            return False
        return meta.get("resourceVersion") in written and meta["resourceVersion"] != written[-1]

    def _own_last_write(self, meta: Mapping[str, Any]) -> bool:
        written = self._written.get(meta["uid"])
        return bool(written) and written is not None and meta.get("resourceVersion") == written[-1]

    def write(self, session: dict[str, Any], wire: dict[str, Any]) -> dict[str, Any] | None:
        meta = session["metadata"]
        written = self.api.patch_session_status(meta["namespace"], meta["name"], wire)
        if written is not None:
            version = written["metadata"].get("resourceVersion")
            if version:
                self._written.setdefault(meta["uid"], collections.deque(maxlen=16)).append(version)
            self.book.sessions[(meta["namespace"], meta["name"])] = written
            session.update(written)  # the caller's copy too; never emptied on the way (it is read without a lock)
        return written

    def runs_of(self, session: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The session's runs in the store: unfinished ones, and the finished runs that went through it."""
        meta = session["metadata"]
        unfinished = [r for r in self.store.unfinished_in(meta["namespace"])
                      if (r.get("spec") or {}).get("session") == meta["name"]]
        return unfinished + self.store.finished_runs_of(meta["namespace"], meta["name"])

    def wake_queue(self, run: Mapping[str, Any]) -> None:
        """The runs the end of this one (finished, gone, or never started) may move."""
        self._wake(self._runs_to_wake(run["metadata"]["namespace"], run["spec"]["session"]))

    def _wake(self, uids: list[str]) -> None:
        for uid in uids:
            self.woken.add(uid)

    def _runs_to_wake(self, namespace: str, name: str) -> list[str]:
        """The runs a change of the session may move: the first in its queue while it lives (the others wait
        their turn, their status written once: looking at all 80 of a harness's queued runs at each of the
        session's events made each run's end cost the operator ~80 steps); every one once it has ended or is
        gone (each is refused, saying why)."""
        waiting = self.waiting_runs(namespace, name)
        session = self.book.sessions.get((namespace, name))
        if session is None or (session.get("status") or {}).get("phase") == SessionPhase.ENDED:
            return waiting
        return waiting[:1]

    def waiting_runs(self, namespace: str, name: str) -> list[str]:
        return [r["metadata"]["uid"] for r in runs_in_order(
            r for r in self.store.unfinished_in(namespace) if (r.get("spec") or {}).get("session") == name)]

    def session_of(self, run: Mapping[str, Any]) -> dict[str, Any] | None:
        ns, name = run["metadata"]["namespace"], run["spec"]["session"]
        # read without the lock (one dict lookup): it is held across the session's status writes, and every
        # run's step begins here
        held = self.book.sessions.get((ns, name))
        if held is None:
            held = self.api.get_session(ns, name)
            if held is not None:
                with self.book.lock:
                    self.book.sessions.setdefault((ns, name), held)
        return held

    def master_key(self) -> bytes:
        """The operator's key for sessions, read once (it never changes: a new one would orphan every session)."""
        if self._master is None:
            self._master = read_key(self.api, self.key_namespace, KEY_SECRET, KEY_ENTRY) or None
            if self._master is None:
                raise self.api.Transient("the sessions' key Secret cannot be read yet")
        return self._master



def _newest_count(event: dict[str, Any], held: Mapping[str, Any] | None) -> dict[str, Any]:
    """The session as an event brings it, keeping the higher documentsReserved of the event's and the one held:
    the number only grows, and an event older than the operator's own last write must not take it back (a number
    used twice would be refused by the runner as a replay)."""
    if held is None or held["metadata"].get("uid") != event["metadata"].get("uid"):
        return event
    kept = reserved_sequence(held.get("status") or {})
    if kept > reserved_sequence(event.get("status") or {}):
        event = {**event, "status": {**(event.get("status") or {}), "documentsReserved": kept}}
    return event


def _condition_states(status: Mapping[str, Any]) -> set[tuple[str, str]]:
    return {(c.get("type"), c.get("status")) for c in status.get("conditions") or ()}
