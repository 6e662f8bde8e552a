"""A CodeRunSession's status, pure: (session, its pod, its runs, now) -> the status to write, including when and
why it ends; and the order its runs go through its sandbox."""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Mapping

from coderun.api.coderunsession import CodeRunSessionStatus
from coderun.api.identity import CREATED_BY
from coderun.api.models import CREATED_AT_ANNOTATION as CREATED_AT
from coderun.api.policy import START_DEADLINE_SECONDS
from coderun.api.reasons import SessionConditionType, SessionPhase, SessionReason, StartMode, TERMINAL_PHASES
from .pod_state import is_running, start_verdict, terminated, waiting_message
from .status import parse_time, rfc3339, set_condition


def runs_in_order(runs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The order a session's runs go through its sandbox: creation, then the millisecond the client stamped
    (creationTimestamp has a second's resolution; the SDK and CLI write coderun.io/created-at), then name. Only the
    session's creator can add runs to it, so the client's stamp orders nobody's runs but its own."""
    return sorted(runs, key=lambda r: (r["metadata"].get("creationTimestamp") or "",
                                       str((r["metadata"].get("annotations") or {}).get(CREATED_AT) or ""),
                                       r["metadata"]["name"]))


def in_session(run: Mapping[str, Any], session_status: Mapping[str, Any]) -> bool:
    """The run went into the session's sandbox (its document was, or is being, sent)."""
    status = run.get("status") or {}
    return status.get("startMode") == StartMode.SESSION and status.get("podName") == session_status.get("podName")


def is_done(run: Mapping[str, Any]) -> bool:
    return (run.get("status") or {}).get("phase") in TERMINAL_PHASES


def admitted_status(session: Mapping[str, Any], fields: Mapping[str, Any], pod_name: str, idle_seconds: int,
                    lifetime_seconds: int, now: datetime, warm: bool = False) -> CodeRunSessionStatus:
    """Admitted, its pod created (or a warm pool pod claimed): Pending until the runner is seen running. The
    lifetime counts from here."""
    gen = session["metadata"].get("generation")
    return CodeRunSessionStatus.model_validate({
        **fields, "phase": SessionPhase.PENDING, "reason": SessionReason.POD_CREATED,
        "message": (f"warm sandbox pod {pod_name} claimed" if warm else
                    f"sandbox pod {pod_name} created; waiting for it to start"), "podName": pod_name,
        "startMode": StartMode.WARM if warm else StartMode.COLD,
        "creator": (session["metadata"].get("annotations") or {}).get(CREATED_BY),
        "idleTimeoutSeconds": idle_seconds, "documentsReserved": 0, "runsDone": 0,
        "expiresAt": rfc3339(now + timedelta(seconds=lifetime_seconds)), "observedGeneration": gen,
        "conditions": _conditions(None, False, False, SessionReason.POD_CREATED, "waiting for the sandbox", gen, now)})


def ended_status(session: Mapping[str, Any], reason: str, message: str, now: datetime,
                 fields: Mapping[str, Any] | None = None) -> CodeRunSessionStatus:
    """Ended for good, with why; kept until the session is deleted."""
    gen = session["metadata"].get("generation")
    return CodeRunSessionStatus.model_validate({
        **dict(fields or {}), "phase": SessionPhase.ENDED, "reason": reason, "message": message,
        "endTime": rfc3339(now), "currentRun": None, "observedGeneration": gen,
        "conditions": _conditions((session.get("status") or {}).get("conditions"), False, True, reason, message,
                                  gen, now)})


def compute_session_status(session: Mapping[str, Any], pod: Mapping[str, Any] | None,
                           runs: Iterable[Mapping[str, Any]], now: datetime,
                           sending: str | None = None,
                           start_deadline_seconds: int = START_DEADLINE_SECONDS) -> CodeRunSessionStatus | None:
    """The status of an admitted session (it has a pod name) as its pod and runs say now: Pending until the runner
    runs, Ready between runs, Busy while one is in the sandbox, Ended (why) once its pod is gone, ran out of
    memory or ended, its lifetime passed, or it was idle too long. None: not admitted yet, or already Ended
    (an ended session never changes). `sending`: the uid of the run whose document is on its way (its session
    was marked Busy before its own status says it started, and must not read Ready in between, nor while the
    document of a run deleted meanwhile is still in the sandbox)."""
    status = session.get("status") or {}
    if not status.get("podName") or status.get("phase") == SessionPhase.ENDED:
        return None
    runs = list(runs)
    mine = [r for r in runs if in_session(r, status)]
    current = next((r for r in runs_in_order(mine) if not is_done(r)), None)
    sent = next((r for r in runs if r["metadata"]["uid"] == sending), None) if sending else None
    if current is None and sent is not None and not is_done(sent):
        current = sent
    busy_with = current["metadata"]["name"] if current is not None else \
        (status.get("currentRun") if sending and sent is None else None)
    started = status.get("startTime") or (rfc3339(now) if pod is not None and is_running(pod) else None)
    # what the status held counts too: a finished run may be deleted (the CLI deletes its own), and neither the
    # idle clock nor the count may go back
    activity = [t for t in [started, status.get("lastActivity"), *(_run_times(r) for r in mine)] if t]
    last = max(activity, key=lambda t: parse_time(t) or now) if activity else None
    idle_expires = _idle_expiry(last, status.get("idleTimeoutSeconds"))
    ending = _ending(status, pod, busy_with is not None, idle_expires, now)
    fields = {"runsDone": runs_done(status, mine), "lastActivity": last, "idleExpiresAt": idle_expires}
    if ending:
        return ended_status(session, *ending, now, fields)
    gen = session["metadata"].get("generation")
    if started is None:
        if pod is not None and status.get("startMode") == StartMode.COLD:  # why its pod waits, as a run's says
            fields["message"] = waiting_message(status["podName"], pod, start_deadline_seconds,
                                                "the session ends StartFailed", "the session's spec.limits")
        return CodeRunSessionStatus.model_validate({**status, **fields})
    phase = SessionPhase.BUSY if busy_with is not None else SessionPhase.READY
    message = _busy_message(busy_with) if busy_with is not None else "the sandbox is ready for the next run"
    return CodeRunSessionStatus.model_validate({
        **status, **fields, "phase": phase, "reason": SessionReason.STARTED, "message": message,
        "startTime": started, "currentRun": busy_with,
        "conditions": _conditions(status.get("conditions"), True, False, SessionReason.STARTED,
                                  "the session takes runs", gen, now)})


def start_failure(session: Mapping[str, Any], pod: Mapping[str, Any] | None, now: datetime,
                  start_deadline_seconds: int, nodes: Callable[[], Iterable[Mapping[str, Any]]]) -> str | None:
    """Why an admitted session's sandbox will not start, as a cold run's would be told (an image that cannot be
    pulled, limits no node has, not scheduled or started within the policy's start deadline, counted from the
    pod's creation), or None while it may still start. A session must not sit Pending, its runs queued, until its
    lifetime ends it."""
    status = session.get("status") or {}
    if pod is None or status.get("startTime") or is_running(pod) or terminated(pod):
        return None
    created = parse_time(pod["metadata"].get("creationTimestamp")) or now
    verdict = start_verdict(pod, (now - created).total_seconds(), start_deadline_seconds, nodes)
    return verdict.message.replace("spec.limits", "the session's spec.limits") if verdict else None


def busy_fields(status: Mapping[str, Any], run_name: str, now: datetime,
                runs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The session's status while a run is in its sandbox: Busy with that run, its activity the run's start
    (`now`, the run's startTime too), so the run's own status moving to Running changes nothing a refresh would
    write again; and the runs done so far, counted as the refresh counts them (the runs before this one may have
    ended a moment ago, their count never written: this write says it)."""
    last = rfc3339(now)
    return {"phase": SessionPhase.BUSY, "currentRun": run_name, "message": _busy_message(run_name),
            "lastActivity": last, "idleExpiresAt": _idle_expiry(last, status.get("idleTimeoutSeconds")),
            "runsDone": runs_done(status, [r for r in runs if in_session(r, status)])}


def reserved_sequence(status: Mapping[str, Any]) -> int:
    """The documents' sequence numbers reserved so far: documentsReserved, or the documentsSent count an operator
    before it wrote (a session alive across the upgrade; the greater, should both be there)."""
    return max(int(status.get("documentsReserved") or 0), int(status.get("documentsSent") or 0))


def runs_done(status: Mapping[str, Any], mine: Iterable[Mapping[str, Any]]) -> int:
    """The session's finished runs: those that went through it, or what the status held if more (a finished
    run may be deleted, and the count never goes back)."""
    return max(sum(1 for r in mine if is_done(r)), status.get("runsDone") or 0)


def _busy_message(run_name: str) -> str:
    return f"run {run_name} is in the sandbox"


def _idle_expiry(last_activity: str | None, idle_seconds: int | None) -> str | None:
    """When the idle clock ends the session: computed from the written time, so a refresh and the write that
    set it agree to the millisecond."""
    last = parse_time(last_activity)
    if last is None or not idle_seconds:
        return None
    return rfc3339(last + timedelta(seconds=idle_seconds))


def _run_times(run: Mapping[str, Any]) -> str | None:
    """When a run of the session last moved: its end, else its start."""
    status = run.get("status") or {}
    return status.get("completionTime") or status.get("startTime")


def _ending(status: Mapping[str, Any], pod: Mapping[str, Any] | None, busy: bool, idle_expires: str | None,
            now: datetime) -> tuple[str, str] | None:
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return SessionReason.POD_DELETED, (f"the session's sandbox pod {status['podName']} was deleted or evicted; "
                                           "create a new session")
    ended = terminated(pod)
    if ended and ended.get("reason") == "OOMKilled":
        return SessionReason.OOM_KILLED, ("a run exhausted the session's memory and the sandbox went with it; create "
                                          "a new session, with more memory if the policy allows")
    pod_phase = (pod.get("status") or {}).get("phase")
    expires = parse_time(status.get("expiresAt"))
    if (expires is not None and now >= expires) or (pod.get("status") or {}).get("reason") == "DeadlineExceeded":
        return SessionReason.LIFETIME_EXCEEDED, (f"the session reached its lifetime (expiresAt {status.get('expiresAt')})"
                                                 "; create a new session to go on")
    if ended or pod_phase in ("Succeeded", "Failed"):
        return SessionReason.POD_DELETED, (f"the session's sandbox ended ({(ended or {}).get('reason') or pod_phase})"
                                           "; create a new session")
    if not busy and idle_expires and now >= (parse_time(idle_expires) or now):
        return SessionReason.IDLE_TIMEOUT, (f"no run for {status.get('idleTimeoutSeconds')} s (idleTimeoutSeconds); "
                                            "create a new session to go on")
    return None


def _conditions(conditions: list[dict[str, Any]] | None, ready: bool, ended: bool, reason: str, message: str,
                generation: int | None, now: datetime) -> list[dict[str, Any]]:
    conditions = set_condition(conditions, SessionConditionType.READY, ready, reason, message, generation, now)
    return set_condition(conditions, SessionConditionType.ENDED, ended, reason, message, generation, now)

