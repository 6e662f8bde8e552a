"""The runner's side of the wire, and the only module of the runner the operator imports: the frame's prefix and
version, the reasons a frame can carry, the kinds of limit, the caps on what the program controls in a frame, and
the line a warm pod's runner prints once it has its input, and the MAC of a session's input documents."""

import hashlib
import hmac

FRAME_PREFIX = "CODERUN-RESULT-V1 "
FRAME_VERSION = 1

COMPLETED = "Completed"
NON_ZERO_EXIT = "NonZeroExit"
TIMEOUT = "Timeout"
OUTPUT_LIMIT_EXCEEDED = "OutputLimitExceeded"
SIGNALED = "Signaled"
DISK_LIMIT_EXCEEDED = "DiskLimitExceeded"
PROCESS_LIMIT_EXCEEDED = "ProcessLimitExceeded"
SANDBOX_VIOLATION = "SandboxViolation"
INVALID_INPUT = "InvalidInput"
RUNNER_ERROR = "RunnerError"
# A warm pod's input stream ended before the whole input arrived: the program never ran, so the operator may
# run it elsewhere without running it twice.
INPUT_INCOMPLETE = "InputIncomplete"
# An input of the data plane (run.json `data`) could not be laid out: the program never ran, and the frame's
# `inputError` ({path, reason, message}) says which input and why (runner data.py).
INPUT_UNAVAILABLE = "InputUnavailable"
INPUT_MISMATCH = "InputMismatch"
INPUT_TOO_LARGE = "InputTooLarge"
INPUT_REASONS = (INPUT_UNAVAILABLE, INPUT_MISMATCH, INPUT_TOO_LARGE)
# Every reason a frame can carry; only the program-never-ran ones (from InvalidInput on) come with a `message`
# (the operator words the others).
REASONS = (COMPLETED, NON_ZERO_EXIT, TIMEOUT, OUTPUT_LIMIT_EXCEEDED, SIGNALED, DISK_LIMIT_EXCEEDED,
           PROCESS_LIMIT_EXCEEDED, SANDBOX_VIOLATION, INVALID_INPUT, RUNNER_ERROR, INPUT_INCOMPLETE, *INPUT_REASONS)
# limit.kind in a frame that ended on one of the sandbox's own limits.
LIMIT_KINDS = ("disk", "inodes", "processes", "termination-log")
# Caps on what the program controls in the frame (the operator's model cuts them too).
MAX_ERROR_TYPE_CHARS = 256
MAX_ERROR_MESSAGE_CHARS = 4096
MAX_NAME_CHARS = 1024
# The frame carries this much beyond those caps: the operator redacts secrets first and cuts to the caps after,
# so a secret that straddles a cut is matched whole and never shown in part.
REDACTION_MARGIN_CHARS = 1024
# error.line is an int32 in the status.
MAX_LINE_NUMBER = 2**31 - 1
# A warm pod's runner prints this, and a digest of the input's nonce, once the whole input has arrived: the
# operator's proof that the program may be running.
ACCEPTED_PREFIX = "CODERUN-ACCEPTED "


def accepted_line(nonce_sha256: str) -> str:
    """The line a runner prints once it holds the input whose nonce has this SHA-256 (hex)."""
    return f"{ACCEPTED_PREFIX}{nonce_sha256[:16]}\n"


def cap(text: str, limit: int) -> str:
    """The head of text, marked with an ellipsis when cut: the program decides how long its strings are."""
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


# A session's first document carries its settings under this key: the key of the documents' MACs, and keepState.
SESSION_SETTINGS_KEY = "session.json"


def session_document_mac(key: bytes, sequence: int, body: bytes) -> str:
    """The MAC of a session's sequence-th authenticated input document (runner/input_stream.py checks it; the
    operator writes it on the document's length line)."""
    return hmac.new(key, b"%d\n" % sequence + body, hashlib.sha256).hexdigest()


def can_keep_state(settings: dict) -> bool:
    """Python run as `python3 -u FILE.py`, the one runtime whose sessions can keep state (runner
    kept_interpreter.py: one interpreter serves every run; the operator refuses keepState for the others)."""
    command = settings.get("command")
    return (settings.get("language") == "python" and isinstance(command, list) and len(command) == 3
            and command[0] in ("python3", "python") and command[1] == "-u" and command[2] == settings["codeFile"]
            and str(settings["codeFile"]).endswith(".py"))


def can_prestart(settings: dict) -> bool:
    """The commands a prestarted program (prestart.py) can stand in for: that Python one, and Node run as
    `node FILE.js` with the file in the work dir itself (its preload moves to the file's dir)."""
    command = settings.get("command")
    return can_keep_state(settings) or (
        settings.get("language") == "javascript" and isinstance(command, list) and len(command) == 2
        and command[0] in ("node", "nodejs") and command[1] == settings["codeFile"]
        and str(settings["codeFile"]).endswith(".js") and "/" not in str(settings["codeFile"]))


# The module a prestarted program's interpreter runs before its code comes (prestart.py's bootstrap imports it):
# the audit tells the next run's interpreter, started as a run ends, from that run's own processes by it. Node's
# counterpart is a `--require` preload, this file under the runner's root.
NODE_PRESTART_FILE = "coderun/sandbox/runner/prestarted.js"
PRESTART_MODULE = "coderun.sandbox.runner.prestarted"
# What the fork server's bootstrap adds to a prestarted program's (its forks, the programs, inherit its argv).
FORK_SERVER_MARK = ", serve_forks=True"
