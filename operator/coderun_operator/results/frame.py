"""The runner's result frame: found, checked against the runner's digest, typed. Never trusted blindly.

The runner prints `CODERUN-RESULT-V1 <json>` as the last line of the container log and writes the sha256 of
that JSON to the termination message after every other process in the sandbox is dead. A program that prints
a forged frame (even straight to the container's stdout) cannot make it the last line with a matching digest.

Everything inside a vouched frame is still the program's doing (its output, its exception, its file names),
so the model bounds rather than refuses: long strings are cut, integers outside int64 become null. A frame
is only rejected when it is not the runner's, never because of what the program printed.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from signal import SIGKILL
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from coderun.sandbox.runner.protocol import (FRAME_PREFIX, MAX_ERROR_MESSAGE_CHARS, MAX_ERROR_TYPE_CHARS,
                                             MAX_NAME_CHARS, REDACTION_MARGIN_CHARS, SIGNALED, cap)

PREFIX = FRAME_PREFIX  # the runner spells the protocol; the operator reads it
INT64_MAX = 2**63 - 1


class FrameError(Exception):
    """The frame is missing, cut short or not the runner's. `truncated` separates a cut log from a bad one."""

    def __init__(self, message: str, truncated: bool = False):
        super().__init__(message)
        self.truncated = truncated


def _capped(limit: int) -> BeforeValidator:
    return BeforeValidator(lambda value: cap(value, limit) if isinstance(value, str) else value)


def _capped_for_redaction(limit: int) -> BeforeValidator:
    """What the program wrote, kept past the status's cap by the runner's margin: redacted first, cut after."""
    return _capped(limit + REDACTION_MARGIN_CHARS)


def _int64(value: Any) -> Any:
    """An integer the API server can store (int64), else null: a program must not make the status unwritable."""
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64_MAX <= value <= INT64_MAX:
        return None
    return value


Int = Annotated[int | None, BeforeValidator(_int64)]
Size = Annotated[int, BeforeValidator(lambda v: min(max(v, 0), INT64_MAX) if isinstance(v, int) else v)]


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ProgramError(_Lenient):
    type: Annotated[str, _capped_for_redaction(MAX_ERROR_TYPE_CHARS)]
    message: Annotated[str, _capped_for_redaction(MAX_ERROR_MESSAGE_CHARS)]
    line: Int = None


class FrameMetrics(_Lenient):
    wallMillis: Int = None
    cpuMillis: Int = None
    maxRSSBytes: Int = None


class FrameArtifact(_Lenient):
    name: Annotated[str, _capped_for_redaction(MAX_NAME_CHARS)]
    size: Size
    sha256: str
    contentBase64: str = ""
    stored: bool = False  # the runner put it in the store (docs/data.md); no content in the frame


class FrameInput(_Lenient):
    """An input by reference as the runner laid it out (the hash it computed as the bytes came)."""
    path: Annotated[str, _capped(255)]
    size: Size
    sha256: Annotated[str, _capped(64)]


class FrameInputError(_Lenient):
    """Why the runner did not start the program: an input it could not have."""
    path: Annotated[str, _capped(255)]
    reason: Annotated[str, _capped(64)]
    message: Annotated[str, _capped_for_redaction(MAX_ERROR_MESSAGE_CHARS)] = ""


class FrameSkipped(_Lenient):
    name: Annotated[str, _capped_for_redaction(MAX_NAME_CHARS)]
    why: Annotated[str, _capped(64)]


class FrameLimit(_Lenient):
    """Which sandbox limit the runner enforced: disk, inodes, processes or termination-log."""
    kind: Annotated[str, _capped(32)]
    limit: Int = None
    observed: Int = None


class RunnerFrame(_Lenient):
    version: int
    reason: Annotated[str, _capped(64)]
    message: Annotated[str, _capped_for_redaction(MAX_ERROR_MESSAGE_CHARS)] = ""
    exitCode: Int = None
    signal: Int = None
    oomKilled: bool = False
    stdout: str = ""
    stderr: str = ""
    stdoutBytes: Size = 0
    stderrBytes: Size = 0
    stdoutTruncated: bool = False
    stderrTruncated: bool = False
    stdoutSha256: str | None = None
    stderrSha256: str | None = None
    error: ProgramError | None = None
    metrics: FrameMetrics = FrameMetrics()
    startedAtMillis: Int = None
    artifacts: list[FrameArtifact] = []
    artifactsSkipped: list[FrameSkipped] = []
    artifactsSkippedUnlisted: Size = 0
    inputs: list[FrameInput] = []
    inputError: FrameInputError | None = None
    limit: FrameLimit | None = None
    nonce: str | None = None  # a warm pod's: the nonce the operator sent with the input
    prestarted: bool = False  # the program ran in a process started before its code came (runner prestart.py)
    # keepState: why the session's interpreter could not go on after this run (runner kept_interpreter.py); it ended
    interpreterLost: Annotated[str, _capped(256)] | None = None

    @property
    def killed_unexplained(self) -> bool:
        """The program died of a SIGKILL the runner did not send and cannot explain: most often the node's OOM
        killer (gVisor's cgroupfs keeps no OOM count for the runner to read), which only the node can tell."""
        return self.reason == SIGNALED and self.signal == SIGKILL and not self.oomKilled


def _last_frame_line(log: str) -> str | None:
    # Split on "\n" only: str.splitlines() also splits on U+2028, U+0085 and friends, which a program may print.
    for line in reversed(log.split("\n")):
        if line.startswith(PREFIX):
            return line[len(PREFIX):].rstrip("\r")
    return None


def parse_frame(log: str, termination_message: str | None, log_complete: bool = True) -> RunnerFrame:
    """The last frame line of the log, if the runner's termination message vouches for it."""
    frame_line = _last_frame_line(log)
    if frame_line is None:
        raise FrameError("the sandbox printed no result frame" +
                         ("" if log_complete else " within the log bytes read"), truncated=not log_complete)
    expected = _vouched_digest(termination_message)
    actual = hashlib.sha256(frame_line.encode("utf-8", "surrogatepass")).hexdigest()
    if expected is None:
        raise FrameError("the runner's termination message is missing or unreadable, so the frame is not trusted")
    if actual != expected:
        raise FrameError("the last result frame does not match the runner's digest (cut short or forged)",
                         truncated=not log_complete)
    return _typed(json_frame(frame_line))


def parse_streamed_frame(stream: str, nonce: str) -> RunnerFrame:
    """A warm pod's frame as the attach stream carried it, vouched by the nonce the operator sent with the input
    (the runner read it before the program existed and the program cannot read the runner's memory). The
    termination message, the cold path's proof, only arrives with the kubelet's relist: too late to wait for."""
    frame_line = _last_frame_line(stream)
    if frame_line is None:
        raise FrameError("the attach stream carried no result frame")
    raw = json_frame(frame_line)
    if not isinstance(raw, dict) or not hmac.compare_digest(str(raw.get("nonce", "")), nonce):
        raise FrameError("the streamed frame does not carry this claim's nonce")
    return _typed(raw)


def logged_frame(log: str, nonce: str) -> RunnerFrame | None:
    """The frame line carrying this nonce in a sandbox's log, wherever it is among others (an earlier run's, the
    runner's answers to documents it dropped, lines the program wrote through the runner's stdout); None if none
    does, or it is not a valid frame."""
    marker = f'"nonce":"{nonce}"'
    for line in reversed(log.split("\n")):
        if line.startswith(PREFIX) and marker in line:
            try:
                raw = json_frame(line[len(PREFIX):].rstrip("\r"))
                if isinstance(raw, dict) and hmac.compare_digest(str(raw.get("nonce", "")), nonce):
                    return _typed(raw)
            except FrameError:
                return None
    return None


def json_frame(frame_line: str) -> Any:
    try:
        return json.loads(frame_line)
    except (ValueError, RecursionError) as e:
        raise FrameError(f"the result frame is not valid: {str(e)[:300]}") from e


def _typed(raw: Any) -> RunnerFrame:
    try:
        return RunnerFrame.model_validate(raw)
    except ValidationError as e:
        raise FrameError(f"the result frame is not valid: {str(e)[:300]}") from e


def _vouched_digest(termination_message: str | None) -> str | None:
    try:
        digest = json.loads(termination_message or "").get("frameSha256")
    except (ValueError, AttributeError, RecursionError):
        return None
    return digest if isinstance(digest, str) else None
