"""The run side of a session (docs/sessions.md): a run naming a CodeRunSession is taken one at a time in creation
order: its document (MAC'd under the session's key, a fresh nonce) over the session's attach
(controller/attach.Channel, kept open from run to run), its frame handed back to the controller's finish
(`hand_back`, the one call into the controller), else read from the sandbox's log or end. It reads the session
from the `SessionBook` and moves it through the `SessionReconciler` (its status writes, its end, its routes);
the reconciler never calls this side."""
from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import math
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping

from coderun.api.identity import CREATED_BY
from coderun.api.models import CodeRunSpec, ResourceLimits
from coderun.api.reasons import Phase, Reason, SessionPhase, SessionReason
from coderun.sandbox.runner.protocol import FRAME_PREFIX, accepted_line
from ...builders import code_hash
from ...builders.names import CONTAINER_NAME
from ...builders.objects import POD_DEADLINE_MARGIN_SECONDS
from ...builders.session import session_document
from ...policy import Decision, Denial, Policy
from ...policy.decide import parse_spec
from ...policy.session import run_in_session
from ...builders.egress import EgressAccess
from ...results.frame import FrameError, RunnerFrame, logged_frame, parse_streamed_frame
from ...results.session import busy_fields, in_session, reserved_sequence, runs_in_order
from ...results.status import (Outcome, decision_fields, parse_time, refusal_fields, started_in_session_status,
                               unplaced_status)
from ..children import input_configmap
from ..placement import Admitted
from ..store import list_runs_once
from ..attach import STREAM_LIMIT_BYTES, Channel
from .book import SessionBook, Sends
from .reconciler import SessionReconciler

log = logging.getLogger("coderun")

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


class SessionRuns:
    def __init__(self, sessions: SessionReconciler, hand_back: SessionReply):
        self.sessions = sessions
        self.book: SessionBook = sessions.book
        self.api, self.store, self.writer, self.now = sessions.api, sessions.store, sessions.writer, sessions.now
        self._hand_back = hand_back
        # run uid -> its frame, from the stream until the controller's finish of it succeeded (a retry of a
        # failed finish, or a reconcile that comes first, finishes from it rather than call the run lost)
        self.received: dict[str, RunnerFrame] = {}
        self.streams: dict[str, threading.Thread] = {}  # run uid -> the thread sending it and reading its frame
        # run uid -> (its frame, when it came): killed by a SIGKILL the runner did not send, so the runner ended
        # the session after it, and the container's end (OOMKilled or not) decides the run's reason
        self.killed: dict[str, tuple[RunnerFrame, float]] = {}
        self.later: Callable[[float, Callable[[], None]], None] = _after  # (seconds, call): a check scheduled

    def follow(self, run: Mapping[str, Any]) -> Outcome | HeldFrame | None:
        """A run sent to its session's sandbox (under the run's lock): an Outcome when it is lost, its HeldFrame
        once the sandbox's log or end decided it; None while its stream's thread or the sandbox may bring it."""
        session = self.sessions.session_of(run)
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
        session = self.sessions.session_of(run)
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
        problem = self.sessions.identity.problem()
        if problem:
            return Outcome(Phase.REJECTED, Reason.SESSION_FORBIDDEN, f"the creators of the run and of CodeRunSession "
                           f"{name} cannot be verified, so no run may use a session: {problem}")
        creator = (session["metadata"].get("annotations") or {}).get(CREATED_BY)
        if not creator or creator != (meta.get("annotations") or {}).get(CREATED_BY):  # unstated is nobody's
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
        if session["metadata"]["uid"] in self.book.sending or any(
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
        session = self.sessions.session_of(run)
        if session is None:  # deleted since its decision: its next reconcile refuses the run
            return None
        meta, sstatus = run["metadata"], session["status"]
        pod_name = sstatus["podName"]
        now = self.now()  # the run's start and the session's last activity, the same instant
        master = self.sessions.master_key()
        taken = self.sessions.ensure_routes(session, decision.policy.egress, egress.route if egress else None)
        if taken:
            return Outcome(Phase.FAILED, Reason.START_FAILED, taken, decision_fields(decision))
        suid = session["metadata"]["uid"]
        with self.book.lock:
            if suid in self.book.sending:  # another run's document is on its way: its end wakes the queue again
                return None
            # the reservation as the operator last wrote it (the caller's copy may be an event's, older)
            held = self.book.sessions.get((session["metadata"]["namespace"], session["metadata"]["name"])) or session
            reserved = reserved_sequence(held.get("status") or {})
            sends = self.book.sends.setdefault(suid, Sends())
            sequence = reserved if sends.next_sequence is None else sends.next_sequence
            if sequence >= reserved and \
                    self.sessions.write(session, {"documentsReserved": sequence + SEQUENCE_BLOCK}) is None:
                return None
            sends.next_sequence = sequence + 1
            # the number the document goes with: 0, which carries the session's key, until one such was sent
            wire_sequence = 0 if sends.unkeyed else sequence
            with self.book.marks:
                self.book.sending[suid] = meta["uid"]  # until its exchange ends: the session stays Busy
            channel = self._channel(session, pod_name)
        try:
            self._start_in(channel, run, spec, decision, session, egress, master, wire_sequence, now,
                           admitted.run_data)
            return None
        except BaseException:
            self.book.done_sending(suid, meta["uid"])  # nothing went: the session must not stay Busy for it
            self.streams.pop(meta["uid"], None)
            raise

    def _start_in(self, channel: Channel, run: Mapping[str, Any], spec: CodeRunSpec, decision: Decision,
                  session: dict[str, Any], egress: EgressAccess | None, master: bytes, sequence: int,
                  now: datetime, run_data: Mapping[str, Any] | None = None) -> None:
        """The run's start in its status, then its document on a thread of its own."""
        meta, suid, pod_name = run["metadata"], session["metadata"]["uid"], session["status"]["podName"]
        status = started_in_session_status(run, decision, pod_name, code_hash(spec), now,
                                           session["metadata"]["name"], egress.pod if egress else None)
        if self.writer.write(run, status) is None:
            self.book.done_sending(suid, meta["uid"])
            self.sessions.wake_queue(run)
            return None
        assert status.start_time is not None  # started_in_session_status records it
        nonce = run_nonce(master, meta["uid"], status.start_time)
        document = session_document(input_configmap(run, spec, decision, egress, self.now().timestamp(),
                                                    run_data=run_data), nonce,
                                    session_key(master, session["metadata"]["uid"]), sequence,
                                    bool((session.get("spec") or {}).get("keepState")))
        timeout = decision.limits.timeout_seconds

        def serve() -> None:
            sent, received = False, b""
            try:
                try:
                    sent, received = channel.exchange(document, frame_with(nonce), timeout)
                    if sequence == 0:
                        self._key_sent(session, sent)
                finally:
                    self.book.done_sending(suid, meta["uid"])  # from here the run's own status says where it is
                if self.store.run(meta["uid"]) is None:  # deleted on its way: no finish of it wakes the queue (its
                    self.sessions.wake_queue(run)               # deletion's event does, once the document is in)
                self._hand_back(meta["uid"], pod_name, sent, received.decode("ascii", "replace"), nonce)
            finally:
                # only now, and whatever was raised on the way: while the run is in `streams` its reconcile waits for
                # this thread, so a uid left there would leave the run (and its session's queue) waiting for ever
                self.streams.pop(meta["uid"], None)
        thread = threading.Thread(target=serve, name=f"session-{meta['name'][:40]}", daemon=True)
        self.streams[meta["uid"]] = thread
        thread.start()
        self.later(BUSY_AFTER_SECONDS, functools.partial(self._still_busy, session, meta["name"], meta["uid"], now))
        return None

    def _key_sent(self, session: Mapping[str, Any], sent: bool) -> None:
        """The document that carries the session's key went (every next one goes MAC'd) or did not (the next run's
        carries the key again). Read with .get: the session may be deleted (and forgotten) meanwhile."""
        meta = session["metadata"]
        sends = self.book.sends.get(meta["uid"])
        if sent:
            if sends is not None:
                sends.unkeyed = False
        elif (meta["namespace"], meta["name"]) in self.book.sessions:  # not for a session deleted meanwhile
            self.book.sends.setdefault(meta["uid"], Sends()).unkeyed = True

    def _still_busy(self, session: Mapping[str, Any], run_name: str, run_uid: str, started: datetime) -> None:
        """BUSY_AFTER_SECONDS after a run's document went: if it is still on its way (no frame yet), the session's
        status says Busy with it, its activity the run's start."""
        meta = session["metadata"]
        try:
            with self.book.lock:
                held = self.book.sessions.get((meta["namespace"], meta["name"]))
                if held is None or held["metadata"].get("uid") != meta["uid"] or \
                        self.book.sending.get(meta["uid"]) != run_uid:
                    return  # the run's document is in, or the session was deleted (and made again) meanwhile
                status = held.get("status") or {}
                if status.get("phase") != SessionPhase.ENDED:
                    self.sessions.write(held, busy_fields(status, run_name, started, self.sessions.runs_of(held)))
        except Exception as e:  # noqa: BLE001 - words in a status: the next refresh writes them
            log.warning("session %s: the Busy write failed: %s: %s", meta["name"], type(e).__name__, str(e)[:300])

    def _channel(self, session: Mapping[str, Any], pod_name: str) -> Channel:
        uid = session["metadata"]["uid"]
        channel = self.book.channels.get(uid)
        if channel is None or channel.pod_name != pod_name:
            self.book.close_channel(uid)
            channel = self.book.channels[uid] = Channel(self.api, session["metadata"]["namespace"], pod_name)
        return channel

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
        return run_nonce(self.sessions.master_key(), run["metadata"]["uid"], started) if started else None

    def _frame_held(self, run: Mapping[str, Any], session: dict[str, Any] | None,
                    frame: RunnerFrame) -> HeldFrame | None:
        """The run's frame, from its stream or its sandbox's log: to finish now, or (killed by a SIGKILL the runner
        did not send) once the container's end says whether memory ran out (`_in_sandbox`)."""
        if frame.killed_unexplained:
            self.killed[run["metadata"]["uid"]] = (frame, time.monotonic())
            return None
        self.received[run["metadata"]["uid"]] = frame  # until finished(): see _in_sandbox
        if frame.interpreterLost and session is not None:
            with self.book.lock:
                self.sessions.end(session, SessionReason.INTERPRETER_LOST, f"run {run['metadata']['name']}: "
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
        session = self.sessions.session_of(run)
        if not sent:
            if session is not None:
                with self.book.lock:
                    uid = session["metadata"]["uid"]
                    sends = self.book.sends.setdefault(uid, Sends())
                    sends.attach_failures += 1
                    failures = sends.attach_failures
                    if (session.get("status") or {}).get("phase") == SessionPhase.ENDED:
                        pass  # it ended meanwhile (its pod went): the run is refused with how, on its reconcile
                    elif failures >= MAX_ATTACH_FAILURES:
                        self.sessions.end(session, SessionReason.POD_DELETED, f"the session's sandbox could not be "
                                          f"attached {failures} times in a row; create a new session")
                    else:
                        self.sessions.write(session, {"phase": SessionPhase.READY, "currentRun": None})
            self.writer.write(run, unplaced_status(Reason.QUEUED, "the session's sandbox could not be attached; the "
                                                   "run is sent again"))
            return None
        if session is not None:
            held = self.book.sends.get(session["metadata"]["uid"])
            if held is not None:
                held.attach_failures = 0
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
        with self.book.lock:
            self.sessions.end(session, SessionReason.INTERNAL_ERROR, f"the sandbox did not answer run "
                              f"{run['metadata']['name']} ({error}); create a new session")
        return Outcome(Phase.FAILED, Reason.INTERNAL_ERROR, f"the session's sandbox did not answer ({error}); the "
                       "session ended")

    def keeps_state(self, run: Mapping[str, Any]) -> bool:
        """The run went to a keepState session's interpreter (its session's spec says so, and cannot change)."""
        session = self.sessions.session_of(run) if (run.get("spec") or {}).get("session") else None
        return bool(session is not None and (session.get("spec") or {}).get("keepState"))

    def sandbox_of(self, run: Mapping[str, Any]) -> dict[str, Any]:
        """The pod a session run went to, as last seen; else its name, as the run's status records it."""
        session = self.sessions.session_of(run)
        pod = self.book.pods.get(session["metadata"]["uid"]) if session is not None else None
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
        session = self.sessions.session_of(run)
        if session is None:
            return
        self.sessions.wake_queue(run)
        meta = session["metadata"]
        if meta["uid"] in self.book.sending or any(
                uid != run["metadata"]["uid"] for uid in self.sessions.waiting_runs(meta["namespace"], meta["name"])):
            return  # the next run is on its way or queued: the sandbox is not Ready
        with self.book.lock:
            self.sessions.refresh(session, ensure_policies)




def _after(seconds: float, call: Callable[[], None]) -> None:
    timer = threading.Timer(seconds, call)
    timer.daemon = True
    timer.start()
