"""The runner's result frame: found, checked against the runner's digest, typed. Never trusted blindly.

The runner prints `CODERUN-RESULT-V1 <json>` as the last line of the container log and writes the sha256 of
that JSON to the termination message after every other process in the sandbox is dead. A program that prints
a forged frame (even straight to the container's stdout) cannot make it the last line with a matching digest.
"""
from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError

PREFIX = "CODERUN-RESULT-V1 "


class FrameError(Exception):
    """The frame is missing, cut short or not the runner's. `truncated` separates a cut log from a bad one."""

    def __init__(self, message: str, truncated: bool = False):
        super().__init__(message)
        self.truncated = truncated


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ProgramError(_Lenient):
    type: str = Field(max_length=256)
    message: str = Field(max_length=4096)
    line: int | None = None


class FrameMetrics(_Lenient):
    wallMillis: int | None = None
    cpuMillis: int | None = None
    maxRSSBytes: int | None = None


class FrameArtifact(_Lenient):
    name: str = Field(max_length=1024)
    size: int
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    contentBase64: str


class FrameSkipped(_Lenient):
    name: str = Field(max_length=1024)
    why: str = Field(max_length=64)


class RunnerFrame(_Lenient):
    version: int
    reason: str = Field(max_length=64)
    message: str = Field("", max_length=4096)
    exitCode: int | None = None
    signal: int | None = None
    oomKilled: bool = False
    stdout: str = ""
    stderr: str = ""
    stdoutBytes: int = 0
    stderrBytes: int = 0
    stdoutTruncated: bool = False
    stderrTruncated: bool = False
    stdoutSha256: str | None = None
    stderrSha256: str | None = None
    error: ProgramError | None = None
    metrics: FrameMetrics = FrameMetrics()
    startedAtMillis: int | None = None
    artifacts: list[FrameArtifact] = []
    artifactsSkipped: list[FrameSkipped] = []


def parse_frame(log: str, termination_message: str | None, log_complete: bool = True) -> RunnerFrame:
    """The last frame line of the log, if the runner's termination message vouches for it."""
    frame_line = None
    for line in reversed(log.splitlines()):
        if line.startswith(PREFIX):
            frame_line = line[len(PREFIX):]
            break
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
    try:
        return RunnerFrame.model_validate(json.loads(frame_line))
    except (ValueError, ValidationError) as e:
        raise FrameError(f"the result frame is not valid: {str(e)[:300]}") from e


def _vouched_digest(termination_message: str | None) -> str | None:
    try:
        digest = json.loads(termination_message or "").get("frameSha256")
    except (ValueError, AttributeError):
        return None
    return digest if isinstance(digest, str) else None
