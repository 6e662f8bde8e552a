#!/usr/bin/env python3
"""coderun sandbox runner: PID 1 of every sandbox container.

Runs one untrusted program as a child, enforces the time limit and the output
caps, measures it, collects its artifacts and prints exactly one framed JSON
result line (``CODERUN-RESULT-V1 {...}``) on its own stdout, then writes a
digest of that frame to the termination log so the operator can tell the real
frame from a forged one.

Standard library only: this file is copied as-is into every sandbox image.
The pure functions are importable by path for tests and for the operator.
"""

from __future__ import annotations

import base64
import collections
import errno
import hashlib
import json
import os
import re
import resource
import select
import selectors
import signal
import stat
import subprocess
import sys
import threading
import time
import types

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
# Every reason a frame can carry; only the last three come with a `message` (the operator words the others).
REASONS = (COMPLETED, NON_ZERO_EXIT, TIMEOUT, OUTPUT_LIMIT_EXCEEDED, SIGNALED, DISK_LIMIT_EXCEEDED,
           PROCESS_LIMIT_EXCEEDED, SANDBOX_VIOLATION, INVALID_INPUT, RUNNER_ERROR, INPUT_INCOMPLETE)
# limit.kind in a frame that ended on one of the sandbox's own limits.
LIMIT_KINDS = ("disk", "inodes", "processes", "termination-log")

DEFAULT_OUTPUT_BYTES = 65536
DEFAULT_FLOOD_BYTES = 1048576
DEFAULT_ARTIFACT_CAPS = {"maxFiles": 16, "maxFileBytes": 262144, "maxTotalBytes": 524288}
DEFAULT_MAX_INODES = 16384
DEFAULT_MAX_PROCESSES = 128
# Caps on what the program controls in the frame (the operator's model cuts them too).
MAX_ERROR_TYPE_CHARS = 256
MAX_ERROR_MESSAGE_CHARS = 4096
MAX_NAME_CHARS = 1024
# The frame carries this much beyond those caps: the operator redacts secrets first and cuts to the caps after,
# so a secret that straddles a cut is matched whole and never shown in part.
REDACTION_MARGIN_CHARS = 1024
MAX_LINE_NUMBER = 2**31 - 1
# Accepted ranges of the sandbox limits in run.json (an RLIMIT must fit the kernel's type; PID_MAX_LIMIT).
MAX_DISK_BYTES = 2**62
MAX_INODES = 2**31 - 1
MAX_PROCESSES = 4194304
# How often the sandbox's limits are checked while the program runs; a big /tmp tree is walked less often so
# the walk costs at most 1/GUARD_COST_RATIO of the time.
GUARD_INTERVAL_SECONDS = 0.2
PROGRAM_NICENESS = 10
# Two and a half guard intervals: a zombie lives through at least two checks before the namespace's init reaps it.
ORPHAN_REAP_SECONDS = 0.5
NPROC_HEADROOM = 64
GUARD_COST_RATIO = 20
GUARD_NEAR_LIMIT_SECONDS = 1.0
# Signals a program may send to PID 1: a no-op handler (reset to the default at exec, unlike SIG_IGN, which
# the program would inherit) keeps the runner alive to report.
SHIELDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGPIPE")
# A program can create thousands of unwanted files; listing every one would
# bloat the frame, so only this many skipped entries are reported.
MAX_SKIPPED_LISTED = 64
# Once the child is gone, how long to keep reading pipes that an escaped
# process (only possible when the runner is not PID 1) may still hold open.
DRAIN_GRACE_SECONDS = 0.5
READ_CHUNK = 65536
DELETED_MARK = " (deleted)"
# Past any descriptor a process here holds (the runner opens a handful).
MAX_CLOSE_FD = 65536
TAIL_BYTES = 16384
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
# Per cent of the memory limit V8's old space may take: the rest is the young generation, code and Node's own.
V8_HEAP_SHARE = 80
# What V8 prints when its heap is full, or memory for it cannot be had, before it aborts: the program ran out
# of memory, as an OOM kill says.
V8_HEAP_EXHAUSTED = re.compile(r"^(FATAL ERROR: .*JavaScript heap out of memory|# Fatal process out of memory)", re.M)
# Kubernetes ConfigMap key rules: a key never names another file or a dir.
CONFIGMAP_KEY = re.compile(r"^(?!\.\.)[-._a-zA-Z0-9]+$")


class InvalidInput(Exception):
    """The input ConfigMap is malformed or asks for something unsafe."""


# ---------------------------------------------------------------- input


def validate_relative_path(path: object, what: str) -> str:
    """Return a normalised relative path, or raise InvalidInput.

    Defence in depth: the API rejects these too, but the runner must never
    write outside its work dir whatever the ConfigMap says.
    """
    if not isinstance(path, str) or not path or "\0" in path:
        raise InvalidInput(f"{what}: path must be a non-empty string")
    if path.startswith("/"):
        raise InvalidInput(f"{what}: absolute path {path!r} is not allowed")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidInput(f"{what}: path {path!r} must not contain '..'")
    if not parts:
        raise InvalidInput(f"{what}: path {path!r} names no file")
    return "/".join(parts)


def resolve_inside(root: str, relative: str) -> str:
    """Join and check that the result (symlinks resolved) stays under root."""
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(real_root, relative))
    if os.path.commonpath([real_root, target]) != real_root or target == real_root:
        raise InvalidInput(f"path {relative!r} resolves outside the work dir")
    return target


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidInput(message)


def _non_negative_int(value: object, field: str) -> int:
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
             f"run.json: {field} must be a non-negative integer")
    return value  # type: ignore[return-value]


def _limit(value: object, field: str, maximum: int) -> int:
    """A sandbox limit: 0 would stop every program at once, and an RLIMIT must fit the kernel's type."""
    _require(isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= maximum,
             f"run.json: {field} must be an integer from 1 to {maximum}")
    return value  # type: ignore[return-value]


def parse_run_spec(raw: dict) -> dict:
    """Validate run.json and fill defaults; raise InvalidInput on anything odd."""
    _require(isinstance(raw, dict), "run.json must be a JSON object")
    _require(raw.get("version") == 1, "run.json: version must be 1")
    command = raw.get("command")
    _require(isinstance(command, list) and bool(command)
             and all(isinstance(a, str) and "\0" not in a for a in command),
             "run.json: command must be a non-empty list of strings")
    timeout = raw.get("timeoutSeconds")
    _require(isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
             and 0 < timeout < 86400, "run.json: timeoutSeconds must be a positive number")
    caps = dict(DEFAULT_ARTIFACT_CAPS)
    artifacts = raw.get("artifacts") or {}
    _require(isinstance(artifacts, dict), "run.json: artifacts must be an object")
    for name in caps:
        if name in artifacts:
            caps[name] = _non_negative_int(artifacts[name], f"artifacts.{name}")
    env = raw.get("env") or {}
    _require(isinstance(env, dict) and all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k
        and "\0" not in k + v for k, v in env.items()),
        "run.json: env must map names (no '=') to strings")
    stdin_key = raw.get("stdinKey")
    _require(stdin_key is None or (isinstance(stdin_key, str) and CONFIGMAP_KEY.match(stdin_key)),
             "run.json: stdinKey must be null or a ConfigMap key")
    code_file = validate_relative_path(raw.get("codeFile"), "codeFile")
    files = raw.get("files") or []
    _require(isinstance(files, list), "run.json: files must be a list")
    seen = {code_file}
    checked_files = []
    for index, entry in enumerate(files):
        _require(isinstance(entry, dict), f"run.json: files[{index}] must be an object")
        path = validate_relative_path(entry.get("path"), f"files[{index}]")
        key = entry.get("key")
        _require(isinstance(key, str) and bool(CONFIGMAP_KEY.match(key)),
                 f"files[{index}]: key must be a ConfigMap key")
        _require(path not in seen, f"files[{index}]: path {path!r} is used twice")
        seen.add(path)
        checked_files.append({"path": path, "key": key})
    flood = raw.get("floodBytes", DEFAULT_FLOOD_BYTES)
    disk, memory = raw.get("diskBytes"), raw.get("memoryBytes")
    return {
        "diskBytes": None if disk is None else _limit(disk, "diskBytes", MAX_DISK_BYTES),
        "memoryBytes": None if memory is None else _limit(memory, "memoryBytes", MAX_DISK_BYTES),
        "maxInodes": _limit(raw.get("maxInodes", DEFAULT_MAX_INODES), "maxInodes", MAX_INODES),
        "maxProcesses": _limit(raw.get("maxProcesses", DEFAULT_MAX_PROCESSES), "maxProcesses", MAX_PROCESSES),
        "language": raw.get("language"),
        "command": command,
        "codeFile": code_file,
        "timeoutSeconds": float(timeout),
        "outputBytes": _non_negative_int(raw.get("outputBytes", DEFAULT_OUTPUT_BYTES), "outputBytes"),
        "floodBytes": _non_negative_int(flood, "floodBytes"),
        "artifacts": caps,
        "files": checked_files,
        "stdinKey": stdin_key,
        "env": env,
    }


def read_input_key(input_dir: str, key: str) -> bytes:
    """Read one ConfigMap key (a symlink into ..data, which is followed)."""
    try:
        with open(os.path.join(input_dir, key), "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise InvalidInput(f"input key {key!r} is missing") from None


def load_run_spec(input_dir: str) -> dict:
    try:
        raw = json.loads(read_input_key(input_dir, "run.json"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"run.json is not valid JSON: {exc}") from None
    return parse_run_spec(raw)


# The warm pool's input (`--input-stdin`): one ASCII decimal length, a newline, then that many bytes of JSON
# {"nonce": str, "data": {key: text}, "binaryData": {key: base64}}: the input ConfigMap's keys, plus the nonce
# the runner puts in its frame so the operator can trust a frame read from the attach stream.
ACCEPTED_PREFIX = "CODERUN-ACCEPTED "
MAX_STDIN_INPUT_BYTES = 16 * 1024 * 1024
NONCE = re.compile(r"^[0-9a-f]{32,128}$")


class InputIncomplete(Exception):
    """The input stream ended (or broke) before the whole document arrived."""


def read_exactly(stream, count: int) -> bytes:
    chunks, missing = [], count
    while missing:
        chunk = stream.read(min(missing, READ_CHUNK))
        if not chunk:
            raise InputIncomplete(f"the input stream ended after {count - missing} of {count} bytes")
        chunks.append(chunk)
        missing -= len(chunk)
    return b"".join(chunks)


def read_stdin_input(stream, input_dir: str) -> str:
    """Read the warm pool's input document from `stream` into `input_dir`, laid out as the ConfigMap mount is
    (one file per key), and return the nonce. InputIncomplete on a short stream, InvalidInput on a bad one."""
    header = stream.readline(24)
    if not header.endswith(b"\n"):
        raise InputIncomplete("the input stream ended before its length line")
    _require(header[:-1].isdigit(), "the input's length line is not a decimal number")
    length = int(header)
    _require(0 < length <= MAX_STDIN_INPUT_BYTES, f"the input is larger than {MAX_STDIN_INPUT_BYTES} bytes")
    try:
        document = json.loads(read_exactly(stream, length))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidInput(f"the input is not valid JSON: {str(exc)[:200]}") from None
    _require(isinstance(document, dict), "the input must be a JSON object")
    nonce, data, binary = document.get("nonce"), document.get("data") or {}, document.get("binaryData") or {}
    _require(isinstance(nonce, str) and bool(NONCE.match(nonce)), "the input's nonce must be 32-128 hex digits")
    _require(isinstance(data, dict) and isinstance(binary, dict), "data and binaryData must be objects")
    os.makedirs(input_dir, mode=0o700, exist_ok=True)
    for key, value in [*data.items(), *binary.items()]:
        _require(isinstance(key, str) and bool(CONFIGMAP_KEY.match(key)) and isinstance(value, str),
                 f"input key {str(key)[:64]!r} must be a ConfigMap key with a string value")
        content = value.encode("utf-8", "surrogatepass") if key in data else _base64(value, key)
        write_new_file(input_dir, key, content)
    return nonce


def _base64(value: str, key: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise InvalidInput(f"input key {key!r} is not valid base64") from None


def write_new_file(work_dir: str, relative: str, content: bytes) -> None:
    """Create one input file under work_dir; never through a symlink."""
    target = resolve_inside(work_dir, relative)
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        resolve_inside(work_dir, relative)  # parents exist now: re-check them
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError as exc:  # e.g. "a" and "a/b" both given
        raise InvalidInput(f"cannot create {relative!r}: {exc.strerror}") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)


def materialise_inputs(spec: dict, input_dir: str, work_dir: str) -> None:
    os.makedirs(work_dir, exist_ok=True)
    write_new_file(work_dir, spec["codeFile"], read_input_key(input_dir, "code"))
    for entry in spec["files"]:
        write_new_file(work_dir, entry["path"], read_input_key(input_dir, entry["key"]))


def child_environment(spec_env: dict, scratch_dir: str, home_dir: str, outputs_dir: str,
                      memory_bytes: int | None = None) -> dict:
    """The whole environment of the child: nothing leaks in from the runner's.

    scratch_dir is the parent of the work dir (/tmp in the pod), the only
    writable place, so HOME, TMPDIR and matplotlib's cache live there.
    Node's heap is sized from the memory limit (V8 would take about half of
    it, and abort there, long before the limit).
    """
    env = {
        "PATH": BASE_PATH,
        "HOME": home_dir,
        "TMPDIR": scratch_dir,
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": os.path.join(scratch_dir, ".matplotlib"),
        "CODERUN_OUTPUT_DIR": outputs_dir,
    }
    if memory_bytes is not None:
        heap_mib = max(memory_bytes * V8_HEAP_SHARE // 100 // 1048576, 16)
        env["NODE_OPTIONS"] = f"--max-old-space-size={heap_mib}"
    env.update(spec_env)
    return env


# ---------------------------------------------------------------- output capture


def trim_partial_utf8(data: bytes) -> bytes:
    """Drop a multi-byte UTF-8 character cut in half at the end of data."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        sequence_length = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
        return data[:-back] if sequence_length > back else data
    return data


class StreamCapture:
    """Keeps the first `limit` bytes of a stream but counts and hashes all of it.

    It also keeps the last TAIL_BYTES, so a traceback at the end of a long
    stderr can still be parsed when the kept head is truncated.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.kept = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.digest = hashlib.sha256()

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]
        self.tail += chunk[-TAIL_BYTES:]
        del self.tail[:-TAIL_BYTES]
        self.total += len(chunk)
        self.digest.update(chunk)

    @property
    def truncated(self) -> bool:
        return self.total > len(self.kept)

    def text(self) -> str:
        data = bytes(self.kept)
        if self.truncated:
            data = trim_partial_utf8(data)
        return data.decode("utf-8", errors="replace")

    def text_for_parsing(self) -> str:
        """The end of the stream, where an error report is."""
        data = self.tail if self.truncated else self.kept
        return bytes(data).decode("utf-8", errors="replace")


# ---------------------------------------------------------------- processes


def kill_process_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def proc_stats(own_pid: int):
    """(pid, the fields of /proc/<pid>/stat after the command name) for every process but us."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == own_pid:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                yield int(name), handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue


def live_process_ids(own_pid: int) -> list[int]:
    """Every process in /proc except us and zombies (they are already dead)."""
    return [pid for pid, fields in proc_stats(own_pid) if fields[0] not in (b"Z", b"X")]


def reap_zombies() -> None:
    """As PID 1 we inherit orphans; reap them so /proc empties."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_all_other_processes(max_seconds: float = 2.0) -> None:
    """Only when PID 1 of the sandbox: no escaped daemon may outlive the frame.

    kill(-1) reaches every process of the PID namespace but its init in one pass that a fork cannot slip
    through (a fork racing the signal fails); the listing loop then reaps and confirms, and is the fallback.
    """
    own_pid = os.getpid()
    give_up = time.monotonic() + max_seconds
    while time.monotonic() < give_up:
        if own_pid == 1:  # never outside a PID namespace of our own: kill(-1) there would hit the whole host
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:  # ESRCH: nothing left
                pass
        alive = live_process_ids(own_pid)
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)
        reap_zombies()


# ---------------------------------------------------------------- sandbox limits


# The walk of the scratch dir holds one open directory per level down to this depth; deeper directories are
# opened by their path below the deepest one held, in pieces well under PATH_MAX (a path the program made
# longer than PATH_MAX cannot hide what is below it).
WALK_HELD_DIRS = 64
PATH_PIECE_CHARS = 1000
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_program_dir(path: str, dir_fd: int) -> int | None:
    """Open a directory of the program's below dir_fd, never through a symlink at its end.

    The runner has the program's uid, not root's override: a directory the program made unreadable or
    unsearchable to hide what is in it gets its owner's rwx bits back (only the program's own files can be
    changed so, and only their mode)."""
    try:
        fd = os.open(path, DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        return _reopen_with_owner_access(path, dir_fd)
    except OSError:
        return None
    try:
        mode = os.fstat(fd).st_mode
        if mode & 0o500 != 0o500:
            os.fchmod(fd, stat.S_IMODE(mode) | 0o700)
    except OSError:
        pass
    return fd


def _reopen_with_owner_access(path: str, dir_fd: int) -> int | None:
    try:
        handle = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(os.fstat(handle).st_mode) | 0o700)
        return os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        os.close(handle)


def open_dir_by_pieces(path: str, anchor_fd: int) -> int | None:
    """open_program_dir for a relative path of any length: PATH_PIECE_CHARS at a time."""
    fd: int | None = anchor_fd
    try:
        while fd is not None and len(path) > PATH_PIECE_CHARS:
            cut = path.rfind("/", 0, PATH_PIECE_CHARS)  # a name is at most 255 bytes: there is one
            parent, fd = fd, open_program_dir(path[:cut], fd) if cut > 0 else None
            path = path[cut + 1:]
            if parent != anchor_fd:
                os.close(parent)
        return None if fd is None else open_program_dir(path, fd)
    finally:
        if fd is not None and fd != anchor_fd:
            os.close(fd)


class ScratchWalk:
    """One bounded walk of a directory tree: bytes allocated (st_blocks, a hard-linked file once) and inodes
    (directory entries), never following a symlink, stopping once the count passes max_inodes or the bytes pass
    max_bytes. Without bytes it needs no stat() at all (the directory entry says what is a directory): about
    15x cheaper."""

    def __init__(self, max_inodes: int, with_bytes: bool, max_bytes: int | None = None):
        self.max_inodes, self.with_bytes = max_inodes, with_bytes
        self.max_bytes = max_bytes if with_bytes and max_bytes is not None else float("inf")
        self.used = self.inodes = 0
        self.linked: set[tuple[int, int]] = set()

    @property
    def done(self) -> bool:
        return self.inodes > self.max_inodes or self.used > self.max_bytes

    def subdirs(self, fd: int) -> list[str]:
        """Count the entries of the open directory fd; the names of its subdirectories."""
        names = []
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    self.inodes += 1
                    try:
                        if self.with_bytes:
                            info = entry.stat(follow_symlinks=False)
                            if info.st_nlink < 2 or stat.S_ISDIR(info.st_mode) or self._first_link(info):
                                self.used += info.st_blocks * 512
                        if entry.is_dir(follow_symlinks=False):
                            names.append(entry.name)
                    except OSError:
                        pass
                    if self.done:
                        break
        except OSError:
            pass
        return names

    def _first_link(self, info: os.stat_result) -> bool:
        key = (info.st_dev, info.st_ino)
        if key in self.linked:
            return False
        self.linked.add(key)
        return True

    def tree(self, root: str) -> None:
        try:
            root_fd = os.open(root, DIR_FLAGS)
        except OSError:
            return
        stack = [(root_fd, self.subdirs(root_fd))]  # (open directory, its subdirectories still to walk)
        try:
            while stack and not self.done:
                fd, names = stack[-1]
                if not names:
                    stack.pop()
                    os.close(fd)
                elif len(stack) < WALK_HELD_DIRS:
                    child = open_program_dir(names.pop(), fd)
                    if child is not None:
                        stack.append((child, self.subdirs(child)))
                else:
                    self._below(fd, names.pop())
        finally:
            for fd, _ in stack:
                os.close(fd)

    def _below(self, anchor_fd: int, top: str) -> None:
        """A subtree deeper than the held directories, walked by paths relative to anchor_fd."""
        pending = [top]
        while pending and not self.done:
            path = pending.pop()
            fd = open_dir_by_pieces(path, anchor_fd)
            if fd is None:
                continue
            try:
                pending.extend(f"{path}/{name}" for name in self.subdirs(fd))
            finally:
                os.close(fd)


def scratch_usage(root: str, max_inodes: int, with_bytes: bool = True,
                  max_bytes: int | None = None) -> tuple[int, int]:
    """(bytes allocated, inodes) under root, each counted only a little past its cap; see ScratchWalk."""
    walk = ScratchWalk(max_inodes, with_bytes, max_bytes)
    walk.tree(root)
    return walk.used, walk.inodes


def is_unlinked(target: str, info: os.stat_result) -> bool:
    """gVisor keeps st_nlink at 1 for a deleted file that is still open; the link's " (deleted)" mark, checked
    against the path itself (a file may be named so), tells it there."""
    if info.st_nlink == 0:
        return True
    return target.endswith(DELETED_MARK) and not _names(target, info) and not _names(target[:-len(DELETED_MARK)], info)


def _names(path: str, info: os.stat_result) -> bool:
    try:
        named = os.lstat(path)
    except OSError:
        return False
    return (named.st_dev, named.st_ino) == (info.st_dev, info.st_ino)


def unlinked_open_bytes(pids: list[int], root: str) -> int:
    """Bytes of files under root that the program deleted but still holds open: their blocks stay allocated
    and no walk sees them (open, unlink, write is the classic way to hide disk use). A process that made
    itself undumpable hides its fds from us; its files still count against the pod's own limit."""
    prefix = root.rstrip("/") + "/"
    used, seen = 0, set()
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
                if not target.startswith(prefix):
                    continue
                info = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            key = (info.st_dev, info.st_ino)
            if stat.S_ISREG(info.st_mode) and key not in seen and is_unlinked(target, info):
                seen.add(key)
                used += info.st_blocks * 512
    return used


def program_processes(own_pid: int, session: int | None, child: int | None = None) -> list[int]:
    """Processes, zombies included (they hold a PID and count against RLIMIT_NPROC until reaped, so a fork
    bomb of short-lived processes is seen too): all but us as PID 1 of the sandbox, else the program's session.

    As PID 1 the runner is the init that orphans are handed to: their zombies are reaped here (all but the
    program's own process, `child`, whose exit status the run loop collects). They still count this once, so
    a bomb of short-lived processes meets the cap within one check, while orphans that come and go over a long
    run never add up to it."""
    pids = []
    for pid, fields in proc_stats(own_pid):
        if session is None and fields[0] == b"Z" and int(fields[1]) == own_pid and pid != child:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        if session is None or int(fields[3]) == session:
            pids.append(pid)
    return pids


def count_processes(own_pid: int, session: int | None) -> int:
    return len(program_processes(own_pid, session))


def lower_rlimit(which: int, value: int) -> None:
    """Set soft and hard limit to value, or leave the hard limit where it is if it is lower already (raising it
    is not allowed: the run would fail on a policy's generous cap)."""
    hard = resource.getrlimit(which)[1]
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


class Guards:
    """The sandbox's own limits, checked while the program runs and once more when it is gone: /tmp bytes
    and inodes (the kubelet would evict only a minute later), the process count, and the termination log
    (a host file outside disk accounting that belongs to the runner)."""

    def __init__(self, scratch_dir: str, disk_bytes: int | None, max_inodes: int, max_processes: int,
                 termination_fd: int | None, is_pid1: bool, input_dir: str | None = None):
        self.scratch_dir, self.disk_bytes, self.max_inodes = scratch_dir, disk_bytes, max_inodes
        self.input_dir = input_dir
        self.max_processes, self.termination_fd, self.is_pid1 = max_processes, termination_fd, is_pid1
        self.session: int | None = None
        self.next_check = 0.0
        self.next_bytes_check = 0.0
        self.near_limit = False

    def child_limits(self) -> None:
        """In the child before exec: the kernel stops a single file at the disk limit (the termination log, a host
        file outside disk accounting, too) and forks at the cap (RLIMIT_NPROC counts the uid's processes: the
        runner is one of them); as PID 1, the program gets a PID namespace of its own (it cannot signal us) and a
        mount namespace in which the raw input is hidden; and the syscall filter goes on last."""
        if self.disk_bytes is not None:
            lower_rlimit(resource.RLIMIT_FSIZE, self.disk_bytes)
        # The program yields the CPU to the runner when they compete (a fork bomb would starve it otherwise);
        # alone on its CPUs it runs as fast as ever.
        os.nice(PROGRAM_NICENESS)
        if self.is_pid1:
            # Tasks, threads included, the runner's among them: headroom above the cap the runner counts, so the
            # count meets the cap first (and says so), while a fork bomb stays far below the pod's PID limit.
            lower_rlimit(resource.RLIMIT_NPROC, self.max_processes + NPROC_HEADROOM)
            enter_program_namespaces(self.max_processes, self.input_dir)
        install_syscall_filter()

    def due(self, now: float) -> bool:
        return now >= self.next_check

    def check(self, now: float, final: bool = False) -> tuple[str, dict] | None:
        """(reason, limit) when a limit is broken, else None; schedules the next check. Counting files is
        cheap and done every time; summing their bytes (a stat each) backs off on big trees."""
        # The cost is the runner's own CPU time, not wall time: a fork bomb that starves the runner must not
        # also stretch the pause before the next check.
        started = time.process_time()
        with_bytes = final or now >= self.next_bytes_check
        verdict = self._check(with_bytes)
        cost = time.process_time() - started
        # Every check waits GUARD_COST_RATIO times its own cost before the next one, so the checks together take
        # at most 1/(GUARD_COST_RATIO + 1) of a core; the costlier bytes walk comes every other such pause at most,
        # the cheap counts in between.
        pause = max(GUARD_INTERVAL_SECONDS, cost * GUARD_COST_RATIO)
        if self.near_limit:
            # Past half a limit, a costly walk (e.g. thousands of directories) must not put the next look beyond
            # the flood: at least every GUARD_NEAR_LIMIT_SECONDS then, at up to half a core.
            pause = min(pause, max(GUARD_NEAR_LIMIT_SECONDS, cost))
        self.next_check = now + pause
        if with_bytes:
            self.next_bytes_check = now + (pause if self.near_limit
                                           else max(GUARD_INTERVAL_SECONDS, 2 * cost * GUARD_COST_RATIO))
        return verdict

    def _check(self, with_bytes: bool) -> tuple[str, dict] | None:
        if self.termination_fd is not None:
            try:
                written = os.fstat(self.termination_fd).st_size
            except OSError:
                written = 0
            if written > 0:
                return SANDBOX_VIOLATION, {"kind": "termination-log", "limit": 0, "observed": written}
        pids = self._processes()
        verdict = self._at_process_cap(pids)
        if verdict:
            return verdict
        used, inodes = scratch_usage(self.scratch_dir, self.max_inodes, with_bytes, self.disk_bytes)
        self.near_limit = 2 * inodes > self.max_inodes or (
            with_bytes and self.disk_bytes is not None and 2 * used > self.disk_bytes)
        if inodes > self.max_inodes:
            return DISK_LIMIT_EXCEEDED, {"kind": "inodes", "limit": self.max_inodes, "observed": inodes}
        if with_bytes and self.disk_bytes is not None:
            if used <= self.disk_bytes:  # else over the limit already: no need to look further
                used += unlinked_open_bytes(pids, self.scratch_dir)
            if used > self.disk_bytes:
                return DISK_LIMIT_EXCEEDED, {"kind": "disk", "limit": self.disk_bytes, "observed": used}
        return None

    def processes_at_cap(self) -> tuple[str, dict] | None:
        return self._at_process_cap(self._processes())

    def _processes(self) -> list[int]:
        return program_processes(os.getpid(), None if self.is_pid1 else self.session, self.session)

    def _at_process_cap(self, pids: list[int]) -> tuple[str, dict] | None:
        if len(pids) < self.max_processes:
            return None
        return PROCESS_LIMIT_EXCEEDED, {"kind": "processes", "limit": self.max_processes, "observed": len(pids)}

    def disk_used(self) -> int:
        return scratch_usage(self.scratch_dir, self.max_inodes)[0]


# The program's own PID namespace and syscall filter (as PID 1 only). In the sandbox's PID namespace the program
# could kill or stop the runner (kill(1, SIGKILL) needs only the same uid, and gVisor's PID 1 has no init
# protection) and its result would be lost; in a namespace of its own, created with a user namespace so no
# privilege is needed, it sees and signals only its own processes.
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
# Every namespace flag of clone(2): the program may fork, never make namespaces.
CLONE_NAMESPACE_FLAGS = 0x7E020000
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
X32_SYSCALL_BIT = 0x40000000
BPF_LD_W_ABS, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
SECCOMP_DATA_ARCH, SECCOMP_DATA_NR, SECCOMP_DATA_ARG0 = 4, 0, 16
# What the program never needs and the sandbox kernel (gVisor's Sentry) need not expose to it: namespaces and
# mounts (what containerd's default profile allows only with CAP_SYS_ADMIN), BPF, keyrings, perf events,
# userfaultfd, io_uring, kernel modules and kexec. Refused with EPERM; clone3 with ENOSYS, so libc falls back
# to clone, whose flags the filter can read.
DENIED_SYSCALLS = (
    "unshare setns mount umount2 pivot_root chroot open_tree move_mount fsopen fsconfig fsmount fspick "
    "mount_setattr open_by_handle_at name_to_handle_at bpf keyctl add_key request_key perf_event_open "
    "userfaultfd io_uring_setup io_uring_enter io_uring_register kexec_load kexec_file_load init_module "
    "finit_module delete_module acct swapon swapoff reboot quotactl quotactl_fd syslog fanotify_init "
    "lookup_dcookie sethostname setdomainname").split()
# os.uname().machine -> (AUDIT_ARCH_*, syscall numbers), from the kernel's tables.
SYSCALL_TABLES = {
    "x86_64": (0xC000003E, dict(
        unshare=272, setns=308, mount=165, umount2=166, pivot_root=155, chroot=161, open_tree=428, move_mount=429,
        fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, open_by_handle_at=304,
        name_to_handle_at=303, bpf=321, keyctl=250, add_key=248, request_key=249, perf_event_open=298,
        userfaultfd=323, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, kexec_load=246,
        kexec_file_load=320, init_module=175, finit_module=313, delete_module=176, acct=163, swapon=167,
        swapoff=168, reboot=169, quotactl=179, quotactl_fd=443, syslog=103, fanotify_init=300, lookup_dcookie=212,
        sethostname=170, setdomainname=171, clone=56, clone3=435)),
    "aarch64": (0xC00000B7, dict(
        unshare=97, setns=268, mount=40, umount2=39, pivot_root=41, chroot=51, open_tree=428, move_mount=429,
        fsopen=430, fsconfig=431, fsmount=432, fspick=433, mount_setattr=442, open_by_handle_at=265,
        name_to_handle_at=264, bpf=280, keyctl=219, add_key=217, request_key=218, perf_event_open=241,
        userfaultfd=282, io_uring_setup=425, io_uring_enter=426, io_uring_register=427, kexec_load=104,
        kexec_file_load=294, init_module=105, finit_module=273, delete_module=106, acct=89, swapon=224,
        swapoff=225, reboot=142, quotactl=60, quotactl_fd=443, syslog=116, fanotify_init=262, lookup_dcookie=18,
        sethostname=161, setdomainname=162, clone=220, clone3=435)),
}


def syscall_filter(machine: str) -> list[tuple[int, int, int, int]] | None:
    """The program's seccomp filter as classic BPF (code, jt, jf, k), or None for an architecture without a
    table. Another architecture's calling convention (e.g. x32 or i386 on x86_64) is refused outright."""
    if machine not in SYSCALL_TABLES:
        return None
    audit_arch, numbers = SYSCALL_TABLES[machine]
    denied = [numbers[name] for name in DENIED_SYSCALLS]
    body_length = 4 + len(denied) + 4
    allow, deny, no_such = body_length, body_length + 1, body_length + 2

    def jump(at: int, op: int, k: int, if_true: int | None, if_false: int | None) -> tuple[int, int, int, int]:
        # BPF jumps are relative to the next instruction; None falls through.
        relative = [0 if target is None else target - at - 1 for target in (if_true, if_false)]
        return (op, relative[0], relative[1], k)

    code = [(BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH)]
    code.append(jump(len(code), BPF_JEQ, audit_arch, None, deny))
    code.append((BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR))
    code.append(jump(len(code), BPF_JGE, X32_SYSCALL_BIT, deny, None))
    for number in denied:
        code.append(jump(len(code), BPF_JEQ, number, deny, None))
    code.append(jump(len(code), BPF_JEQ, numbers["clone3"], no_such, None))
    code.append(jump(len(code), BPF_JEQ, numbers["clone"], None, allow))
    code.append((BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARG0))  # the low half of the flags
    code.append(jump(len(code), BPF_JSET, CLONE_NAMESPACE_FLAGS, deny, allow))
    assert len(code) == body_length
    code += [(BPF_RET, 0, 0, SECCOMP_RET_ALLOW), (BPF_RET, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM),
             (BPF_RET, 0, 0, SECCOMP_RET_ERRNO | errno.ENOSYS)]
    return code


def install_syscall_filter() -> bool:
    """Install the filter on this process and everything it starts (no_new_privs makes that unprivileged)."""
    instructions = syscall_filter(os.uname().machine)
    if instructions is None:
        return False
    import ctypes

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    table = (SockFilter * len(instructions))(*instructions)
    program = SockFprog(len(instructions), table)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) == 0


def write_id_maps(uid: int, gid: int) -> None:
    """Map our own ids into the new user namespace (the one mapping an unprivileged process may write), so the
    program sees its real uid, not nobody. Best effort: file access is decided by the real ids either way."""
    for name, content in (("setgroups", "deny\n"), ("uid_map", f"{uid} {uid} 1\n"), ("gid_map", f"{gid} {gid} 1\n")):
        try:
            fd = os.open(f"/proc/self/{name}", os.O_WRONLY)  # no O_TRUNC/O_CREAT: gVisor refuses them here
        except OSError:
            continue
        try:
            os.write(fd, content.encode())
        except OSError:
            pass
        finally:
            os.close(fd)


def enter_user_namespace() -> bool:
    """As PID 1, before anything else: move the runner into a user namespace of its own, with its own ids mapped,
    so it may make the program's PID and mount namespaces without privilege, and stays in the program's user
    namespace (it can still read the program's /proc entries to count its processes and open files). False if
    the runtime refuses (a seccomp profile that denies unshare): the program then runs beside the runner."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER) != 0:
        return False
    write_id_maps(uid, gid)  # while still dumpable: the maps of a non-dumpable process are root's
    return True


def enter_program_namespaces(max_processes: int, hidden_dir: str | None = None) -> None:
    """In the child before exec (the runner's preexec): make a PID and a mount namespace and fork twice, so the
    program is PID 2 of it under an init of ours, with a /proc of its own, and return in the program's process.
    The child the runner started (its Popen pid) mirrors the program's exit status, so the run loop sees the
    program's own. Without them (see enter_user_namespace) the program runs beside us as before.

    hidden_dir (the raw input, which the runner has read) gets an empty read-only tmpfs over it: the program
    sees its input only where the runner laid it out, the same whether it came from a ConfigMap or a warm pod's
    stdin, and cannot write where a warm pod's runner wrote it. Best effort: if refused, it stays visible."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWPID | CLONE_NEWNS) != 0:
        return
    if hidden_dir is not None:
        libc.mount(b"tmpfs", os.fsencode(hidden_dir), b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    status_read, status_write = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(status_read)
        # The sandbox's /proc would list the runner and its helpers by their outer PIDs: the program sees its
        # own namespace only. Best effort: the sandbox's /proc stays (the runner is not dumpable) if refused.
        libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        program = os.fork()
        if program == 0:
            os.close(status_write)
            return
        serve_as_namespace_init(program, status_write, max_processes)
    os.close(status_write)
    mirror_program_status(init, status_read)


def close_all_but(keep: int) -> None:
    """The helpers hold none of the program's pipes (the runner reads them to EOF) or Popen's error pipe."""
    os.closerange(0, keep)
    os.closerange(keep + 1, MAX_CLOSE_FD)


def serve_as_namespace_init(program: int, status_write: int, max_processes: int) -> None:
    """PID 1 of the program's namespace: hand the program's wait status to the mirror at once, and keep the
    namespace (what the program left behind, which the runner still counts) until the runner kills it.

    Orphans are reaped every ORPHAN_REAP_SECONDS, not as they end, and not at all while the namespace holds the
    cap's worth of processes: a bomb of short-lived processes leaves its zombies for the runner's next check to
    see, however late that check comes on a busy CPU (reaping them first let such a bomb burn out unseen), while
    orphans that come and go at a sane rate never add up to the cap.
    gVisor gives a namespace's init no protection from its processes' signals: every signal that can be caught
    is (SIGSTOP is undone by the mirror; SIGKILL ends the namespace, the program's own doing)."""
    close_all_but(status_write)
    for number in signal.valid_signals():
        if number not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            try:
                signal.signal(number, lambda _number, _frame: None)
            except (OSError, ValueError):  # the realtime signals libc keeps for itself
                pass
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    next_reap = time.monotonic()
    program_running = True
    while True:
        signal.sigtimedwait([signal.SIGCHLD], ORPHAN_REAP_SECONDS)
        reap_all = time.monotonic() >= next_reap and namespace_processes() < max_processes
        while reap_all or program_running:
            try:
                pid, wait_status = os.waitpid(-1 if reap_all else program, os.WNOHANG)
            except ChildProcessError:  # nobody left: the namespace ends with us
                os._exit(0)
            if pid == 0:
                break
            if pid == program:
                os.write(status_write, wait_status.to_bytes(4, "little"))
                program_running = False
        if reap_all:
            next_reap = time.monotonic() + ORPHAN_REAP_SECONDS


def namespace_processes() -> int:
    """Processes in this PID namespace, zombies included (its own /proc; the sandbox's, counting more, if the
    mount was refused)."""
    try:
        return sum(1 for name in os.listdir("/proc") if name.isdigit())
    except OSError:
        return 0


def mirror_program_status(init: int, status_read: int) -> None:
    """End as the program ended: its exit code, or its signal. Meanwhile, resume our init whenever the program
    stops it. No status means the init was killed and the whole namespace with it: the program killed its own
    init, so it ends as killed."""
    close_all_but(status_read)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda _number, _frame: None)
    raw = b""
    while True:
        ready = select.select([status_read, wake_read], [], [])[0]
        if status_read in ready:
            raw = os.read(status_read, 4)
            break
        os.read(wake_read, 64)
        pid, wait_status = os.waitpid(init, os.WNOHANG | os.WUNTRACED)
        if pid and os.WIFSTOPPED(wait_status):
            os.kill(init, signal.SIGCONT)
    if len(raw) == 4:
        wait_status = int.from_bytes(raw, "little")
        if os.WIFEXITED(wait_status):
            os._exit(os.WEXITSTATUS(wait_status))
        number = os.WTERMSIG(wait_status)
    else:
        number = signal.SIGKILL
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.set_wakeup_fd(-1)
    if number not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
    os._exit(128 + number)


# How the child ended. runner_kill_reason is the reason the runner stopped it
# (TIMEOUT, OUTPUT_LIMIT_EXCEEDED or a sandbox limit, then with `limit`), else None. (A namedtuple, not a dataclass: the
# dataclasses import costs ~10 ms on every run.)
ChildOutcome = collections.namedtuple(
    "ChildOutcome", ["returncode", "runner_kill_reason", "wall_seconds", "stdout", "stderr", "limit"],
    defaults=(None,))


def run_child(command: list[str], cwd: str, env: dict, stdin_path: str | None,
              timeout_seconds: float, output_bytes: int, flood_bytes: int,
              is_pid1: bool, guards: Guards | None = None) -> ChildOutcome:
    """Run the program, enforcing the deadline and the output flood cap.

    One selector loop drains both pipes (a blocking read in a thread could not
    be abandoned when an escaped process keeps a pipe open); a waiter thread
    only reports the child's exit through a self-pipe, without reaping it, so
    the process group id stays reserved until the group has been killed.
    """
    stdout = StreamCapture(output_bytes)
    stderr = StreamCapture(output_bytes)
    with open(stdin_path or os.devnull, "rb") as stdin:
        started = time.monotonic()
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, close_fds=True,
                                preexec_fn=guards.child_limits if guards else None)
    if guards is not None:
        guards.session = proc.pid
    wake_read, wake_write = os.pipe()
    exited_at: list[float] = []

    def wait_for_exit() -> None:
        try:
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        except OSError:  # a kernel without WNOWAIT: reap now rather than never wake
            proc.wait()
        exited_at.append(time.monotonic())
        os.write(wake_write, b"x")

    threading.Thread(target=wait_for_exit, daemon=True).start()
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ, stdout)
    selector.register(proc.stderr, selectors.EVENT_READ, stderr)
    selector.register(wake_read, selectors.EVENT_READ, None)
    open_streams = 2
    deadline = started + timeout_seconds
    runner_kill_reason = None
    limit = None
    drain_until = None
    try:
        while True:
            now = time.monotonic()
            if drain_until is None and runner_kill_reason is None:
                broken = guards.check(now) if guards is not None and guards.due(now) else None
                if broken:
                    (runner_kill_reason, limit) = broken
                    kill_process_group(proc.pid)  # escaped processes die with everything else at exit
                elif stdout.total + stderr.total > flood_bytes:
                    runner_kill_reason = OUTPUT_LIMIT_EXCEEDED
                    kill_process_group(proc.pid)
                elif not exited_at and now >= deadline:
                    # A limit met by then is what stopped the program (e.g. a fork bomb that starved us of CPU).
                    broken = guards.check(now) if guards is not None else None
                    runner_kill_reason, limit = broken or (TIMEOUT, None)
                    kill_process_group(proc.pid)
            if exited_at and drain_until is None:
                if runner_kill_reason is None and guards is not None:
                    # A fork bomb's first process often dies of its own failed fork (EAGAIN at RLIMIT_NPROC)
                    # before a check: what it left behind says why.
                    broken = guards.processes_at_cap()
                    if broken:
                        runner_kill_reason, limit = broken
                # Kill the group while the unreaped child still holds its id,
                # reap the child (its status), and only then, as PID 1, kill
                # and reap everything else: reaping first would lose the status.
                kill_process_group(proc.pid)
                proc.wait()
                if is_pid1:
                    kill_all_other_processes()
                drain_until = time.monotonic() + DRAIN_GRACE_SECONDS
            if drain_until is not None and (open_streams == 0 or now >= drain_until):
                break
            if drain_until is not None:
                wait = drain_until - now
            elif runner_kill_reason is None:
                wait = deadline - now
                if guards is not None:
                    wait = min(wait, guards.next_check - now)
            else:
                wait = None  # killed: the waiter thread will wake us
            for key, _ in selector.select(None if wait is None else max(wait, 0)):
                if key.data is None:
                    os.read(wake_read, 1)
                    selector.unregister(wake_read)
                    continue
                chunk = os.read(key.fd, READ_CHUNK)
                if chunk:
                    key.data.feed(chunk)
                else:
                    selector.unregister(key.fileobj)
                    open_streams -= 1
    finally:
        if not exited_at:  # the runner itself failed: never leave the child behind
            kill_process_group(proc.pid)
        returncode = proc.wait()
        selector.close()
        for fd in (wake_read, wake_write):
            os.close(fd)
        proc.stdout.close()
        proc.stderr.close()
    if runner_kill_reason is None and guards is not None:
        # The program may have broken a limit just before it ended (e.g. filled /tmp, then exited on EFBIG).
        broken = guards.check(time.monotonic(), final=True)
        if broken:
            runner_kill_reason, limit = broken
    if (runner_kill_reason is None and returncode == -signal.SIGXFSZ and guards is not None
            and guards.disk_bytes is not None):
        # Killed at RLIMIT_FSIZE: a file reached the disk limit (even if /tmp as a whole is back under it).
        runner_kill_reason = DISK_LIMIT_EXCEEDED
        limit = {"kind": "disk", "limit": guards.disk_bytes, "observed": guards.disk_used()}
    return ChildOutcome(returncode, runner_kill_reason, exited_at[0] - started, stdout, stderr, limit)


def child_metrics(wall_seconds: float) -> dict:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "wallMillis": int(round(wall_seconds * 1000)),
        "cpuMillis": int(round((usage.ru_utime + usage.ru_stime) * 1000)),
        "maxRSSBytes": int(usage.ru_maxrss) * 1024,  # ru_maxrss is KiB on Linux
    }


OOM_EVIDENCE_WAIT_SECONDS = 0.5
OOM_EVIDENCE_POLL_SECONDS = 0.05
OOM_EVIDENCE_FILES = (
    "/sys/fs/cgroup/memory.events",  # cgroup v2
    "/sys/fs/cgroup/memory/memory.oom_control",  # cgroup v1
)


def oom_kill_count(text: str) -> int:
    """The `oom_kill N` counter of a cgroup memory.events / memory.oom_control file."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == "oom_kill" and fields[1].isdigit():
            return int(fields[1])
    return 0


def cgroup_reports_oom_kill(paths: tuple[str, ...] = OOM_EVIDENCE_FILES, wait_seconds: float = 0.0) -> bool:
    """Whether the sandbox's memory cgroup counted an OOM kill. Under load the counter can trail the SIGKILL
    it explains: a program killed by SIGKILL that nobody here sent is looked at again for `wait_seconds`."""
    give_up = time.monotonic() + wait_seconds
    while True:
        for path in paths:
            try:
                with open(path, encoding="ascii", errors="replace") as handle:
                    if oom_kill_count(handle.read()) > 0:
                        return True
            except OSError:
                continue
        if time.monotonic() >= give_up:
            return False
        time.sleep(OOM_EVIDENCE_POLL_SECONDS)


# ---------------------------------------------------------------- error parsing

TRACEBACK_HEADER = "Traceback (most recent call last):"
FRAME_LINE = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+)(?:, in .*)?$')
EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::(?: (?P<message>.*))?)?$")


def _names_code_file(path: str, code_file: str) -> bool:
    return path == code_file or path.endswith("/" + code_file)


def parse_python_error(stderr_text: str, code_file: str) -> dict | None:
    """The last Python exception in stderr as {type, message, line}, or None.

    `line` is the last traceback frame inside the user's code file. A
    SyntaxError in the main script has no "Traceback" header: its block
    starts at the `File "...", line N` line instead.
    """
    lines = stderr_text.split("\n")  # not splitlines(): a message may hold U+2028 or U+0085
    starts = [i for i, line in enumerate(lines) if line == TRACEBACK_HEADER]
    if starts:
        start = starts[-1] + 1
    else:
        frames = [i for i, line in enumerate(lines) if FRAME_LINE.match(line)]
        if not frames:
            return None
        start = frames[0]
    user_line = None
    for line in lines[start:]:
        frame = FRAME_LINE.match(line)
        if frame:
            if _names_code_file(frame["file"], code_file):
                user_line = _line_number(frame["line"])
            continue
        if not line or line[0].isspace():
            continue  # source excerpt, caret markers, blank separators
        exception = EXCEPTION_LINE.match(line)
        if not exception:
            return None
        return {
            "type": cap(exception["type"], MAX_ERROR_TYPE_CHARS + REDACTION_MARGIN_CHARS),
            "message": cap((exception["message"] or "").strip(" \t\r"),
                           MAX_ERROR_MESSAGE_CHARS + REDACTION_MARGIN_CHARS),
            "line": user_line,
        }
    return None


NODE_HEADER = re.compile(r"^(?P<file>.+):(?P<line>\d{1,10})$")
NODE_CARET = re.compile(r"^[ \t]*\^+[ \t]*$")
NODE_FRAME = re.compile(r"^\s+at (?:.*\()?(?P<file>[^()\s]+):(?P<line>\d{1,10}):\d+\)?(?: \{)?$")
NODE_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_$][\w$]*)(?: \[[^\]]*\])?(?:: ?(?P<message>.*))?$")
NODE_END = re.compile(r"^(Node\.js v\d|\(Use `node )")


def parse_node_error(stderr_text: str, code_file: str) -> dict | None:
    """The last uncaught JavaScript value Node reported, as {type, message, line}, or None.

    Node prints `<file>:<line>` (the code's, or a Node internal's), the source line and a caret (both empty
    for a SyntaxError at the end of the input). An Error follows after a blank line: `Type: message` (the
    message may span lines, even blank ones) and its stack (`    at ...`), or `[Type: message]` if it has no
    stack. Any other thrown value (a string, a number, an object) follows as printed, with no blank line and
    no type: "Uncaught". `line` is the innermost stack frame in the code file, else the header's line when
    it names the code file (a SyntaxError's frames are all Node's own).
    """
    lines = stderr_text.split("\n")  # not splitlines(): a message may hold U+2028 or U+0085
    headers = [i for i in range(len(lines) - 4) if NODE_HEADER.match(lines[i]) and (
        NODE_CARET.match(lines[i + 2]) or lines[i + 1] == lines[i + 2] == lines[i + 3] == "" != lines[i + 4])]
    if not headers:
        return None
    header = NODE_HEADER.match(lines[headers[-1]])
    line = _line_number(header["line"]) if _names_code_file(header["file"], code_file) else None
    report = lines[headers[-1] + 3:]
    end = next((i for i, text in enumerate(report) if NODE_END.match(text)), len(report))
    hint = end < len(report) and report[end].startswith("(Use")  # after a thrown string, number, null
    if not hint and not any(report[:end]):
        return None
    thrown_error = report[0] == "" and not hint
    stack = next((i for i in range(end) if thrown_error and report[i].startswith("    at ")), end)
    for text in report[stack:end]:
        frame = NODE_FRAME.match(text)
        if frame and _names_code_file(frame["file"], code_file):
            line = _line_number(frame["line"])  # the innermost frame in the code
            break
    type_, message = "Uncaught", "\n".join(report[:stack]).strip("\n")
    if thrown_error:
        if message.startswith("["):  # its own properties may follow: "[Type: message] { code: 7 }"
            close = message.find("] {")
            message = message[1:close if close >= 0 else message.rfind("]")]
        exception = NODE_EXCEPTION.match(message.partition("\n")[0])
        if exception:
            type_, message = exception["type"], (exception["message"] or "") + message[exception.end():]
        else:
            type_ = "Error"  # an Error whose name is no identifier
    return {
        "type": cap(type_, MAX_ERROR_TYPE_CHARS + REDACTION_MARGIN_CHARS),
        "message": cap(message.strip(" \t\r\n"), MAX_ERROR_MESSAGE_CHARS + REDACTION_MARGIN_CHARS),
        "line": line,
    }


def _line_number(digits: str) -> int | None:
    """The program can print any number: int() refuses more than 4300 digits, the status wants int32."""
    return int(digits) if len(digits) <= 10 and 0 < int(digits) <= MAX_LINE_NUMBER else None


ERROR_PARSERS = {"python": parse_python_error, "javascript": parse_node_error}


# ---------------------------------------------------------------- artifacts


def cap(text: str, limit: int) -> str:
    """The head of text, marked with an ellipsis when cut: the program decides how long its strings are."""
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def _display_name(relative: bytes) -> str:
    """File names may be any bytes; the frame must stay valid UTF-8 and bounded."""
    return cap(relative.decode("utf-8", errors="replace"), MAX_NAME_CHARS + REDACTION_MARGIN_CHARS)


def walk_outputs(root: bytes):
    """Yield (relative name, lstat) for every entry below root, sorted, no symlinks followed."""
    pending = [b""]
    while pending:
        prefix = pending.pop()
        try:
            names = sorted(os.listdir(os.path.join(root, prefix) if prefix else root))
        except OSError:
            continue
        subdirs = []
        for name in names:
            relative = os.path.join(prefix, name) if prefix else name
            try:
                info = os.lstat(os.path.join(root, relative))
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                subdirs.append(relative)
            else:
                yield relative, info
        pending.extend(reversed(subdirs))


def read_regular_file(path: bytes, expected: os.stat_result, limit: int) -> bytes | None:
    """Read a file only if it is still the regular file we lstat'ed (no symlink swap)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != (expected.st_dev, expected.st_ino):
            return None
        data = handle.read(limit + 1)
    return data if len(data) <= limit else None


def collect_artifacts(outputs_dir: str, caps: dict) -> tuple[list, list, int]:
    """Return (artifacts, skipped entries listed, skipped entries not listed).

    Runs after every other process in the sandbox is dead, so lstat-then-open
    (with O_NOFOLLOW and an inode check) cannot be raced from inside.
    """
    artifacts: list[dict] = []
    skipped: list[dict] = []
    unlisted = 0
    total_bytes = 0
    root = os.fsencode(outputs_dir)
    try:
        root_info = os.lstat(root)
    except FileNotFoundError:
        return artifacts, skipped, unlisted
    if not stat.S_ISDIR(root_info.st_mode):  # the program replaced the dir, e.g. by a symlink
        why = "symlink" if stat.S_ISLNK(root_info.st_mode) else "not-a-regular-file"
        return artifacts, [{"name": ".", "why": why}], unlisted
    for relative, info in walk_outputs(root):
        name = _display_name(relative)
        why = None
        data = None
        if stat.S_ISLNK(info.st_mode):
            why = "symlink"
        elif not stat.S_ISREG(info.st_mode):
            why = "not-a-regular-file"
        elif len(artifacts) >= caps["maxFiles"]:
            why = "too-many"
        elif info.st_size > caps["maxFileBytes"]:
            why = "too-large"
        elif total_bytes + info.st_size > caps["maxTotalBytes"]:
            why = "total-too-large"
        else:
            data = read_regular_file(os.path.join(root, relative), info, caps["maxFileBytes"])
            if data is None:
                why = "not-a-regular-file"
            elif total_bytes + len(data) > caps["maxTotalBytes"]:
                why = "total-too-large"
        if why is not None:
            if len(skipped) < MAX_SKIPPED_LISTED:
                skipped.append({"name": name, "why": why})
            else:
                unlisted += 1
            continue
        total_bytes += len(data)
        artifacts.append({
            "name": name,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "contentBase64": base64.b64encode(data).decode("ascii"),
        })
    return artifacts, skipped, unlisted


# ---------------------------------------------------------------- result


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


def result_frame(spec: dict, outcome: ChildOutcome, metrics: dict, oom_killed: bool,
                 artifacts: list, skipped: list, unlisted_skipped: int) -> dict:
    reason, exit_code, signal_number = classify(outcome)
    error = None
    parse_error = ERROR_PARSERS.get(spec["language"])
    if parse_error is not None and outcome.returncode != 0:  # exit 0: any report it printed, it handled
        error = parse_error(outcome.stderr.text_for_parsing(), spec["codeFile"])
    # The operator writes every human message; the frame carries facts (reason, limit, counts) only.
    frame_limit = {"limit": outcome.limit} if outcome.limit else {}
    return {**frame_limit,
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


# ---------------------------------------------------------------- main


def execute(args: types.SimpleNamespace, is_pid1: bool, termination_fd: int | None = None) -> dict:
    # Absolute, because the program's cwd is the work dir.
    work, outputs = os.path.abspath(args.work), os.path.abspath(args.outputs)
    try:
        spec = load_run_spec(args.input)
        materialise_inputs(spec, args.input, work)
        stdin_path = None
        if spec["stdinKey"] is not None:
            stdin_path = os.path.join(args.input, spec["stdinKey"])
            if not os.path.isfile(stdin_path):
                raise InvalidInput(f"input key {spec['stdinKey']!r} is missing")
    except InvalidInput as exc:
        return failure_frame(INVALID_INPUT, str(exc))
    scratch_dir = os.path.dirname(work)
    home_dir = os.path.join(scratch_dir, "home")
    os.makedirs(home_dir, exist_ok=True)
    os.makedirs(outputs, exist_ok=True)
    env = child_environment(spec["env"], scratch_dir, home_dir, outputs,
                            spec["memoryBytes"] if spec["language"] == "javascript" else None)
    guards = Guards(scratch_dir, spec["diskBytes"], spec["maxInodes"], spec["maxProcesses"], termination_fd,
                    is_pid1, os.path.abspath(args.input))
    try:
        outcome = run_child(spec["command"], work, env, stdin_path,
                            spec["timeoutSeconds"], spec["outputBytes"], spec["floodBytes"], is_pid1, guards)
    except OSError as exc:  # e.g. the image lacks the interpreter
        return failure_frame(RUNNER_ERROR, f"could not start {spec['command'][0]!r}: {exc}")
    metrics = child_metrics(outcome.wall_seconds)
    oom_killed = outcome.runner_kill_reason is None and (
        (outcome.returncode == -signal.SIGKILL and cgroup_reports_oom_kill(wait_seconds=OOM_EVIDENCE_WAIT_SECONDS))
        or (outcome.returncode < 0 and bool(V8_HEAP_EXHAUSTED.search(outcome.stderr.text_for_parsing()))))
    artifacts, skipped, unlisted = collect_artifacts(outputs, spec["artifacts"])
    return result_frame(spec, outcome, metrics, oom_killed, artifacts, skipped, unlisted)


DEFAULT_PATHS = {
    "input": "/coderun/input",                      # the input ConfigMap mount, or where --input-stdin writes it
    "work": "/tmp/work",                            # writable; the program's cwd
    "outputs": "/tmp/outputs",                      # CODERUN_OUTPUT_DIR, collected as artifacts
    "termination_log": "/dev/termination-log",
}
USAGE = ("usage: runner.py [--input DIR] [--input-stdin] [--work DIR] [--outputs DIR] [--termination-log FILE]\n"
         "Run one sandboxed program and print a framed result. --input-stdin (a warm pool pod): wait for the\n"
         "input on stdin and write it to the input dir (a volume of its own) instead of reading a mounted ConfigMap.")


def parse_args(argv: list[str]) -> types.SimpleNamespace:
    """`--name VALUE` or `--name=VALUE` for the four paths. Hand-rolled
    because importing argparse costs ~10 ms on every run."""
    paths = dict(DEFAULT_PATHS)
    args, input_stdin = list(argv), False
    while args:
        option = args.pop(0)
        if option in ("-h", "--help"):
            print(USAGE)
            sys.exit(0)
        if option == "--input-stdin":
            input_stdin = True
            continue
        name, has_value, value = option.partition("=")
        key = name[2:].replace("-", "_") if name.startswith("--") else None
        if key not in paths or not (has_value or args):
            print(f"{USAGE}\nrunner.py: bad argument {option!r}", file=sys.stderr)
            sys.exit(2)
        paths[key] = value if has_value else args.pop(0)
    return types.SimpleNamespace(**paths, input_stdin=input_stdin)


def open_termination_log(path: str) -> int | None:
    """Held from before the program starts, so the runner notices any write to it and writes it last."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        print(f"coderun-runner: cannot open termination log {path}: {exc}", file=sys.stderr)
        return None


def write_termination_log(fd: int | None, summary: bytes) -> None:
    """Truncate first: the program may have written its own text there."""
    if fd is None:
        return
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, summary, 0)
    finally:
        os.close(fd)




def make_undumpable() -> bool:
    """Keep the program out of /proc/<runner>: a non-dumpable process's /proc entries belong to root, so the
    program (same uid) can neither write to our stdout through /proc/1/fd/1 nor read our memory. The flag is
    per process and execve resets it, so the program itself is unaffected."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def accept_stdin_input(input_dir: str) -> tuple[str | None, dict | None]:
    """A warm pod's input: (nonce, None) once all of it is read, announced on stdout (the operator's proof that
    the program may be running); else (None, the failure frame). The nonce is never written anywhere the
    program can read: only this process, undumpable and outside the program's PID namespace, holds it."""
    try:
        nonce = read_stdin_input(sys.stdin.buffer, input_dir)
    except InputIncomplete as exc:
        return None, failure_frame(INPUT_INCOMPLETE, str(exc))
    except InvalidInput as exc:
        return None, failure_frame(INVALID_INPUT, str(exc))
    except OSError as exc:
        return None, failure_frame(RUNNER_ERROR, f"could not read the input: {exc}")
    sys.stdout.buffer.write(f"{ACCEPTED_PREFIX}{hashlib.sha256(nonce.encode()).hexdigest()[:16]}\n".encode())
    sys.stdout.buffer.flush()
    return nonce, None


def main(argv: list[str] | None = None) -> int:
    # Wall-clock start, so the operator can tell sandbox start-up time from the program's own.
    started_at_millis = int(time.time() * 1000)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    is_pid1 = os.getpid() == 1
    if is_pid1:
        enter_user_namespace()
        make_undumpable()
    for name in SHIELDED_SIGNALS:
        signal.signal(getattr(signal, name), lambda number, _frame: None)
    termination_fd = open_termination_log(args.termination_log)
    nonce, frame = None, None
    if args.input_stdin:
        nonce, frame = accept_stdin_input(args.input)
        started_at_millis = int(time.time() * 1000)  # the program's start-up begins now, not at the pod's
    if frame is None:
        try:
            frame = execute(args, is_pid1, termination_fd)
        except Exception as exc:  # the frame must still be printed
            frame = failure_frame(RUNNER_ERROR, f"runner failed: {type(exc).__name__}: {exc}")
    frame["startedAtMillis"] = started_at_millis
    if nonce is not None:
        frame["nonce"] = nonce
    if is_pid1:
        kill_all_other_processes()
    frame_json = encode_frame(frame)
    out = sys.stdout.buffer
    # The leading newline ends any partial line a program wrote to our stdout
    # (via /proc/1/fd/1), so the frame always starts its own line.
    out.write(b"\n" + FRAME_PREFIX.encode("ascii") + frame_json + b"\n")
    out.flush()
    write_termination_log(termination_fd, termination_summary(frame, frame_json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
