"""Status computation, pure: (run, what happened, now) -> the `CodeRunStatus` to write once, one function per
phase (waiting, started, approved, cold again, running, terminal).

Every status is built here, so phases, reasons, conditions and messages stay consistent, and validated here by
the model that generates the CRD (a misspelt or undeclared field fails at once, instead of being pruned by the
API server); only the writer (controller/writer.py) turns it into the wire form.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, Sequence

from coderun.api.coderunpolicy import CodeRunPolicyStatus
from coderun.api.models import CREATED_AT_ANNOTATION, CodeRunSpec, CodeRunStatus, ResourceLimits, Validation
from coderun.api.reasons import INFRASTRUCTURE_REASONS, ConditionType, Phase, Reason, StartMode
from coderun.api.text import one_line
from coderun.sandbox.runner.protocol import MAX_ERROR_MESSAGE_CHARS, MAX_ERROR_TYPE_CHARS, MAX_NAME_CHARS, cap
from ..policy import Decision, Denial
from .frame import RunnerFrame
from ..policy.redact import Redactor
from .validate import validate_output


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 time, or None for anything else (annotations are caller-written and may be garbage)."""
    if not isinstance(value, str) or not value or len(value) > 64:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def created_at(run: Mapping[str, Any]) -> datetime | None:
    """When the run was created: the client's millisecond annotation where it falls in the second the API server
    stamped (creationTimestamp has whole seconds; a caller's stamp outside it is not believed), else the API's."""
    meta = run["metadata"]
    client = parse_time((meta.get("annotations") or {}).get(CREATED_AT_ANNOTATION))
    server = parse_time(meta.get("creationTimestamp"))
    if server is None or (client is not None and server <= client < server + timedelta(seconds=1)):
        return client or server
    return server


def millis_between(start: datetime | None, end: datetime | None) -> int | None:
    if start is None or end is None:
        return None
    return max(0, round((end - start).total_seconds() * 1000))


_CONDITION_ORDER = {t.value: i for i, t in enumerate(ConditionType)}


def set_condition(conditions: list[dict[str, Any]] | None, type_: str, status: bool, reason: str, message: str,
                  generation: int | None, now: datetime) -> list[dict[str, Any]]:
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
                "lastTransitionTime": rfc3339(now) if moved or previous is None else previous["lastTransitionTime"],
                "observedGeneration": generation})
    return sorted(out, key=lambda c: _CONDITION_ORDER.get(c["type"], len(_CONDITION_ORDER)))


@dataclass(frozen=True)
class Outcome:
    """What a run ended with, before it is turned into status fields (camelCase, as the status names them). Never
    changed once built: `with_fields` and `dataclasses.replace` make the next one."""
    phase: Phase
    reason: str
    message: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def with_fields(self, **fields: Any) -> Outcome:
        return replace(self, fields={**self.fields, **fields})


def _generation(run: Mapping[str, Any]) -> int | None:
    generation = run["metadata"].get("generation")
    return generation if isinstance(generation, int) else None


def _accepted(run: Mapping[str, Any], decision: Decision, now: datetime) -> list[dict[str, Any]]:
    """The Accepted condition of an admitted run."""
    return set_condition(run.get("status", {}).get("conditions"), ConditionType.ACCEPTED, True, Reason.ACCEPTED,
                         f"policy {decision.policy.name!r} allows this run", _generation(run), now)


def _kept_metrics(run: Mapping[str, Any]) -> dict[str, Any]:
    return {**((run.get("status") or {}).get("metrics") or {})}


def started_status(run: Mapping[str, Any], decision: Decision, pod_name: str, hash_: str, cache_key: str | None,
                   start_mode: str, now: datetime, message: str | None = None,
                   proxy_pod: str | None = None) -> CodeRunStatus:
    """Admitted and given a sandbox pod (created cold, or a warm one claimed): Pending, naming the pod and the
    egress proxy pod the run is pinned to, if any."""
    status = {
        "phase": Phase.PENDING, "reason": Reason.POD_CREATED,
        "message": message or f"sandbox pod {pod_name} created; waiting for it to start",
        "podName": pod_name, "image": decision.runtime.image, "codeHash": hash_, **decision_fields(decision),
        "startTime": rfc3339(now), "observedGeneration": _generation(run), "conditions": _accepted(run, decision, now),
        "startMode": start_mode, "metrics": {**_kept_metrics(run), "queueMillis": millis_between(created_at(run), now)},
    }
    if cache_key:
        status["cacheKey"] = cache_key
    if proxy_pod:
        status["network"] = {"proxyPod": proxy_pod}
    return CodeRunStatus.model_validate(status)


def decision_fields(decision: Decision) -> dict[str, Any]:
    """The policy's decision as the status records it: who decided, and exactly what."""
    return {"policy": decision.policy.name, "policyDigest": decision.policy.digest,
            "runtimeClass": decision.runtime.runtime_class_name,
            "effectiveLimits": decision.limits.model_dump(by_alias=True),
            "decision": decision.record().model_dump(by_alias=True, exclude_none=True)}


def refusal_fields(denial: Denial) -> dict[str, Any]:
    """A refusal as the status records it: the rule and, when a policy said no, which version of which."""
    fields: dict[str, Any] = {"policyRule": denial.rule}
    if denial.policy is not None:
        fields.update(policy=denial.policy, policyDigest=denial.policy_digest)
    return fields


def waiting_status(run: Mapping[str, Any], decision: Decision | None, reason: str, message: str,
                   now: datetime, upload: Mapping[str, Any] | None = None) -> CodeRunStatus:
    """Admitted but not started (queued, or waiting for approval): the decision is recorded now; without one yet
    (a session not Ready decides nothing), only why it waits."""
    if decision is None:
        return CodeRunStatus.model_validate({"phase": Phase.PENDING, "reason": reason, "message": message})
    return CodeRunStatus.model_validate({
        "phase": Phase.PENDING, "reason": reason, "message": message, **decision_fields(decision),
        "observedGeneration": _generation(run), "conditions": _accepted(run, decision, now),
        "metrics": _kept_metrics(run) or None, "upload": dict(upload) if upload else None})


def approved_status(record: Mapping[str, Any]) -> CodeRunStatus:
    """An approval acted on, kept in the status before the run goes on."""
    return CodeRunStatus.model_validate({"approval": dict(record)})


def unplaced_status(reason: str, message: str) -> CodeRunStatus:
    """A sandbox given up before the program ran (a warm pod that goes cold, a session's attach that sent
    nothing): Pending again, with no pod, to be placed anew."""
    return CodeRunStatus.model_validate({"phase": Phase.PENDING, "reason": reason, "podName": None,
                                         "startMode": None, "startTime": None, "message": message})


def started_in_session_status(run: Mapping[str, Any], decision: Decision, pod_name: str, hash_: str, now: datetime,
                              session: str, proxy_pod: str | None = None) -> CodeRunStatus:
    """Sent to a session's sandbox, which is up already: Running from here, in the one write that records its
    start."""
    started = started_status(run, decision, pod_name, hash_, None, StartMode.SESSION, now, proxy_pod=proxy_pod)
    running = running_status({**run, "status": started.model_dump(by_alias=True, exclude_unset=True, mode="json")},
                             now)
    return started.model_copy(update={"phase": running.phase, "reason": running.reason,
                                      "conditions": running.conditions,
                                      "message": f"running in the sandbox of CodeRunSession {session}"})


def unstarted_status(message: str) -> CodeRunStatus:
    """Still Pending, its pod not started, with why it waits (pod_state.waiting_message)."""
    return CodeRunStatus.model_validate({"phase": Phase.PENDING, "reason": Reason.POD_CREATED, "message": message})


def running_status(run: Mapping[str, Any], now: datetime) -> CodeRunStatus:
    conditions = set_condition(run.get("status", {}).get("conditions"), ConditionType.RUNNING, True,
                               Reason.STARTED, "the program is running in its sandbox", _generation(run), now)
    return CodeRunStatus.model_validate({"phase": Phase.RUNNING, "reason": Reason.STARTED,
                                         "message": "the program is running", "conditions": conditions})


def terminal_status(run: Mapping[str, Any], outcome: Outcome, now: datetime) -> CodeRunStatus:
    """The final status: outcome fields, timings, and the conditions a finished run carries."""
    gen, status = _generation(run), run.get("status") or {}
    conditions = status.get("conditions")
    if outcome.phase == Phase.REJECTED:
        conditions = set_condition(conditions, ConditionType.ACCEPTED, False, outcome.reason, outcome.message, gen, now)
    # Running (now False) on every run whose program ran, whether or not a Running status was written on the way
    # (a fast program, a warm pod): the same program ends with the same conditions.
    program_ran = bool(status.get("podName")) and outcome.phase != Phase.REJECTED \
        and outcome.reason not in INFRASTRUCTURE_REASONS
    if program_ran or any(c["type"] == ConditionType.RUNNING for c in conditions or []):
        conditions = set_condition(conditions, ConditionType.RUNNING, False, outcome.reason, "the run has ended",
                                   gen, now)
    succeeded = outcome.phase == Phase.SUCCEEDED
    conditions = set_condition(conditions, ConditionType.COMPLETE if succeeded else ConditionType.FAILED, True,
                               outcome.reason, outcome.message, gen, now)
    conditions = set_condition(conditions, ConditionType.FINISHED, True, outcome.reason, outcome.message, gen, now)
    validation = outcome.fields.get("validation")
    if validation is not None:
        conditions = set_condition(conditions, ConditionType.OUTPUT_VALID, validation["valid"],
                                   Reason.OUTPUT_VALID if validation["valid"] else Reason.OUTPUT_INVALID,
                                   "; ".join(validation["errors"])[:1024] or "output matches spec.expect", gen, now)
    fields = {k: v for k, v in outcome.fields.items() if k != "metrics"}
    metrics = dict(outcome.fields.get("metrics") or {})
    metrics["totalMillis"] = millis_between(created_at(run), now)
    return CodeRunStatus.model_validate({
        **fields, "phase": outcome.phase, "reason": outcome.reason, "message": outcome.message,
        "metrics": {k: v for k, v in metrics.items() if v is not None},
        "completionTime": rfc3339(now), "observedGeneration": gen, "conditions": conditions})


def policy_accepted_status(policy: Mapping[str, Any], refusal: str | None, now: datetime) -> CodeRunPolicyStatus | None:
    """A CodeRunPolicy's Accepted condition as the operator loaded it (`refusal`: why it cannot apply it), or None
    when its status says so already (no write)."""
    status, generation = policy.get("status") or {}, policy["metadata"].get("generation")
    accepted = refusal is None
    reason = Reason.ACCEPTED if accepted else Reason.INVALID_POLICY
    # escaped as the writer would escape it, so the comparison below sees what the status holds
    message = "the operator applies this policy to the runs that select it" if accepted else \
        one_line(f"runs that select this policy are refused until it is fixed: {refusal}")
    held: Mapping[str, Any] = next((c for c in status.get("conditions") or ()
                                    if c.get("type") == ConditionType.ACCEPTED), {})
    if (held.get("status"), held.get("reason"), held.get("message"), held.get("observedGeneration"),
            status.get("observedGeneration")) == ("True" if accepted else "False", reason, message, generation,
                                                   generation):
        return None
    conditions = set_condition(status.get("conditions"), ConditionType.ACCEPTED, accepted, reason, message,
                               generation, now)
    return CodeRunPolicyStatus.model_validate({"observedGeneration": generation, "conditions": conditions})


_FAILURE_HINTS: dict[str, str] = {
    Reason.TIMEOUT: "the program did not finish within {timeout}s; make it faster or raise spec.limits.timeoutSeconds",
    Reason.OOM_KILLED: "the program exceeded its memory limit of {memory}; use less memory or raise spec.limits.memory",
    Reason.OUTPUT_LIMIT_EXCEEDED: "the program wrote far more output than the {output} bytes kept per stream and was "
                                  "stopped; print less or write large results to $CODERUN_OUTPUT_DIR",
    Reason.DISK_LIMIT_EXCEEDED: "the program wrote more than its disk limit of {disk} to /tmp and was stopped; "
                                "write less or raise spec.limits.disk",
}
# What the runner measured when it enforced a sandbox limit (frame.limit.kind), in words.
_LIMIT_MESSAGES = {
    "disk": "the program used {observed} bytes in /tmp, over its disk limit of {limit} bytes, and was stopped; "
            "write less or raise spec.limits.disk",
    "inodes": "the program created {observed} files and directories in /tmp, over the limit of {limit}, and was "
              "stopped; create fewer files",
    "processes": "the program started {observed} processes and reached the sandbox's limit of {limit}, so it was "
                 "stopped; start fewer processes",
    "termination-log": "the program wrote to /dev/termination-log, which belongs to the sandbox runner, and was "
                       "stopped",
}
# The runner's reasons that are the program's own outcome, as they are (the only ones the result cache reuses).
PROGRAM_REASONS = {Reason.COMPLETED, Reason.NON_ZERO_EXIT, Reason.TIMEOUT, Reason.OOM_KILLED,
                    Reason.OUTPUT_LIMIT_EXCEEDED, Reason.SIGNALED, Reason.DISK_LIMIT_EXCEEDED,
                    Reason.PROCESS_LIMIT_EXCEEDED, Reason.SANDBOX_VIOLATION}


def failure_message(reason: str, limits: ResourceLimits | None) -> str:
    template = _FAILURE_HINTS.get(reason, "")
    if limits is None:
        return template.format(timeout="?", memory="?", output="?", disk="?")
    return template.format(timeout=limits.timeout_seconds, memory=limits.memory, output=limits.output_bytes,
                           disk=limits.disk)


def head_bytes(text: str, limit: int) -> tuple[str, bool]:
    """At most `limit` UTF-8 bytes of text (never half a character); whether anything was cut."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


def _message(reason: str, frame: RunnerFrame, error: dict[str, Any] | None, limits: ResourceLimits | None) -> str:
    if reason == Reason.COMPLETED:
        return "the program exited with code 0"
    if reason == Reason.NON_ZERO_EXIT:
        where = f" at line {error['line']}" if error and error.get("line") else ""
        raised = f": {error['type']}{where}: {error['message']}" if error else "; see stderr"
        return f"the program exited with code {frame.exitCode}{raised}"
    if frame.limit is not None and frame.limit.kind in _LIMIT_MESSAGES:
        return _LIMIT_MESSAGES[frame.limit.kind].format(observed=frame.limit.observed, limit=frame.limit.limit)
    if reason in _FAILURE_HINTS:
        return failure_message(reason, limits)
    if reason == Reason.PROCESS_LIMIT_EXCEEDED:
        return "the program reached the sandbox's process limit and was stopped; start fewer processes"
    if reason == Reason.SANDBOX_VIOLATION:
        return "the program touched a file that belongs to the sandbox runner and was stopped"
    return f"the program was killed by signal {frame.signal}{_signal_name(frame.signal)}"


def _signal_name(number: int | None) -> str:
    if number is None:
        return ""
    try:
        return f" ({signal.Signals(number).name})"
    except (ValueError, TypeError):
        return ""


def outcome_from_frame(spec: CodeRunSpec, frame: RunnerFrame, redactor: Redactor,
                       container_oom: bool, limits: ResourceLimits | None,
                       pod_created: datetime | None, artifacts: list[dict[str, Any]],
                       skipped: list[dict[str, Any]]) -> Outcome:
    """Map the runner's report to phase, reason and a message that says what to change.

    Every string that came from the program is redacted: output, the exception, artifact names, and the
    validation errors (they quote the output). Output is redacted before it is cut to spec.limits.outputBytes
    (the runner keeps a margin beyond it), so a secret straddling the cut is never shown in part.
    """
    limit = (limits.output_bytes if limits else 0) or len(frame.stdout.encode()) + len(frame.stderr.encode())
    stdout, n_out = redactor.redact(frame.stdout)
    stderr, n_err = redactor.redact(frame.stderr)
    stdout, cut_out = head_bytes(stdout, limit)
    stderr, cut_err = head_bytes(stderr, limit)
    error, n_error = redacted_error(frame.error.model_dump() if frame.error else None, redactor)
    artifacts, n_artifacts = redacted_names(artifacts, redactor)
    skipped, n_skipped = redacted_names(skipped, redactor)
    redactions = n_out + n_err + n_error + n_artifacts + n_skipped
    reason = frame.reason
    if container_oom or frame.oomKilled:
        reason = Reason.OOM_KILLED
    if reason == Reason.COMPLETED:
        phase = Phase.SUCCEEDED
    elif reason in PROGRAM_REASONS:
        phase = Phase.FAILED
    elif reason == "InvalidInput":
        phase, reason = Phase.FAILED, Reason.INVALID_SPEC
    else:
        phase, reason = Phase.FAILED, Reason.INTERNAL_ERROR
    if reason in (Reason.INVALID_SPEC, Reason.INTERNAL_ERROR):
        detail = cap(redactor.redact(frame.message or frame.reason)[0], MAX_ERROR_MESSAGE_CHARS)
        message = (detail if reason == Reason.INVALID_SPEC else f"the sandbox runner failed: {detail}")
    else:
        message = _message(reason, frame, error, limits)
    if frame.interpreterLost:
        message += f"; the session's interpreter was lost ({frame.interpreterLost}) and the session ended"
    started = datetime.fromtimestamp(frame.startedAtMillis / 1000, timezone.utc) if frame.startedAtMillis else None
    fields = {
        "exitCode": frame.exitCode, "signal": frame.signal,
        "stdout": stdout, "stderr": stderr, "stdoutBytes": frame.stdoutBytes, "stderrBytes": frame.stderrBytes,
        "stdoutTruncated": frame.stdoutTruncated or cut_out, "stderrTruncated": frame.stderrTruncated or cut_err,
        "stdoutSha256": frame.stdoutSha256, "stderrSha256": frame.stderrSha256,
        "redactions": redactions, "error": error, "artifacts": artifacts,
        "artifactsSkipped": skipped, "artifactsSkippedUnlisted": frame.artifactsSkippedUnlisted or None,
        "metrics": {"wallMillis": frame.metrics.wallMillis, "cpuMillis": frame.metrics.cpuMillis,
                    "maxRSSBytes": frame.metrics.maxRSSBytes, "startupMillis": millis_between(pod_created, started),
                    "interpreterPrestarted": frame.prestarted or None},
    }
    validation = validate_output(spec.expect, frame.exitCode, frame.stdout, frame.stdoutTruncated)
    if validation is not None:
        fields["validation"] = redacted_validation(validation, redactor)
    return Outcome(phase, reason, message, {k: v for k, v in fields.items() if v is not None})


def redacted_error(error: Mapping[str, Any] | None, redactor: Redactor) -> tuple[dict[str, Any] | None, int]:
    """The program's error (type, message, line) redacted and capped; how many secrets went."""
    if error is None:
        return None, 0
    type_, n_type = redactor.redact(error["type"])
    message, n_message = redactor.redact(error["message"])
    return {"type": cap(type_, MAX_ERROR_TYPE_CHARS), "message": cap(message, MAX_ERROR_MESSAGE_CHARS),
            "line": error.get("line")}, n_type + n_message


def redacted_names(entries: Sequence[Mapping[str, Any]], redactor: Redactor) -> tuple[list[dict[str, Any]], int]:
    """Artifact entries with their program-chosen names redacted and capped; how many secrets went."""
    named, total = [], 0
    for entry in entries:
        name, n = redactor.redact(entry["name"])
        total += n
        named.append({**entry, "name": cap(name, MAX_NAME_CHARS)})
    return named, total


def redacted_validation(validation: Validation, redactor: Redactor) -> dict[str, Any]:
    return {"valid": validation.valid, "errors": [redactor.redact(e)[0] for e in validation.errors]}


def outcome_without_frame(problem: str, truncated: bool, container: Mapping[str, Any] | None,
                          limits: ResourceLimits | None, node_saw_oom_kill: bool = False) -> Outcome:
    """No trustworthy frame: the kubelet's word decides between OOM, output flood and a platform error, and the
    node's (its audit agent read the pod's OOM kill count when the sandbox ended) where containerd's OOM event came
    after the exit it explains, which the kubelet then reports as Error. An exit code of 137 alone is not an OOM:
    anything that SIGKILLs the sandbox ends it that way."""
    terminated = ((container or {}).get("state") or {}).get("terminated") or {}
    if terminated.get("reason") == "OOMKilled" or node_saw_oom_kill:
        return Outcome(Phase.FAILED, Reason.OOM_KILLED, failure_message(Reason.OOM_KILLED, limits),
                       {"signal": 9})
    if truncated:
        return Outcome(Phase.FAILED, Reason.OUTPUT_LIMIT_EXCEEDED,
                       failure_message(Reason.OUTPUT_LIMIT_EXCEEDED, limits))
    code = terminated.get("exitCode")
    ended = f" (the sandbox ended with exit code {code}, {terminated.get('reason') or 'no reason'})" if code else ""
    return Outcome(Phase.FAILED, Reason.INTERNAL_ERROR, f"no result from the sandbox: {problem}{ended}")
