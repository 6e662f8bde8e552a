"""Typed failures of the SDK. A run that ended badly (non-zero exit, its own Timeout, OOM) is NOT an exception:
it is a normal RunResult. Exceptions are for runs that never ran, waits that ran out and API failures."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic import ValidationError

if TYPE_CHECKING:
    from .result import RunResult


class CodeRunError(Exception):
    """The Kubernetes API refused or failed a request (base class of every SDK error).

    `status` is the HTTP status when the API server answered, else None (unreachable, dropped connection)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.status = status


class RunNotFound(CodeRunError):
    """The CodeRun does not exist (never created, deleted, or expired after its TTL)."""


class RunRejected(CodeRunError):
    """The operator refused to run the code (phase Rejected). `reason` is PolicyDenied or InvalidSpec."""

    def __init__(self, result: RunResult):
        self.result = result
        self.reason = result.reason
        self.rule = result.policy_rule
        super().__init__(f"CodeRun {result.name} rejected ({result.reason}"
                         + (f", rule {self.rule}" if self.rule else "") + f"): {result.message}")
        # The operator's message says what to change; keep it as the short form too.
        self.message = result.message or ""


class PolicyDenied(RunRejected):
    """The policy refused the run: `rule` names the policy rule (e.g. runtimes, maximums.memory) and
    `message` says what to change. `result` is the Rejected run, or None when the policy's validating webhook
    refused it at creation (admission: Enforce) and no CodeRun exists."""

    @classmethod
    def at_admission(cls, detail: str) -> PolicyDenied:
        """From the API server's answer: `admission webhook "..." denied the request: <message> [<rule>]`."""
        text = detail.split(ADMISSION_DENIAL, 1)[-1].strip()
        rule = re.search(r"\s*\[([A-Za-z0-9_.\[\]-]+)\]\s*$", text)
        denied = cls.__new__(cls)
        denied.result, denied.reason = None, "PolicyDenied"
        denied.rule = rule.group(1) if rule else None
        message = text[:rule.start()] if rule else text
        CodeRunError.__init__(denied, f"CodeRun refused at creation (PolicyDenied"
                              + (f", rule {denied.rule}" if denied.rule else "") + f"): {message}", 403)
        denied.message = message
        return denied


ADMISSION_DENIAL = "denied the request:"


class RunTimeout(CodeRunError):
    """The caller's wait ran out before the run finished. The run may still be going: wait again or delete it.

    Not the run's own time limit: a program that exceeded limits.timeoutSeconds is a normal RunResult
    with reason Timeout."""

    def __init__(self, name: str, namespace: str, waited_seconds: float, last: RunResult | None,
                   advice: str = "wait longer with wait(timeout=...) or delete it"):
        self.name, self.namespace, self.last, self.waited_seconds = name, namespace, last, waited_seconds
        super().__init__(f"gave up waiting for CodeRun {namespace}/{name} after {waited_seconds:.1f}s "
                         f"(last seen: {last_seen(last)}); {advice}")

    def advised(self, advice: str) -> "RunTimeout":
        """The same give-up, with what the caller can do in its own words (the CLI's flags, not the SDK's)."""
        return RunTimeout(self.name, self.namespace, self.waited_seconds, self.last, advice)


def last_seen(last: RunResult | None) -> str:
    """What the run was waiting for when the wait gave up: its phase, reason and message (the operator's words:
    queued behind the policy's cap, waiting for an approver, its pod not scheduled and why)."""
    if last is None or not last.phase:
        return "no status yet"
    said = ", ".join(filter(None, [last.reason, (last.message or "").strip()[:600]]))
    return f"{last.phase}: {said}" if said else last.phase


def raise_if_rejected(result: RunResult) -> RunResult:
    """The result, unless the operator refused the run: then PolicyDenied or RunRejected."""
    if result.rejected:
        raise (PolicyDenied if result.reason == "PolicyDenied" else RunRejected)(result)
    return result


def describe_invalid(error: ValidationError) -> str:
    """`timeout: Input should be ...; files.0.path: ...`: one line naming each field, for people and models."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}" for e in error.errors())


class InputTooLarge(CodeRunError):
    """An input file is larger than the data service takes (the namespace policy's spec.data.maxInputBytes, or the
    platform's own bound). `path` names the file as the run would see it."""

    def __init__(self, path: str, size: int, detail: str = ""):
        self.path, self.size = path, size
        super().__init__(f"input {path} ({size} bytes) is too large" + (f": {detail}" if detail else "")
                         + "; send a smaller file, or ask the platform team to raise the CodeRunPolicy's "
                           "spec.data.maxInputBytes", status=413)


    @classmethod
    def refused_by_run(cls, result: RunResult) -> InputTooLarge:
        """The run ended InputTooLarge before any upload (the operator checks the sizes the spec declares against
        the policy first): its message names the input and the cap."""
        refused = cls.__new__(cls)
        refused.path, refused.size = "", 0
        CodeRunError.__init__(refused, f"CodeRun {result.name} refused its inputs ({result.reason}): "
                                       f"{result.message}", 413)
        return refused


REASON_INPUT_TOO_LARGE = "InputTooLarge"


class UploadFailed(CodeRunError):
    """An input file could not be uploaded to the data service: `path` names it, `reason` is the service's reason
    (InputMismatch, GrantExpired, Busy, ...) or None when it could not be reached."""

    def __init__(self, path: str, reason: str | None, detail: str, status: int | None = None):
        self.path, self.reason = path, reason
        super().__init__(f"upload of input {path} failed" + (f" ({reason})" if reason else "") + f": {detail}",
                         status=status)


class ArtifactUnavailable(CodeRunError):
    """A stored artifact could not be read, or its bytes were not the ones the run recorded: `name` names it."""

    def __init__(self, run: str, name: str, detail: str, status: int | None = None):
        self.run, self.name = run, name
        super().__init__(f"artifact {name} of run {run}: {detail}", status=status)


def upload_failed_for(error: CodeRunError, run: str) -> CodeRunError:
    """The upload's failure, saying the run that waited for it was deleted (nothing else would send its bytes)."""
    error.message = f"{error.message}; run {run} was deleted"
    error.args = (error.message,)
    return error


def refused_inputs(result: RunResult) -> RunResult:
    """The run as seen while its uploads were sent, unless it ended because the files are too large
    (InputTooLarge, the caller's to fix) or the operator refused it (RunRejected)."""
    if result.reason == REASON_INPUT_TOO_LARGE:
        raise InputTooLarge.refused_by_run(result)
    return raise_if_rejected(result)
