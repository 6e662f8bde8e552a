"""CodeRunSessions (docs/sessions.md), keepState false: admit a session (its policy allows it, caps, maxSessions),
create its sandbox pod, keep its status (results/session.compute_session_status) and end it (idle, lifetime, pod
lost, OOM, policy removed) on events and the controller's tick; and take a run naming a session through it, one at
a time in creation order: its document (MAC'd under the session's key, a fresh nonce) over the session's
attach (controller/attach.Channel, kept open from run to run), its frame handed back to the controller's finish
(`hand_back`, the one call into the controller). The runs a change of a session may move are queued in `woken`,
which the controller drains outside every run lock; `placement.py` is the run-side seam the controller sees.

A session's key is derived from one key the operator keeps in a Secret of its own namespace (HMAC of the
session's uid): nothing per session to create or delete, and a restarted operator derives it again.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import hmac
import logging
import math
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping, Protocol, Sequence

from pydantic import ValidationError

from coderun.api.coderunsession import CodeRunSessionSpec
from coderun.api.identity import CREATED_BY
from coderun.api.models import CodeRunSpec, EgressRule, ResourceLimits
from coderun.api.reasons import Phase, Reason, SessionPhase, SessionReason
from coderun.sandbox.runner.protocol import FRAME_PREFIX, accepted_line
from ...kube_api import KubeApi
from ...builders import code_hash
from ...builders.names import CONTAINER_NAME, LABEL_SESSION_UID
from ...builders.objects import POD_DEADLINE_MARGIN_SECONDS
from ...builders.ownership import controlled_by
from ...builders.session import build_session_network_policy, build_session_pod, session_document
from ...key_secret import ensure_key, read_key
from ...policy import Decision, Denial, Policy
from ...policy.decide import parse_spec
from ...policy.evaluate import needs_use_permission, select_policy
from ...policy.session import run_in_session, session_verdict
from ...proxy import EgressProxy, ProxyUnavailable, access_for, cannot_start
from ...builders.egress import EgressAccess, ProxyRoute
from ...results.frame import FrameError, RunnerFrame, logged_frame, parse_streamed_frame
from ...results.lifecycle import session_expiry_time
from ...results.session import (admitted_status, busy_fields, compute_session_status, ended_status,
                               in_session, reserved_sequence, runs_in_order, start_failure)
from ...results.status import (Outcome, decision_fields, parse_time, refusal_fields, started_in_session_status,
                               unplaced_status)
from ..children import ensure_namespace_default_deny, ensure_network_policy, input_configmap
from ..placement import Admitted
from ..identity import IdentityGuard, creator_may_use
from ..store import Store, list_runs_once
from ..workqueue import WorkQueue
from ..writer import StatusWriter, to_wire
from ..attach import STREAM_LIMIT_BYTES, Channel

log = logging.getLogger("coderun")

KEY_SECRET = "coderun-session-key"
KEY_ENTRY = "key"

# What the controller does with a session run's stream: (run uid, pod name, sent, stream text, nonce).
SessionReply = Callable[[str, str, bool, str, str], None]
# How long a frame killed by an unsent SIGKILL waits for the container's end to say whether memory ran out.
KILL_EVIDENCE_SECONDS = 30.0
# A sandbox's log since a run started: its acceptance line and frame, and an earlier run's frame ended within the
# same second or two (the log's clock is the kubelet's, in whole seconds); each frame within the stream's cap.
SANDBOX_LOG_LIMIT_BYTES = 2 * STREAM_LIMIT_BYTES
LOG_CLOCK_SLACK_SECONDS = 2
LOG_READ_SECONDS = 5  # per read: a slow kubelet must not hold the tick
# Attaches in a row that sent nothing before the session is given up (its pod cannot be reached).
MAX_ATTACH_FAILURES = 3
# Documents' sequence numbers are reserved in the session's status this many at a time, so a run's start writes
# the session only once in so many runs (a restarted operator skips what was reserved and not used: the runner
# takes any number past the last it read).
SEQUENCE_BLOCK = 64
# A run still in the sandbox this long after its document went writes its session Busy. A shorter run leaves the
# session's status as it was (Ready) until the write after it: the status's words cost the run no time, and a
# harness's short runs back to back no write each.
BUSY_AFTER_SECONDS = 0.25


class WarmPods(Protocol):
    """The warm pool as a session sees it (warm.Claims; the two parts of the controller import neither the other)."""

    def claim_for_session(self, session: Mapping[str, Any], decision: Decision,
                          lifetime_seconds: int) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class HeldFrame:
    """A run's frame finished once the sandbox's end says how it died: `oom_killed` from the container's state."""
    frame: RunnerFrame
    oom_killed: bool


def session_key(master: bytes, session_uid: str) -> bytes:
    """The session's own key: only the operator (who holds the master key) and the session's runner know it."""
    return hmac.new(master, b"coderun-session\0" + session_uid.encode(), hashlib.sha256).digest()


def run_nonce(master: bytes, run_uid: str, started: str) -> str:
    """The nonce a run's frame must carry: only the operator and the runner it is sent to know it, an operator
    that restarted while the run was in the sandbox can work it out again to find the frame in the pod's log, and
    each send of the run has its own (the start its status records is written anew before each)."""
    return hmac.new(master, b"coderun-run-nonce\0" + run_uid.encode() + b"\0" + started.encode(),
                    hashlib.sha256).hexdigest()


def frame_with(nonce: str) -> Callable[[bytes], bool]:
    """Read the stream until a whole frame line carrying this run's nonce, or carrying none: the runner's answer to
    a document it dropped (a MAC not under the key it holds: someone else's session settings reached its stdin
    first), so this run's will never come. A frame with another nonce (an earlier run's, late) is read past."""
    marker = f'"nonce":"{nonce}"'.encode()

    def done(received: bytes) -> bool:
        at = received.rfind(b"\n" + FRAME_PREFIX.encode())
        end = received.find(b"\n", at + 1) if at >= 0 else -1
        return end >= 0 and (marker in received[at:end] or b'"nonce":' not in received[at:end])
    return done


class Sessions:
    def __init__(self, api: KubeApi, store: Store, writer: StatusWriter, clock: Callable[[], datetime],
                 key_namespace: str, hand_back: SessionReply, identity: IdentityGuard,
                 proxy: EgressProxy | None = None, claims: WarmPods | None = None):
        self.api, self.store, self.writer, self.now = api, store, writer, clock
        # a warm pool pod for a session (warm.Claims.claim_for_session): the pod as claimed, or None
        self._claims = claims
        self.proxy = proxy  # the egress proxy, for sessions of a policy with host rules
        self.key_namespace = key_namespace
        self._hand_back = hand_back
        # Runs a change of their session may move: the controller reconciles them (it drains this after each
        # event and step), so the sessions' side never calls into it.
        self.woken: WorkQueue[str] = WorkQueue()
        # who created a session and its runs, and whether the API server's record of it can be trusted now
        self._identity = identity
        # run uid -> its frame, from the stream until the controller's finish of it succeeded (a retry of a
        # failed finish, or a reconcile that comes first, finishes from it rather than call the run lost)
        self.received: dict[str, RunnerFrame] = {}
        self._attach_failures: dict[str, int] = {}  # session uid -> attaches in a row that sent nothing
        self.sessions: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> the session as last seen
        self.pods: dict[str, dict[str, Any]] = {}  # session uid -> its sandbox pod
        self.streams: dict[str, threading.Thread] = {}  # run uid -> the thread sending it and reading its frame
        # run uid -> (its frame, when it came): killed by a SIGKILL the runner did not send, so the runner ended
        # the session after it, and the container's end (OOMKilled or not) decides the run's reason
        self.killed: dict[str, tuple[RunnerFrame, float]] = {}
        self._master: bytes | None = None  # _master_key
        self._routes: dict[str, object] = {}  # session uid -> the routes its NetworkPolicy was last made to hold
        self.channels: dict[str, Channel] = {}  # session uid -> the attach to its pod, kept between runs
        self._sending: dict[str, str] = {}  # session uid -> uid of the run whose document is on its way (Busy)
        # session uid -> the next document's sequence number, below the session's status's documentsReserved
        # (absent: none used since this operator started, so the next is the reserved number itself)
        self._next_sequence: dict[str, int] = {}
        # sessions whose first document (sequence 0, the session's key) was never sent: the attach failed first.
        # The runner has no key, so the next run's document is sent as the first again, not with a MAC.
        self._unkeyed: set[str] = set()
        # session uid -> the resourceVersions of the operator's own last status writes, newest last: the watch's
        # echo of an older one is stale (the held status is newer) and must not be written back over it
        self._written: dict[str, collections.deque[str]] = {}
        self._lock = threading.RLock()
        self.later: Callable[[float, Callable[[], None]], None] = _after  # (seconds, call): a check scheduled
        self._marks = threading.Lock()  # for _sending alone

    # ------------------------------------------------------------------ events
    def on_session(self, session: Mapping[str, Any], deleted: bool, ensure_policies: Callable[[], None]) -> None:
        meta = session["metadata"]
        with self._lock:
            if deleted:
                self.sessions.pop((meta["namespace"], meta["name"]), None)
                self.pods.pop(meta["uid"], None)
                self._routes.pop(meta["uid"], None)
                self._written.pop(meta["uid"], None)
                self._unkeyed.discard(meta["uid"])
                self._attach_failures.pop(meta["uid"], None)
                self._next_sequence.pop(meta["uid"], None)
                self._close_channel(meta["uid"])
            elif self._stale_echo(meta):
                return
            else:
                self.sessions[(meta["namespace"], meta["name"])] = held = _newest_count(
                    dict(session), self.sessions.get((meta["namespace"], meta["name"])))
                # The echo of its own last write while a run is in the sandbox says nothing new: a refresh would
                # write Busy for a run that is about to end (BUSY_AFTER_SECONDS writes it for one that lasts).
                if not (self._own_last_write(meta) and meta["uid"] in self._sending):
                    self._refresh(dict(held), ensure_policies)
        self._wake(self._runs_to_wake(meta["namespace"], meta["name"]))

    def on_pod(self, pod: Mapping[str, Any], deleted: bool, ensure_policies: Callable[[], None]) -> bool:
        """A session pod's event (False: not a session pod)."""
        uid = (pod["metadata"].get("labels") or {}).get(LABEL_SESSION_UID)
        if uid is None:
            return False
        with self._lock:
            session = next((s for s in self.sessions.values() if s["metadata"]["uid"] == uid), None)
            named = ((session or {}).get("status") or {}).get("podName")
            if named and named != pod["metadata"]["name"]:
                log.info("pod %s/%s carries session %s's label but is not its sandbox (%s); ignored",
                         pod["metadata"]["namespace"], pod["metadata"]["name"], uid, named)
                return True
            if deleted:
                self.pods.pop(uid, None)
                self._close_channel(uid)
            else:
                self.pods[uid] = dict(pod)
            if session is not None:
                self._refresh(session, ensure_policies)
        if session is not None:
            self._wake(self._runs_to_wake(session["metadata"]["namespace"], session["metadata"]["name"]))
        return True

    def tick(self, ensure_policies: Callable[[], None]) -> None:
        """The clocks (idle, lifetime) and the policy, for every live session; an ended one is deleted once its
        policy's ttlSecondsAfterFinished has passed."""
        for channel in list(self.channels.values()):  # outside the lock: closing is I/O
            channel.close_if_idle()
        with self._lock:
            for session in list(self.sessions.values()):
                try:
                    if (session.get("status") or {}).get("phase") != SessionPhase.ENDED:
                        self._refresh(session, ensure_policies)
                    else:
                        self._expire(session, ensure_policies)
                except Exception as e:  # noqa: BLE001 - one session's trouble must not stop the others' clocks
                    log.warning("session %s: %s: %s; will retry", session["metadata"]["name"],
                                type(e).__name__, str(e)[:300])

    def _expire(self, session: Mapping[str, Any], ensure_policies: Callable[[], None]) -> None:
        """Deleted once its policy's TTL has passed, and never while a run of it is unfinished: a run whose frame
        is held for the container's end (an OOM kill's evidence) must end with its own reason, not PodDeleted."""
        meta = session["metadata"]
        ensure_policies()  # after a restart the policy's TTL, not the built-in one
        expires = session_expiry_time(session, self.store.policies(meta["namespace"]))
        if (expires is None or expires > self.now() or meta.get("deletionTimestamp")
                or self._waiting_runs(meta["namespace"], meta["name"])):
            return
        self.api.delete_session(meta["namespace"], meta["name"], meta["uid"])
        log.info("session %s/%s deleted after its policy's ttlSecondsAfterFinished", meta["namespace"], meta["name"])

    # ------------------------------------------------------------------ the session
    def _refresh(self, session: dict[str, Any], ensure_policies: Callable[[], None]) -> None:
        status = session.get("status") or {}
        if status.get("phase") == SessionPhase.ENDED:
            self._delete_pod(session)
            return
        ensure_policies()  # after a restart the sessions' events may come before the policies'
        if not status.get("podName"):
            self._admit(session)
            return
        policy = self.store.policies(session["metadata"]["namespace"]).get(status.get("policy") or "")
        if not isinstance(policy, Policy) or policy.sessions is None or not policy.sessions.allowed:
            self._end(session, SessionReason.POLICY_REMOVED, f"policy {status.get('policy')!r} was deleted or no "
                      "longer allows sessions; create a new session under a policy that does")
            return
        pod = self._pod_of(session)
        failed = start_failure(session, pod, self.now(), policy.start_deadline_seconds, self.api.nodes)
        if failed:
            self._end(session, SessionReason.START_FAILED, f"{failed}; create a new session")
            return
        new = compute_session_status(session, pod, self._runs(session), self.now(),
                                     self._sending.get(session["metadata"]["uid"]), policy.start_deadline_seconds)
        if new is None:
            return
        wire = to_wire(new)
        wire.pop("documentsReserved", None)  # only _send moves it (a stale event may hold an old one)
        if any(status.get(k) != v for k, v in wire.items() if k not in ("conditions",)) or \
                _condition_states(status) != _condition_states(wire):
            self._write(session, wire)
        if wire.get("phase") == SessionPhase.ENDED:
            self._delete_pod(session)

    def _pod_of(self, session: Mapping[str, Any]) -> dict[str, Any] | None:
        """The session's pod as the watch delivered it; else as the API server has it. A session event can come
        before its pod's (just created, or every object again after an operator restart): absence from the
        watch alone is no proof that the pod is gone, and a session must not end on it."""
        uid = session["metadata"]["uid"]
        pod = self.pods.get(uid)
        if pod is None:
            pod = self.api.get_pod(session["metadata"]["namespace"], session["status"]["podName"])
            if pod is not None and (pod["metadata"].get("labels") or {}).get(LABEL_SESSION_UID) == uid:
                self.pods[uid] = pod
            else:
                pod = None
        return pod

    def _admit(self, session: dict[str, Any]) -> None:
        meta, now = session["metadata"], self.now()
        try:
            spec = CodeRunSessionSpec.model_validate(session.get("spec") or {})
        except ValidationError as e:
            first = e.errors()[0]
            self._end(session, SessionReason.INVALID_SPEC,
                      f"spec.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"[:1024])
            return
        policy = select_policy(spec.policy_ref, self.store.policies(meta["namespace"]))
        if isinstance(policy, Denial):
            self._end(session, SessionReason.POLICY_DENIED, policy.message)
            return
        refused = creator_may_use(self.api, self._identity, session)(spec.policy_ref) \
            if needs_use_permission(spec.policy_ref) else None
        if refused is not None:  # as for a run: naming a policy other than default takes the verb use
            self._end(session, SessionReason.POLICY_DENIED, refused.message)
            return
        if policy.approval_required():
            self._end(session, SessionReason.POLICY_DENIED, f"policy {policy.name!r} requires a person's approval "
                      "of each run, which sessions do not offer yet; run without a session, or under a policy "
                      "without approval")
            return
        alive = sum(1 for s in self.sessions.values()
                    if s["metadata"]["namespace"] == meta["namespace"] and s["metadata"]["uid"] != meta["uid"]
                    and (s.get("status") or {}).get("podName") and (s.get("status") or {}).get("policy") == policy.name
                    and (s.get("status") or {}).get("phase") != SessionPhase.ENDED)
        verdict = session_verdict(spec, policy, alive)
        if isinstance(verdict, Denial):
            self._end(session, verdict.reason, verdict.message,
                      {"policy": verdict.policy, "policyDigest": verdict.policy_digest})
            return
        try:
            access = access_for(self.proxy, policy.egress)
        except ProxyUnavailable as e:
            self._end(session, SessionReason.START_FAILED, cannot_start(e, policy.name, "this session"))
            return
        ensure_key(self.api, self.key_namespace, KEY_SECRET, KEY_ENTRY, "the sessions' key")
        ensure_namespace_default_deny(self.api, meta["namespace"])
        pod = build_session_pod(session, verdict.decision, verdict.max_lifetime_seconds)
        try:
            # its routes before its pod, as a cold run's (the namespace's deny-all until then)
            taken = self._ensure_routes(session, policy.egress, access.route if access else None)
            if taken:
                self._end(session, SessionReason.START_FAILED, taken)
                return
            existing = self._kept_or_warm_pod(session, verdict.decision, verdict.max_lifetime_seconds) or \
                self.api.create_or_get(pod)
        except self.api.Refused as refused:
            self._end(session, SessionReason.START_FAILED, f"{refused}; the namespace's quota or admission policy "
                      "must allow the session's sandbox")
            return
        if existing is not None and (existing["metadata"].get("labels") or {}).get(LABEL_SESSION_UID) != meta["uid"]:
            self._end(session, SessionReason.START_FAILED, f"a pod named {pod['metadata']['name']} exists and is not "
                      "this session's; delete it or name the session differently")
            return
        sandbox = existing or pod
        self.pods.setdefault(meta["uid"], sandbox)  # until the watch brings it (see _pod_of)
        fields = {k: v for k, v in decision_fields(verdict.decision).items() if k != "decision"
                  and k != "runtimeClass"}
        self._write(session, to_wire(admitted_status(session, fields, sandbox["metadata"]["name"],
                                                     verdict.idle_timeout_seconds, verdict.max_lifetime_seconds, now,
                                                     warm=sandbox["metadata"]["name"] != pod["metadata"]["name"])))

    def _kept_or_warm_pod(self, session: Mapping[str, Any], decision: Decision,
                          lifetime_seconds: int) -> dict[str, Any] | None:
        """The session's pod when none need be created: one already its own (made or claimed for it before an
        operator restart lost the status write), else a warm pool pod claimed now."""
        uid = session["metadata"]["uid"]
        held = self.pods.get(uid)
        if held is None or held["metadata"].get("deletionTimestamp"):
            # asked of the API server, not only the watch: after a restart the session's event may come first
            held = next((p for p in self.api.list_pods(session["metadata"]["namespace"], {LABEL_SESSION_UID: uid})
                         if not p["metadata"].get("deletionTimestamp")), None)
        if held is None and self._claims is not None:
            held = self._claims.claim_for_session(session, decision, lifetime_seconds)
        if held is not None:
            self.pods[uid] = held
        return held

    def _ensure_routes(self, session: Mapping[str, Any], egress: Sequence[EgressRule],
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

    def _end(self, session: dict[str, Any], reason: str, message: str, fields: Mapping[str, Any] | None = None) -> None:
        self._write(session, to_wire(ended_status(session, reason, message, self.now(), fields)))
        self._delete_pod(session)

    def _delete_pod(self, session: Mapping[str, Any]) -> None:
        self._close_channel(session["metadata"]["uid"])
        pod = self.pods.get(session["metadata"]["uid"])
        if pod is not None and not pod["metadata"].get("deletionTimestamp"):
            self.api.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])

    def _channel(self, session: Mapping[str, Any], pod_name: str) -> Channel:
        uid = session["metadata"]["uid"]
        channel = self.channels.get(uid)
        if channel is None or channel.pod_name != pod_name:
            self._close_channel(uid)
            channel = self.channels[uid] = Channel(self.api, session["metadata"]["namespace"], pod_name)
        return channel

    def _close_channel(self, session_uid: str) -> None:
        channel = self.channels.pop(session_uid, None)
        if channel is not None:
            channel.close()

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

    def _write(self, session: dict[str, Any], wire: dict[str, Any]) -> dict[str, Any] | None:
        meta = session["metadata"]
        written = self.api.patch_session_status(meta["namespace"], meta["name"], wire)
        if written is not None:
            version = written["metadata"].get("resourceVersion")
            if version:
                self._written.setdefault(meta["uid"], collections.deque(maxlen=16)).append(version)
            self.sessions[(meta["namespace"], meta["name"])] = written
            session.update(written)  # the caller's copy too; never emptied on the way (it is read without a lock)
        return written

    def _runs(self, session: Mapping[str, Any]) -> list[dict[str, Any]]:
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
        waiting = self._waiting_runs(namespace, name)
        session = self.sessions.get((namespace, name))
        if session is None or (session.get("status") or {}).get("phase") == SessionPhase.ENDED:
            return waiting
        return waiting[:1]

    def _waiting_runs(self, namespace: str, name: str) -> list[str]:
        return [r["metadata"]["uid"] for r in runs_in_order(
            r for r in self.store.unfinished_in(namespace) if (r.get("spec") or {}).get("session") == name)]

    def session_of(self, run: Mapping[str, Any]) -> dict[str, Any] | None:
        ns, name = run["metadata"]["namespace"], run["spec"]["session"]
        # read without the lock (one dict lookup): it is held across the session's status writes, and every
        # run's step begins here
        held = self.sessions.get((ns, name))
        if held is None:
            held = self.api.get_session(ns, name)
            if held is not None:
                with self._lock:
                    self.sessions.setdefault((ns, name), held)
        return held

    # ------------------------------------------------------------------ a run in a session
    def follow(self, run: Mapping[str, Any]) -> Outcome | HeldFrame | None:
        """A run sent to its session's sandbox (under the run's lock): an Outcome when it is lost, its HeldFrame
        once the sandbox's log or end decided it; None while its stream's thread or the sandbox may bring it."""
        session = self.session_of(run)
        if session is None:
            if run["metadata"]["uid"] in self.streams:
                return None  # its stream's thread finishes it
            return Outcome(Phase.FAILED, Reason.POD_DELETED, f"CodeRunSession {run['spec']['session']} was deleted "
                           "while the run was in it")
        return self._in_sandbox(run, session)

    def decide(self, run: Mapping[str, Any]) -> Admitted | Outcome | None:
        """A run naming a session, not sent yet (under the run's lock): Admitted once it is its turn, under the
        session's limits and its policy as it is now; an Outcome when it is refused; None while it waits its turn
        (its status says why)."""
        meta = run["metadata"]
        session = self.session_of(run)
        name = run["spec"]["session"]
        if session is None:
            return Outcome(Phase.REJECTED, Reason.SESSION_NOT_FOUND, f"CodeRunSession {name!r} does not exist in "
                           "this namespace; create it first (and wait for it to be Ready), or fix spec.session")
        sstatus = session.get("status") or {}
        if sstatus.get("phase") == SessionPhase.ENDED:
            return Outcome(Phase.REJECTED, Reason.SESSION_ENDED, f"CodeRunSession {name} has ended "
                           f"({sstatus.get('reason')}): {sstatus.get('message')}; create a new session")
        spec = parse_spec(run.get("spec") or {})
        if isinstance(spec, Denial):
            return Outcome(Phase.REJECTED, spec.reason, spec.message, refusal_fields(spec))
        if spec.language != (session.get("spec") or {}).get("language"):
            return Outcome(Phase.REJECTED, Reason.SESSION_MISMATCH, f"the run's language {spec.language!r} is not "
                           f"the session's ({(session.get('spec') or {}).get('language')!r}); run it in a session of "
                           "its language, or without one")
        problem = self._identity.problem()
        if problem:
            return Outcome(Phase.REJECTED, Reason.SESSION_FORBIDDEN, f"the creators of the run and of CodeRunSession "
                           f"{name} cannot be verified, so no run may use a session: {problem}")
        creator = (session["metadata"].get("annotations") or {}).get(CREATED_BY)
        if creator != (meta.get("annotations") or {}).get(CREATED_BY):
            return Outcome(Phase.REJECTED, Reason.SESSION_FORBIDDEN, f"CodeRunSession {name} was created by another "
                           "identity: only its creator may run in it; create a session of your own")
        policy = self.store.policies(meta["namespace"]).get(sstatus.get("policy") or "")
        if not sstatus.get("podName") or not isinstance(policy, Policy):
            self._wait(run, None, f"CodeRunSession {name} is {sstatus.get('phase') or 'not admitted yet'}; "
                       "the run starts once it is Ready")
            return None
        decision = run_in_session(spec, ResourceLimits.model_validate(sstatus["effectiveLimits"]), policy)
        if isinstance(decision, Denial):
            return Outcome(Phase.REJECTED, decision.reason, decision.message, refusal_fields(decision))
        if decision.policy.approval_required():  # the policy changed since the session started
            return Outcome(Phase.REJECTED, Reason.POLICY_DENIED, f"policy {policy.name!r} now requires a person's "
                           "approval of each run, which sessions do not offer; run without a session")
        list_runs_once(self.api, self.store, meta["namespace"])
        queue = [r for r in runs_in_order(r for r in self.store.unfinished_in(meta["namespace"])
                                          if (r.get("spec") or {}).get("session") == name)]
        head = queue[0] if queue else run
        if head["metadata"]["uid"] != meta["uid"]:
            # The same words until its turn: naming the run ahead of it would rewrite every queued run's status
            # each time one ends (a harness's 80 queued runs: 80 writes a run, and the session 5 times slower).
            self._wait(run, decision, f"waits its turn in CodeRunSession {name}: runs go one at a time, in "
                       "creation order")
            return None
        if sstatus.get("phase") not in (SessionPhase.READY, SessionPhase.BUSY):
            self._wait(run, decision, f"CodeRunSession {name} is {sstatus.get('phase')}; the run starts once "
                       "it is Ready")
            return None
        # Busy is no reason to wait once the runs before this one are finished (the status says Ready a write
        # later). A run still in the sandbox is (one created earlier whose event came late is head now), and so
        # is a document on its way (a run deleted meanwhile): the sandbox and its attach are theirs.
        if session["metadata"]["uid"] in self._sending or any(
                in_session(r, sstatus) for r in queue if r["metadata"]["uid"] != meta["uid"]):
            self._wait(run, decision, f"waits for the run in CodeRunSession {name}'s sandbox to end")
            return None
        return Admitted(spec, decision)

    def _wait(self, run: Mapping[str, Any], decision: Decision | None, message: str) -> None:
        self.writer.wait(run, decision, Reason.QUEUED, message, tell=False)

    def send(self, run: Mapping[str, Any], admitted: Admitted, egress: EgressAccess | None) -> Outcome | None:
        """Take the document's sequence number (reserving the next block in the session's status when the last
        one is used up), record the start in the run's status, then send the document on a thread of its own;
        its frame comes back through `hand_back`. A number reserved for a document never sent is a gap the
        runner accepts (it takes any number past the last it read), so nothing is ever taken back. `egress`: the
        proxy pod the run is pinned to, and its credential, which travel with its document."""
        spec, decision = admitted.spec, admitted.decision
        session = self.session_of(run)
        if session is None:  # deleted since its decision: its next reconcile refuses the run
            return None
        meta, sstatus = run["metadata"], session["status"]
        pod_name = sstatus["podName"]
        now = self.now()  # the run's start and the session's last activity, the same instant
        master = self._master_key()
        taken = self._ensure_routes(session, decision.policy.egress, egress.route if egress else None)
        if taken:
            return Outcome(Phase.FAILED, Reason.START_FAILED, taken, decision_fields(decision))
        suid = session["metadata"]["uid"]
        with self._lock:
            if suid in self._sending:  # another run's document is on its way: its end wakes the queue again
                return None
            # the reservation as the operator last wrote it (the caller's copy may be an event's, older)
            held = self.sessions.get((session["metadata"]["namespace"], session["metadata"]["name"])) or session
            reserved = reserved_sequence(held.get("status") or {})
            sequence = self._next_sequence.get(suid, reserved)
            if sequence >= reserved and self._write(session, {"documentsReserved": sequence + SEQUENCE_BLOCK}) is None:
                return None
            self._next_sequence[suid] = sequence + 1
            # the number the document goes with: 0, which carries the session's key, until one such was sent
            wire_sequence = 0 if suid in self._unkeyed else sequence
            with self._marks:
                self._sending[suid] = meta["uid"]  # until its exchange ends: the session stays Busy
            channel = self._channel(session, pod_name)
        try:
            self._start_in(channel, run, spec, decision, session, egress, master, wire_sequence, now)
            return None
        except BaseException:
            self._done_sending(suid, meta["uid"])  # nothing went: the session must not stay Busy for it
            self.streams.pop(meta["uid"], None)
            raise

    def _start_in(self, channel: Channel, run: Mapping[str, Any], spec: CodeRunSpec, decision: Decision,
                  session: dict[str, Any], egress: EgressAccess | None, master: bytes, sequence: int,
                  now: datetime) -> None:
        """The run's start in its status, then its document on a thread of its own."""
        meta, suid, pod_name = run["metadata"], session["metadata"]["uid"], session["status"]["podName"]
        status = started_in_session_status(run, decision, pod_name, code_hash(spec), now,
                                           session["metadata"]["name"], egress.pod if egress else None)
        if self.writer.write(run, status) is None:
            self._done_sending(suid, meta["uid"])
            self.wake_queue(run)
            return None
        assert status.start_time is not None  # started_in_session_status records it
        nonce = run_nonce(master, meta["uid"], status.start_time)
        document = session_document(input_configmap(run, spec, decision, egress, self.now().timestamp()), nonce,
                                    session_key(master, session["metadata"]["uid"]), sequence,
                                    bool((session.get("spec") or {}).get("keepState")))
        timeout = decision.limits.timeout_seconds

        def serve() -> None:
            sent, received = False, b""
            try:
                sent, received = channel.exchange(document, frame_with(nonce), timeout)
                if sequence == 0 and sent:  # the key's document: until it went, every next run's carries it again
                    self._unkeyed.discard(suid)
                elif sequence == 0 and (session["metadata"]["namespace"], session["metadata"]["name"]) in self.sessions:
                    self._unkeyed.add(suid)  # (not for a session deleted meanwhile: nothing would take it out)
            finally:
                self._done_sending(suid, meta["uid"])  # from here the run's own status says where it is
            if self.store.run(meta["uid"]) is None:  # deleted on its way: no finish of it wakes the queue (its
                self.wake_queue(run)                   # deletion's event does, once the document is in)
            try:
                self._hand_back(meta["uid"], pod_name, sent, received.decode("ascii", "replace"), nonce)
            finally:
                # only now: a reconcile of the run while its frame is being finished must wait, not call it lost
                self.streams.pop(meta["uid"], None)
        thread = threading.Thread(target=serve, name=f"session-{meta['name'][:40]}", daemon=True)
        self.streams[meta["uid"]] = thread
        thread.start()
        self.later(BUSY_AFTER_SECONDS, functools.partial(self._still_busy, session, meta["name"], meta["uid"], now))
        return None

    def _still_busy(self, session: Mapping[str, Any], run_name: str, run_uid: str, started: datetime) -> None:
        """BUSY_AFTER_SECONDS after a run's document went: if it is still on its way (no frame yet), the session's
        status says Busy with it, its activity the run's start."""
        meta = session["metadata"]
        try:
            with self._lock:
                held = self.sessions.get((meta["namespace"], meta["name"]))
                if held is None or held["metadata"].get("uid") != meta["uid"] or \
                        self._sending.get(meta["uid"]) != run_uid:
                    return  # the run's document is in, or the session was deleted (and made again) meanwhile
                status = held.get("status") or {}
                if status.get("phase") != SessionPhase.ENDED:
                    self._write(held, busy_fields(status, run_name, started, self._runs(held)))
        except Exception as e:  # noqa: BLE001 - words in a status: the next refresh writes them
            log.warning("session %s: the Busy write failed: %s: %s", meta["name"], type(e).__name__, str(e)[:300])

    def _done_sending(self, session_uid: str, run_uid: str) -> None:
        """The run's document is no longer on its way (the next run's may be by now: that mark stays)."""
        with self._marks:  # not the session lock: a write under it would hold the run's end
            if self._sending.get(session_uid) == run_uid:
                del self._sending[session_uid]

    def _master_key(self) -> bytes:
        """The operator's key for sessions, read once (it never changes: a new one would orphan every session)."""
        if self._master is None:
            self._master = read_key(self.api, self.key_namespace, KEY_SECRET, KEY_ENTRY) or None
            if self._master is None:
                raise self.api.Transient("the sessions' key Secret cannot be read yet")
        return self._master

    def _in_sandbox(self, run: Mapping[str, Any], session: dict[str, Any]) -> Outcome | HeldFrame | None:
        """A run whose document went to the sandbox: its stream's thread brings its frame. Without one (the stream
        broke, or the operator restarted) the sandbox's log has it once the run ended, or the sandbox's end says
        why there is none (memory: the OOM killer took the whole sandbox, runner and all). The tick looks again
        until the run's deadline, then it ends here, saying why."""
        uid = run["metadata"]["uid"]
        if uid in self.streams:
            return None
        frame = self.received.get(uid)
        if frame is not None:  # a finish of it failed (and is retried): from the frame, not as lost
            return HeldFrame(frame, oom_killed=False)
        sstatus = session.get("status") or {}
        ended = sstatus.get("phase") == SessionPhase.ENDED
        held = self.killed.get(uid)
        if held is not None:
            killed, since = held
            if not ended and time.monotonic() - since < KILL_EVIDENCE_SECONDS:
                return None
            del self.killed[uid]
            return HeldFrame(killed, oom_killed=sstatus.get("reason") == SessionReason.OOM_KILLED)
        try:  # an ended session's pod may still hold the log (its lifetime passed while the operator was away)
            logged, accepted = self._read_log(run)
        except self.api.Transient:  # not read: nothing is concluded from it
            logged, accepted = None, None
        if logged is not None:
            return self._frame_held(run, session, logged)
        if ended:
            reason = Reason.OOM_KILLED if sstatus.get("reason") == SessionReason.OOM_KILLED else Reason.POD_DELETED
            return Outcome(Phase.FAILED, reason, f"the session ended while the run was in it ({sstatus.get('reason')}: "
                           f"{sstatus.get('message')})")
        if accepted is None or self.now() < self._stream_deadline(run):
            return None  # still running, or its log not read: the tick looks again
        if not accepted:  # e.g. the operator went as the document was on its way
            return Outcome(Phase.FAILED, Reason.INTERNAL_ERROR, "the run's document left no sign in the session's "
                           "sandbox that its runner took it, and no result came by its deadline; create the run "
                           "again")
        return self._unanswered(run, session, FrameError("the runner took the run's document and printed no frame "
                                                         "of it by its deadline"))

    def _read_log(self, run: Mapping[str, Any]) -> tuple[RunnerFrame | None, bool]:
        """From the run's sandbox's log since the run started: its frame (None when it is not there yet), and
        whether the runner said it took the run's document. Transient when the log cannot be read now. The
        kubelet joins a long line's partial records back into one, so a frame of megabytes is read whole."""
        status = run.get("status") or {}
        nonce = self._nonce_of(run)
        if not status.get("podName") or nonce is None:
            return None, False
        started = parse_time(status.get("startTime")) or self.now()
        since = max(1, math.ceil((self.now() - started).total_seconds()) + LOG_CLOCK_SLACK_SECONDS)
        text, _ = self.api.read_log(run["metadata"]["namespace"], status["podName"], CONTAINER_NAME,
                                    SANDBOX_LOG_LIMIT_BYTES, since_seconds=since, timeout=LOG_READ_SECONDS)
        accepted = accepted_line(hashlib.sha256(nonce.encode()).hexdigest()) in text
        return logged_frame(text, nonce), accepted

    def _nonce_of(self, run: Mapping[str, Any]) -> str | None:
        """The nonce of the run's document as last sent: under its uid and the start its status records."""
        started = (run.get("status") or {}).get("startTime")
        return run_nonce(self._master_key(), run["metadata"]["uid"], started) if started else None

    def _frame_held(self, run: Mapping[str, Any], session: dict[str, Any] | None,
                    frame: RunnerFrame) -> HeldFrame | None:
        """The run's frame, from its stream or its sandbox's log: to finish now, or (killed by a SIGKILL the runner
        did not send) once the container's end says whether memory ran out (`_in_sandbox`)."""
        if frame.killed_unexplained:
            self.killed[run["metadata"]["uid"]] = (frame, time.monotonic())
            return None
        self.received[run["metadata"]["uid"]] = frame  # until finished(): see _in_sandbox
        if frame.interpreterLost and session is not None:
            with self._lock:
                self._end(session, SessionReason.INTERPRETER_LOST, f"run {run['metadata']['name']}: "
                          f"{frame.interpreterLost}; its variables are gone: create a new session")
        return HeldFrame(frame, oom_killed=False)

    def _stream_deadline(self, run: Mapping[str, Any]) -> datetime:
        """When a run's stream would have been given up: its start, its timeout and the pod's margin."""
        status = run.get("status") or {}
        timeout = int((status.get("effectiveLimits") or {}).get("timeoutSeconds") or 0)
        started = parse_time(status.get("startTime")) or self.now()
        return started + timedelta(seconds=timeout + POD_DEADLINE_MARGIN_SECONDS)

    def streamed(self, run: Mapping[str, Any], sent: bool, text: str, nonce: str) -> HeldFrame | Outcome | None:
        """What came back from the session's sandbox: the run's frame (a HeldFrame to finish), or why there is
        none (an Outcome), or None when the document was never sent (the run waits and is sent again), when the
        program died of a SIGKILL the runner did not send, or when the stream ended without the run's frame (the
        run waits for its frame in the log or for the sandbox's end: `_in_sandbox`)."""
        session = self.session_of(run)
        if not sent:
            if session is not None:
                with self._lock:
                    uid = session["metadata"]["uid"]
                    failures = self._attach_failures[uid] = self._attach_failures.get(uid, 0) + 1
                    if (session.get("status") or {}).get("phase") == SessionPhase.ENDED:
                        pass  # it ended meanwhile (its pod went): the run is refused with how, on its reconcile
                    elif failures >= MAX_ATTACH_FAILURES:
                        self._end(session, SessionReason.POD_DELETED, f"the session's sandbox could not be attached "
                                  f"{failures} times in a row; create a new session")
                    else:
                        self._write(session, {"phase": SessionPhase.READY, "currentRun": None})
            self.writer.write(run, unplaced_status(Reason.QUEUED, "the session's sandbox could not be attached; the "
                                                   "run is sent again"))
            return None
        if session is not None:
            self._attach_failures.pop(session["metadata"]["uid"], None)
        try:
            return self._frame_held(run, session, parse_streamed_frame(text, nonce))
        except FrameError as e:
            if session is None:
                return Outcome(Phase.FAILED, Reason.POD_DELETED, f"CodeRunSession {run['spec']['session']} was "
                               "deleted while the run was in it")
            if frame_with(nonce)(text.encode("ascii", "replace")):
                # it stopped at a frame without a nonce: the runner dropped the document (not under its key)
                return self._unanswered(run, session, e)
            # The stream ended without the run's frame: it broke under a run that goes on, or the whole sandbox
            # died. The log or the sandbox's end says which (_in_sandbox, on the next tick).
            return None

    def _unanswered(self, run: Mapping[str, Any], session: dict[str, Any], error: FrameError) -> Outcome:
        """The sandbox, still there, gave no frame of this run's: the session cannot be trusted with another."""
        with self._lock:
            self._end(session, SessionReason.INTERNAL_ERROR, f"the sandbox did not answer run "
                      f"{run['metadata']['name']} ({error}); create a new session")
        return Outcome(Phase.FAILED, Reason.INTERNAL_ERROR, f"the session's sandbox did not answer ({error}); the "
                       "session ended")

    def keeps_state(self, run: Mapping[str, Any]) -> bool:
        """The run went to a keepState session's interpreter (its session's spec says so, and cannot change)."""
        session = self.session_of(run) if (run.get("spec") or {}).get("session") else None
        return bool(session is not None and (session.get("spec") or {}).get("keepState"))

    def sandbox_of(self, run: Mapping[str, Any]) -> dict[str, Any]:
        """The pod a session run went to, as last seen; else its name, as the run's status records it."""
        session = self.session_of(run)
        pod = self.pods.get(session["metadata"]["uid"]) if session is not None else None
        return pod or {"metadata": {"name": run["status"]["podName"]}}

    def finished(self, run: Mapping[str, Any]) -> None:
        """The controller wrote the run's terminal status: its frame is no longer needed."""
        self.received.pop(run["metadata"]["uid"], None)
        self.killed.pop(run["metadata"]["uid"], None)

    def after_run(self, run: Mapping[str, Any], ensure_policies: Callable[[], None]) -> None:
        """A run of the session finished: the next run may go, and the session's status moves (runsDone, the idle
        clock). The next run goes first; the status is written when no run is left in the queue (the refresh
        writes what is true whatever happened meanwhile). Runs queued back to back are counted by the write once
        the queue is empty, by the tick's, or by the Busy write of a run that lasts."""
        session = self.session_of(run)
        if session is None:
            return
        self.wake_queue(run)
        meta = session["metadata"]
        if meta["uid"] in self._sending or any(
                uid != run["metadata"]["uid"] for uid in self._waiting_runs(meta["namespace"], meta["name"])):
            return  # the next run is on its way or queued: the sandbox is not Ready
        with self._lock:
            self._refresh(session, ensure_policies)


def _after(seconds: float, call: Callable[[], None]) -> None:
    timer = threading.Timer(seconds, call)
    timer.daemon = True
    timer.start()


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

