"""The result frame: what happened, as facts for the operator to word, and the digest the termination log vouches
for it with."""

from __future__ import annotations

import hashlib
import json

from .child import ChildOutcome
from .errors import ERROR_PARSERS
from .protocol import (COMPLETED, FRAME_VERSION, MAX_ERROR_MESSAGE_CHARS, MAX_NAME_CHARS, NON_ZERO_EXIT, SIGNALED,
                       cap)


def classify(outcome: ChildOutcome) -> tuple[str, int | None, int | None]:
    """(reason, exitCode, signal) from how the child ended and why."""
    if outcome.returncode < 0:
        exit_code, signal_number = None, -outcome.returncode
    else:
        exit_code, signal_number = outcome.returncode, None
    if outcome.runner_kill_reason:
        return outcome.runner_kill_reason, exit_code, signal_number
    if signal_number is not None:
        return SIGNALED, None, signal_number
    return (COMPLETED if exit_code == 0 else NON_ZERO_EXIT), exit_code, None


def empty_stream_fields() -> dict:
    empty = hashlib.sha256(b"").hexdigest()
    return {"stdout": "", "stderr": "", "stdoutBytes": 0, "stderrBytes": 0,
            "stdoutTruncated": False, "stderrTruncated": False,
            "stdoutSha256": empty, "stderrSha256": empty}


def failure_frame(reason: str, message: str) -> dict:
    """The frame for a run whose program never ran (bad input, runner failure): the only frames with a message."""
    return {"version": FRAME_VERSION, "reason": reason, "message": cap(message, MAX_ERROR_MESSAGE_CHARS),
            "exitCode": None, "signal": None, "oomKilled": False,
            **empty_stream_fields(), "error": None,
            "metrics": {"wallMillis": 0, "cpuMillis": 0, "maxRSSBytes": 0},
            "artifacts": [], "artifactsSkipped": [], "artifactsSkippedUnlisted": 0}


def input_error_frame(path: str, reason: str, message: str) -> dict:
    """The frame for a run one of whose data-plane inputs could not be laid out: its program never started."""
    frame = failure_frame(reason, message)
    frame["inputError"] = {"path": cap(path, MAX_NAME_CHARS), "reason": reason,
                           "message": cap(message, MAX_ERROR_MESSAGE_CHARS)}
    return frame


def result_frame(spec: dict, outcome: ChildOutcome, metrics: dict, oom_killed: bool,
                 artifacts: list, skipped: list, unlisted_skipped: int) -> dict:
    reason, exit_code, signal_number = classify(outcome)
    error = None
    parse_error = ERROR_PARSERS.get(spec["language"])
    if parse_error is not None and outcome.returncode != 0:  # exit 0: any report it printed, it handled
        error = parse_error(outcome.stderr.text_for_parsing(), spec["codeFile"])
    # The operator writes every human message; the frame carries facts (reason, limit, counts) only.
    frame_limit = {"limit": outcome.limit} if outcome.limit else {}
    # The data plane's inputs, as laid out: every one was verified against its pin before the program started.
    data_inputs = (spec.get("data") or {}).get("inputs") or []
    laid_out = {"inputs": [{"path": cap(i["path"], MAX_NAME_CHARS), "size": i["size"], "sha256": i["sha256"]}
                           for i in data_inputs]} if data_inputs else {}
    return {**frame_limit, **laid_out,
        "version": FRAME_VERSION,
        "reason": reason,
        "message": "",
        "exitCode": exit_code,
        "signal": signal_number,
        "oomKilled": oom_killed,
        "stdout": outcome.stdout.text(),
        "stderr": outcome.stderr.text(),
        "stdoutBytes": outcome.stdout.total,
        "stderrBytes": outcome.stderr.total,
        "stdoutTruncated": outcome.stdout.truncated,
        "stderrTruncated": outcome.stderr.truncated,
        "stdoutSha256": outcome.stdout.digest.hexdigest(),
        "stderrSha256": outcome.stderr.digest.hexdigest(),
        "error": error,
        "metrics": metrics,
        "artifacts": artifacts,
        "artifactsSkipped": skipped,
        "artifactsSkippedUnlisted": unlisted_skipped,
    }


def encode_frame(frame: dict) -> bytes:
    """The frame's JSON text as UTF-8: the bytes printed and the bytes hashed."""
    # ASCII only: no U+2028, U+0085 or other character a reader might take for a line break.
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def termination_summary(frame: dict, frame_json: bytes) -> bytes:
    """Short cross-check (well under the 4096-byte termination message limit)."""
    summary = {"v": 1, "reason": frame["reason"], "exitCode": frame["exitCode"],
               "frameSha256": hashlib.sha256(frame_json).hexdigest()}
    return json.dumps(summary, separators=(",", ":")).encode("ascii")
