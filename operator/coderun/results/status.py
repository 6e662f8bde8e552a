"""Status computation, pure: (run, what happened, now) -> the status dict to write once.

Every writer of status goes through here, so phases, reasons, conditions and messages stay consistent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Mapping

from ..api.models import CodeRunSpec
from ..api.reasons import ConditionType, Phase, Reason
from ..policy import Decision
from .frame import RunnerFrame
from .redact import Redactor
from .validate import validate_output


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def created_at(run: Mapping[str, Any]) -> datetime | None:
    """When the run was created: the client's millisecond annotation if set, else the API's (seconds)."""
    meta = run["metadata"]
    return parse_time((meta.get("annotations") or {}).get("coderun.io/created-at")) or \
        parse_time(meta.get("creationTimestamp"))


def millis_between(start: datetime | None, end: datetime | None) -> int | None:
    if start is None or end is None:
        return None
    return max(0, round((end - start).total_seconds() * 1000))


_CONDITION_ORDER = {t.value: i for i, t in enumerate(ConditionType)}


def set_condition(conditions: list[dict] | None, type_: str, status: bool, reason: str, message: str,
                  generation: int | None, now: datetime) -> list[dict]:
    """Upsert one condition; lastTransitionTime moves only when the status flips (API conventions)."""
    value = "True" if status else "False"
    out, previous = [], None
    for c in conditions or []:
        if c.get("type") == type_:
            previous = c
        else:
            out.append(c)
    moved = previous is None or previous.get("status") != value
    out.append({"type": type_, "status": value, "reason": reason, "message": message,
                "lastTransitionTime": rfc3339(now) if moved else previous["lastTransitionTime"],
                "observedGeneration": generation})
    return sorted(out, key=lambda c: _CONDITION_ORDER.get(c["type"], len(_CONDITION_ORDER)))


@dataclass
class Outcome:
    """What a run ended with, before it is turned into status fields."""
    phase: Phase
    reason: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


def _generation(run: Mapping[str, Any]) -> int | None:
    return run["metadata"].get("generation")


def accepted_status(run: Mapping[str, Any], decision: Decision, pod_name: str, image: str, hash_: str,
                    now: datetime) -> dict[str, Any]:
    conditions = set_condition(run.get("status", {}).get("conditions"), ConditionType.ACCEPTED, True,
                               Reason.ACCEPTED, f"policy {decision.policy.name!r} allows this run",
                               _generation(run), now)
    limits = decision.limits
    return {
        "phase": Phase.PENDING, "reason": Reason.SCHEDULED,
        "message": f"sandbox pod {pod_name} created; waiting for it to start",
        "podName": pod_name, "image": image, "codeHash": hash_, "runtimeClass": decision.policy.runtime_class,
        "policy": decision.policy.name,
        "effectiveLimits": {"timeoutSeconds": limits.timeout_seconds, "memory": limits.memory, "cpu": limits.cpu,
                            "disk": limits.disk, "outputBytes": limits.output_bytes},
        "startTime": rfc3339(now), "observedGeneration": _generation(run), "conditions": conditions,
    }


def running_status(run: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    conditions = set_condition(run.get("status", {}).get("conditions"), ConditionType.RUNNING, True,
                               Reason.STARTED, "the program is running in its sandbox", _generation(run), now)
    return {"phase": Phase.RUNNING, "reason": Reason.STARTED, "message": "the program is running",
            "conditions": conditions}


def terminal_status(run: Mapping[str, Any], outcome: Outcome, now: datetime) -> dict[str, Any]:
    """The final status: outcome fields, timings, and the conditions a finished run carries."""
    gen, status = _generation(run), run.get("status") or {}
    conditions = status.get("conditions")
    if outcome.phase == Phase.REJECTED:
        conditions = set_condition(conditions, ConditionType.ACCEPTED, False, outcome.reason, outcome.message, gen, now)
    if any(c["type"] == ConditionType.RUNNING for c in conditions or []):
        conditions = set_condition(conditions, ConditionType.RUNNING, False, outcome.reason, "the run has ended",
                                   gen, now)
    succeeded = outcome.phase == Phase.SUCCEEDED
    conditions = set_condition(conditions, ConditionType.COMPLETE if succeeded else ConditionType.FAILED, True,
                               outcome.reason, outcome.message, gen, now)
    validation = outcome.fields.get("validation")
    if validation is not None:
        conditions = set_condition(conditions, ConditionType.OUTPUT_VALID, validation["valid"],
                                   Reason.OUTPUT_VALID if validation["valid"] else Reason.OUTPUT_INVALID,
                                   "; ".join(validation["errors"])[:1024] or "output matches spec.expect", gen, now)
    metrics = dict(outcome.fields.pop("metrics", None) or {})
    metrics["totalMillis"] = millis_between(created_at(run), now)
    return {**outcome.fields, "phase": outcome.phase, "reason": outcome.reason, "message": outcome.message,
            "metrics": {k: v for k, v in metrics.items() if v is not None},
            "completionTime": rfc3339(now), "observedGeneration": gen, "conditions": conditions}


_FAILURE_HINTS = {
    Reason.TIMEOUT: "the program did not finish within {timeout}s; make it faster or raise spec.limits.timeoutSeconds",
    Reason.OOM_KILLED: "the program exceeded its memory limit of {memory}; use less memory or raise spec.limits.memory",
    Reason.OUTPUT_LIMIT_EXCEEDED: "the program wrote far more output than the {output} bytes kept per stream and was "
                                  "stopped; print less or write large results to $CODERUN_OUTPUT_DIR",
}


def failure_message(reason: str, decision_limits: Mapping[str, Any] | None) -> str:
    limits = decision_limits or {}
    template = _FAILURE_HINTS.get(reason, "")
    return template.format(timeout=limits.get("timeoutSeconds", "?"), memory=limits.get("memory", "?"),
                           output=limits.get("outputBytes", "?"))


def outcome_from_frame(spec: CodeRunSpec, frame: RunnerFrame, redactor: Redactor,
                       container_oom: bool, effective_limits: Mapping[str, Any] | None,
                       pod_created: datetime | None, artifacts: list[dict]) -> Outcome:
    """Map the runner's report to phase, reason and a message that says what to change."""
    stdout, n_out = redactor.redact(frame.stdout)
    stderr, n_err = redactor.redact(frame.stderr)
    error = None
    if frame.error is not None:
        message, _ = redactor.redact(frame.error.message)
        error = {"type": frame.error.type, "message": message, "line": frame.error.line}
    reason = frame.reason
    if container_oom or frame.oomKilled:
        reason = Reason.OOM_KILLED
    if reason == Reason.COMPLETED:
        phase, message = Phase.SUCCEEDED, "the program exited with code 0"
    elif reason == Reason.NON_ZERO_EXIT:
        phase = Phase.FAILED
        where = f" at line {error['line']}" if error and error.get("line") else ""
        raised = f": {error['type']}{where}: {error['message']}" if error else "; see stderr"
        message = f"the program exited with code {frame.exitCode}{raised}"
    elif reason in _FAILURE_HINTS:
        phase, message = Phase.FAILED, failure_message(reason, effective_limits)
    elif reason == "InvalidInput":
        phase, reason, message = Phase.FAILED, Reason.INVALID_SPEC, frame.message or "the run's input was refused"
    elif reason == Reason.SIGNALED:
        phase, message = Phase.FAILED, f"the program was killed by signal {frame.signal}"
    else:
        phase, reason = Phase.FAILED, Reason.INTERNAL_ERROR
        message = f"the sandbox runner failed: {frame.message or frame.reason}"
    started = datetime.fromtimestamp(frame.startedAtMillis / 1000, timezone.utc) if frame.startedAtMillis else None
    fields = {
        "exitCode": frame.exitCode, "signal": frame.signal,
        "stdout": stdout, "stderr": stderr, "stdoutBytes": frame.stdoutBytes, "stderrBytes": frame.stderrBytes,
        "stdoutTruncated": frame.stdoutTruncated, "stderrTruncated": frame.stderrTruncated,
        "stdoutSha256": frame.stdoutSha256, "stderrSha256": frame.stderrSha256,
        "redactions": n_out + n_err, "error": error, "artifacts": artifacts,
        "artifactsSkipped": [s.model_dump() for s in frame.artifactsSkipped],
        "metrics": {"wallMillis": frame.metrics.wallMillis, "cpuMillis": frame.metrics.cpuMillis,
                    "maxRSSBytes": frame.metrics.maxRSSBytes, "startupMillis": millis_between(pod_created, started)},
    }
    validation = validate_output(spec.expect, frame.exitCode, frame.stdout, frame.stdoutTruncated)
    if validation is not None:
        fields["validation"] = validation.model_dump()
    return Outcome(phase, reason, message, {k: v for k, v in fields.items() if v is not None})


def outcome_without_frame(problem: str, truncated: bool, container: Mapping[str, Any] | None,
                          effective_limits: Mapping[str, Any] | None) -> Outcome:
    """No trustworthy frame: the container's own state decides between OOM, output flood and a platform error."""
    terminated = (container or {}).get("state", {}).get("terminated") or {}
    if terminated.get("reason") == "OOMKilled" or terminated.get("exitCode") == 137:
        return Outcome(Phase.FAILED, Reason.OOM_KILLED, failure_message(Reason.OOM_KILLED, effective_limits),
                       {"signal": 9})
    if truncated:
        return Outcome(Phase.FAILED, Reason.OUTPUT_LIMIT_EXCEEDED,
                       failure_message(Reason.OUTPUT_LIMIT_EXCEEDED, effective_limits))
    return Outcome(Phase.FAILED, Reason.INTERNAL_ERROR, f"no result from the sandbox: {problem}")
