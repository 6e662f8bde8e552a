"""Pure functions of the runner, without running a program."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from coderun.sandbox.runner import protocol, seccomp
from coderun.sandbox.runner.capture import StreamCapture, trim_partial_utf8
from coderun.sandbox.runner.confinement import capped_scratch_options
from coderun.sandbox.runner.child import ChildOutcome, cgroup_reports_oom_kill, oom_kill_count
from coderun.sandbox.runner.errors import parse_python_error
from coderun.sandbox.runner.frame import classify, encode_frame, failure_frame, termination_summary
from coderun.sandbox.runner.inputs import InvalidInput, parse_run_spec, resolve_inside, validate_relative_path
from coderun.sandbox.runner.limits import WALK_HELD_DIRS, is_unlinked, scratch_usage, tmpfs_usage
from coderun.sandbox.runner.main import parse_args

TB = "Traceback (most recent call last):"

PYTHON_ERRORS = [
    pytest.param(
        f'{TB}\n  File "/tmp/work/main.py", line 3, in <module>\n    print(x / y)\n          ~~^~~\n'
        "ZeroDivisionError: division by zero\n",
        "main.py", {"type": "ZeroDivisionError", "message": "division by zero", "line": 3},
        id="absolute-path-with-carets"),
    pytest.param(
        f'{TB}\n  File "main.py", line 8, in <module>\n    load()\n  File "main.py", line 5, in load\n'
        "    return json.loads('x')\n"
        '  File "/usr/lib/python3.11/json/__init__.py", line 346, in loads\n    return _default_decoder.decode(s)\n'
        '  File "/usr/lib/python3.11/json/decoder.py", line 355, in raw_decode\n'
        "    raise JSONDecodeError(\"Expecting value\", s, err.value) from None\n"
        "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)\n",
        "main.py",
        {"type": "json.decoder.JSONDecodeError", "message": "Expecting value: line 1 column 1 (char 0)", "line": 5},
        id="dotted-type-last-user-frame"),
    pytest.param(
        '  File "/tmp/work/main.py", line 2\n    print(\'broken\'\n         ^\nSyntaxError: \'(\' was never closed\n',
        "main.py", {"type": "SyntaxError", "message": "'(' was never closed", "line": 2},
        id="syntax-error-without-header"),
    pytest.param(
        '  File "/tmp/work/main.py", line 2\n    print(1)\n    ^\n'
        "IndentationError: expected an indented block after 'if' statement on line 1\n",
        "main.py",
        {"type": "IndentationError", "message": "expected an indented block after 'if' statement on line 1",
         "line": 2},
        id="indentation-error"),
    pytest.param(
        f'{TB}\n  File "main.py", line 2, in <module>\n    {{}}["k"]\nKeyError: \'k\'\n\n'
        "During handling of the above exception, another exception occurred:\n\n"
        f'{TB}\n  File "main.py", line 4, in <module>\n    raise ValueError("bad")\nValueError: bad\n',
        "main.py", {"type": "ValueError", "message": "bad", "line": 4},
        id="chained-last-wins"),
    pytest.param(
        f'{TB}\n  File "main.py", line 1, in <module>\nValueError: first line\nsecond line\n',
        "main.py", {"type": "ValueError", "message": "first line", "line": 1},
        id="multi-line-message"),
    pytest.param(
        f'{TB}\n  File "main.py", line 7, in <module>\nKeyboardInterrupt\n',
        "main.py", {"type": "KeyboardInterrupt", "message": "", "line": 7},
        id="no-message"),
    pytest.param(
        f'progress 1\nprogress 2\n{TB}\n  File "/tmp/work/src/app.py", line 9, in <module>\n'
        '  File "/tmp/work/notapp.py", line 4, in helper\nRuntimeError: boom\n',
        "src/app.py", {"type": "RuntimeError", "message": "boom", "line": 9},
        id="code-file-in-subdir-and-similar-name"),
    pytest.param(
        f'{TB}\n  File "/usr/lib/python3.11/runpy.py", line 1, in x\nImportError: no\n',
        "main.py", {"type": "ImportError", "message": "no", "line": None},
        id="no-user-frame"),
    pytest.param("", "main.py", None, id="empty"),
    pytest.param("warning: something odd\nanother line\n", "main.py", None, id="plain-stderr"),
    pytest.param(f'{TB}\n  File "main.py", line 1, in <module>\n', "main.py", None, id="cut-off-traceback"),
]


@pytest.mark.parametrize("stderr, code_file, expected", PYTHON_ERRORS)
def test_parse_python_error(stderr, code_file, expected):
    assert parse_python_error(stderr, code_file) == expected


@pytest.mark.parametrize("path, normalised", [
    ("main.py", "main.py"),
    ("data/x.csv", "data/x.csv"),
    ("./a//b/./c.txt", "a/b/c.txt"),
])
def test_validate_relative_path_accepts(path, normalised):
    assert validate_relative_path(path, "f") == normalised


@pytest.mark.parametrize("path", ["", "/etc/passwd", "..", "../x", "a/../../x", "a/..", ".", "./", "a\0b", None, 3])
def test_validate_relative_path_rejects(path):
    with pytest.raises(InvalidInput):
        validate_relative_path(path, "f")


def test_resolve_inside_rejects_a_symlink_out(tmp_path):
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(InvalidInput):
        resolve_inside(str(tmp_path), "link/passwd")
    assert resolve_inside(str(tmp_path), "ok/x") == str(tmp_path.resolve() / "ok" / "x")


@pytest.mark.parametrize("data, expected", [
    (b"abc", b"abc"),
    ("a\u00e9".encode()[:2], b"a"),            # 2-byte char cut after its lead byte
    ("a\u20ac".encode()[:3], b"a"),            # 3-byte char cut after 2 bytes
    ("a\U0001F600".encode()[:4], b"a"),        # 4-byte char cut after 3 bytes
    ("a\u20ac".encode(), "a\u20ac".encode()),  # complete char kept
    (b"", b""),
])
def test_trim_partial_utf8(data, expected):
    assert trim_partial_utf8(data) == expected


def test_stream_capture_keeps_head_counts_all_and_hashes_all():
    capture = StreamCapture(limit=5)
    for chunk in (b"abc", b"defgh", b"ij"):
        capture.feed(chunk)
    assert bytes(capture.kept) == b"abcde" and capture.total == 10 and capture.truncated
    assert capture.digest.hexdigest() == hashlib.sha256(b"abcdefghij").hexdigest()
    assert capture.text_for_parsing().endswith("fghij")


@pytest.mark.parametrize("text, count", [
    ("low 0\nhigh 0\nmax 0\noom 1\noom_kill 2\n", 2),      # cgroup v2 memory.events
    ("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n", 0),  # cgroup v1 memory.oom_control
    ("", 0),
])
def test_oom_kill_count(text, count):
    assert oom_kill_count(text) == count


def test_cgroup_oom_evidence_tolerates_missing_files(tmp_path):
    events = tmp_path / "memory.events"
    events.write_text("oom 1\noom_kill 1\n")
    assert cgroup_reports_oom_kill((str(tmp_path / "missing"), str(events))) is True
    assert cgroup_reports_oom_kill((str(tmp_path / "missing"),)) is False


@pytest.mark.parametrize("returncode, runner_kill, expected", [
    (0, None, ("Completed", 0, None)),
    (2, None, ("NonZeroExit", 2, None)),
    (-9, None, ("Signaled", None, 9)),
    (-9, "Timeout", ("Timeout", None, 9)),
    (-9, "OutputLimitExceeded", ("OutputLimitExceeded", None, 9)),
])
def test_classify(returncode, runner_kill, expected):
    outcome = ChildOutcome(returncode, runner_kill, 0.1, StreamCapture(10), StreamCapture(10))
    assert classify(outcome) == expected


def test_termination_summary_is_small_and_digests_the_frame():
    frame = failure_frame(protocol.INVALID_INPUT, "x" * 100000)
    frame_json = encode_frame(frame)
    summary = json.loads(termination_summary(frame, frame_json))
    assert summary == {"v": 1, "reason": "InvalidInput", "exitCode": None,
                       "frameSha256": hashlib.sha256(frame_json).hexdigest()}
    assert len(termination_summary(frame, frame_json)) < 4096


def test_encode_frame_is_compact_ascii():
    text = "caf\u00e9 \udcff \u2028 \u2029 \x85 end"
    frame = failure_frame(protocol.RUNNER_ERROR, text)
    encoded = encode_frame(frame)
    assert b"\n" not in encoded and b", " not in encoded and encoded.isascii()
    # No byte a reader could split a line on (U+2028, U+2029, U+0085 are escaped), and nothing is lost.
    assert json.loads(encoded)["message"] == text and len(encoded.decode().splitlines()) == 1


def test_parse_args_defaults_and_both_forms():
    assert vars(parse_args([])) == {"input": "/coderun/input", "inputs": "/coderun/inputs", "work": "/tmp/work",
                                    "input_stdin": False, "session": False, "keep_state": False,
                                    "outputs": "/tmp/outputs", "termination_log": "/dev/termination-log",
                                    "prestart": ""}
    args = parse_args(["--input", "/in", "--termination-log=/log", "--work=/w"])
    assert (args.input, args.termination_log, args.work, args.outputs) == ("/in", "/log", "/w", "/tmp/outputs")
    # A warm pool pod's runner: the input comes on stdin and is laid out where a cold pod's ConfigMap is mounted.
    assert (parse_args(["--input-stdin"]).input, parse_args(["--input-stdin"]).input_stdin) == \
        ("/coderun/input", True)
    assert parse_args(["--input-stdin", "--input=/x"]).input == "/x"
    # A session pod's runner: one run per document on stdin.
    assert (parse_args(["--session"]).session, parse_args(["--session"]).input_stdin) == (True, False)
    # Either prestarts its programs with the operator's settings.
    assert parse_args(["--session", "--prestart={}"]).prestart == "{}"


@pytest.mark.parametrize("argv", [["--nope", "x"], ["--input"], ["stray"], ["--session", "--input-stdin"]])
def test_parse_args_rejects(argv):
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2


def minimal_run_json(**fields) -> dict:
    return {"version": 1, "command": ["python3", "main.py"], "codeFile": "main.py", "timeoutSeconds": 5, **fields}


def test_sandbox_limits_default_when_absent():
    spec = parse_run_spec(minimal_run_json())
    assert (spec["diskBytes"], spec["memoryBytes"], spec["maxInodes"], spec["maxProcesses"]) == (None, None, 16384, 128)
    spec = parse_run_spec(minimal_run_json(diskBytes=1 << 20, memoryBytes=1 << 27, maxInodes=10, maxProcesses=1))
    assert (spec["diskBytes"], spec["memoryBytes"], spec["maxInodes"], spec["maxProcesses"]) == (1 << 20, 1 << 27, 10, 1)


def test_the_scratch_tmpfs_is_asked_for_explicitly():
    assert parse_run_spec(minimal_run_json())["scratchTmpfs"] is False
    assert parse_run_spec(minimal_run_json(scratchTmpfs=True))["scratchTmpfs"] is True
    with pytest.raises(InvalidInput, match="scratchTmpfs"):
        parse_run_spec(minimal_run_json(scratchTmpfs="yes"))


def test_the_scratch_tmpfs_holds_one_entry_and_one_page_past_the_caps():
    # Its root is an inode too; full then means past the cap, as the walk reports it.
    assert capped_scratch_options(500, None, 4096) == "nr_inodes=502,mode=1777"
    assert capped_scratch_options(16384, 1 << 20, 4096) == "nr_inodes=16386,mode=1777,size=1052672"


def test_tmpfs_usage_counts_pages_and_inodes_but_its_root():
    # statvfs_result: bsize, frsize, blocks, bfree, bavail, files, ffree, favail, flag, namemax
    full = os.statvfs_result((4096, 4096, 257, 0, 0, 502, 0, 0, 0, 255))
    assert tmpfs_usage(full) == (257 * 4096, 501)
    empty = os.statvfs_result((4096, 4096, 257, 257, 257, 502, 501, 501, 0, 255))
    assert tmpfs_usage(empty) == (0, 0)


@pytest.mark.parametrize("field, value", [
    ("diskBytes", 0), ("diskBytes", -1), ("diskBytes", 2**64), ("diskBytes", "1Mi"), ("diskBytes", 1.5),
    ("memoryBytes", 0), ("memoryBytes", "128Mi"), ("maxInodes", 0), ("maxInodes", True), ("maxInodes", 2**31), ("maxProcesses", 0),
    ("maxProcesses", 2**40), ("maxProcesses", None),
])
def test_sandbox_limits_out_of_range_are_invalid_input(field, value):
    with pytest.raises(InvalidInput, match=field):
        parse_run_spec(minimal_run_json(**{field: value}))


def test_protocol_constants_are_exported():
    assert protocol.FRAME_PREFIX == "CODERUN-RESULT-V1 "
    assert {"DiskLimitExceeded", "ProcessLimitExceeded", "SandboxViolation"} <= set(protocol.REASONS)
    # InputIncomplete: a warm pod's cut-short input; the data plane's three input reasons (runner data.py)
    assert len(set(protocol.REASONS)) == len(protocol.REASONS) == 14
    assert set(protocol.INPUT_REASONS) == {"InputUnavailable", "InputMismatch", "InputTooLarge"}
    assert protocol.LIMIT_KINDS == ("disk", "inodes", "processes", "termination-log")
    assert (protocol.MAX_ERROR_TYPE_CHARS, protocol.MAX_ERROR_MESSAGE_CHARS,
            protocol.MAX_NAME_CHARS) == (256, 4096, 1024)


def test_scratch_usage_counts_blocks_once_and_follows_no_link(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "data").write_bytes(b"x" * 100000)
    (tmp_path / "a" / "hard").hardlink_to(tmp_path / "a" / "b" / "data")
    (tmp_path / "up").symlink_to("/usr")
    used, inodes = scratch_usage(str(tmp_path), 1000)
    data_blocks = (tmp_path / "a" / "b" / "data").stat().st_blocks * 512
    dirs_and_link = sum(p.lstat().st_blocks * 512 for p in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "up"))
    assert (used, inodes) == (data_blocks + dirs_and_link, 5)
    assert scratch_usage(str(tmp_path), 1000, with_bytes=False) == (0, 5)
    assert scratch_usage(str(tmp_path), 2)[1] == 3  # stops counting once past the cap
    assert scratch_usage(str(tmp_path / "missing"), 10) == (0, 0)


def test_scratch_usage_stops_once_past_the_byte_cap(tmp_path):
    for i in range(50):
        (tmp_path / f"f{i}").write_bytes(b"x" * 100000)
    per_file = (tmp_path / "f0").stat().st_blocks * 512
    assert scratch_usage(str(tmp_path), 1000) == (50 * per_file, 50)
    assert scratch_usage(str(tmp_path), 1000, max_bytes=per_file + 1) == (2 * per_file, 2)
    assert scratch_usage(str(tmp_path), 1000, with_bytes=False, max_bytes=1) == (0, 50)


def test_scratch_usage_reaches_below_path_max(tmp_path):
    import os
    levels = WALK_HELD_DIRS + 30  # 94 levels of 200 characters: far past PATH_MAX and the held dirs
    fd = os.open(tmp_path, os.O_RDONLY)
    for _ in range(levels):
        os.mkdir("d" * 200, dir_fd=fd)
        parent, fd = fd, os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
        os.close(parent)
    hidden = os.open("hidden", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(hidden, b"x" * 1000000)
    os.close(hidden)
    os.close(fd)
    used, inodes = scratch_usage(str(tmp_path), 10**6)
    assert inodes == levels + 1 and used >= 1000000


def test_failure_frames_carry_a_capped_message_and_every_field():
    frame = failure_frame(protocol.RUNNER_ERROR, "y" * 100000)
    assert len(frame["message"]) == protocol.MAX_ERROR_MESSAGE_CHARS and frame["message"].endswith("\u2026")
    assert frame["artifactsSkippedUnlisted"] == 0 and frame["artifactsSkipped"] == []


def run_filter(code, arch: int, number: int, flags: int = 0) -> int:
    """A classic-BPF interpreter for the few instructions the filter uses, over one seccomp_data."""
    fields = {seccomp.SECCOMP_DATA_ARCH: arch, seccomp.SECCOMP_DATA_NR: number, seccomp.SECCOMP_DATA_ARG0: flags}
    accumulator, at = 0, 0
    while True:
        op, jt, jf, k = code[at]
        if op == seccomp.BPF_RET:
            return k
        if op == seccomp.BPF_LD_W_ABS:
            accumulator = fields[k]
            at += 1
            continue
        taken = {seccomp.BPF_JEQ: accumulator == k, seccomp.BPF_JGE: accumulator >= k,
                 seccomp.BPF_JSET: bool(accumulator & k)}[op]
        at += 1 + (jt if taken else jf)


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_syscall_filter_refuses_namespaces_and_the_denied_calls_and_allows_the_rest(machine):
    code = seccomp.syscall_filter(machine)
    arch, numbers = seccomp.SYSCALL_TABLES[machine]
    eperm, enosys = seccomp.SECCOMP_RET_ERRNO | 1, seccomp.SECCOMP_RET_ERRNO | 38
    for name in seccomp.DENIED_SYSCALLS:
        assert run_filter(code, arch, numbers[name]) == eperm, name
    for number in (0, 1, 57, 59, 231, 424):  # read, write, fork, execve, exit_group, pidfd_send_signal (x86_64)
        assert run_filter(code, arch, number) == seccomp.SECCOMP_RET_ALLOW, number
    clone = numbers["clone"]
    assert run_filter(code, arch, clone, 0x01200011) == seccomp.SECCOMP_RET_ALLOW  # fork's own flags
    assert run_filter(code, arch, clone, 0x003D0F00) == seccomp.SECCOMP_RET_ALLOW  # pthread_create's
    for flag in (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000):
        assert run_filter(code, arch, clone, 0x11 | flag) == eperm, hex(flag)
    assert run_filter(code, arch, numbers["clone3"]) == enosys
    assert run_filter(code, arch, 0x40000000 | 272) == eperm  # the x32 ABI
    assert run_filter(code, 0x40000003, 1) == eperm  # another architecture (i386)
    assert seccomp.syscall_filter("mips") is None


def test_a_deleted_file_is_told_by_its_link_count_or_its_mark(tmp_path):
    kept = tmp_path / "kept (deleted)"  # a live file may carry the mark in its own name
    kept.write_text("x")
    info = os.stat(kept)
    assert not is_unlinked(str(kept), info)
    assert is_unlinked(str(tmp_path / "gone") + " (deleted)", info)  # gVisor: nlink 1, the path is gone
    other = tmp_path / "other"
    other.write_text("y")
    assert is_unlinked(str(other) + " (deleted)", info)  # the name was reused by another file
    assert not is_unlinked(str(tmp_path / "plain"), info)


def test_at_the_deadline_the_program_is_frozen_before_the_last_count(tmp_path):
    """The deadline's count of /tmp sees a program that no longer runs: a flood beside it could stretch the count,
    and the run, far past the deadline at a low CPU limit."""
    from coderun.sandbox.runner.child import run_child
    from coderun.sandbox.runner.limits import Guards

    class Recording(Guards):
        states: list[str] = []

        def child_limits(self) -> None:  # the host's test process: no filter, rlimits or namespaces
            pass

        def due(self, now: float) -> bool:  # only the deadline's count
            return False

        def check(self, now: float, final: bool = False):
            with open(f"/proc/{self.session}/stat") as f:
                self.states.append(f.read().rsplit(")", 1)[1].split()[0])
            return None

    guards = Recording(str(tmp_path), None, 100, 100, None, is_pid1=False)
    outcome = run_child(["python3", "-c", "while True: pass"], str(tmp_path), {"PATH": "/usr/bin:/bin"}, None,
                        timeout_seconds=0.5, output_bytes=1024, flood_bytes=4096, is_pid1=False, guards=guards)
    assert outcome.runner_kill_reason == protocol.TIMEOUT
    assert Recording.states[0] == "T", Recording.states  # stopped, then killed


def test_the_exit_waiters_byte_never_lands_in_a_later_file(tmp_path, monkeypatch):
    """The waiter thread records the child's exit, then writes a byte to wake the loop; the loop can act on the
    record first (here woken by the end of stdout, held open by a grandchild a moment past the exit) and return.
    Its pipe must stay open until that byte is written, or the byte goes to whatever file reused the pipe's fd
    number next (a session's next input file, say)."""
    import threading
    import time
    from coderun.sandbox.runner import child

    write = os.write

    def late_wake(fd, data):
        if data == b"x" and threading.current_thread().name != "MainThread":
            time.sleep(0.3)  # the waiter, after exited_at was recorded
        return write(fd, data)
    monkeypatch.setattr(child.os, "write", late_wake)
    program = "import subprocess; subprocess.Popen(['sleep', '0.1'])"
    outcome = child.run_child(["python3", "-c", program], str(tmp_path), {"PATH": "/usr/bin:/bin"}, None,
                              timeout_seconds=10, output_bytes=1024, flood_bytes=4096, is_pid1=False)
    monkeypatch.setattr(child.os, "write", write)
    assert outcome.returncode == 0
    # the lowest free fds (the run's pipes' and the wake pipe's, once closed), each a file open for writing
    later = [os.open(tmp_path / f"later-{i}", os.O_WRONLY | os.O_CREAT) for i in range(6)]
    time.sleep(0.5)  # past the waiter's late byte, had it been left to land
    for fd in later:
        os.close(fd)
    assert [os.path.getsize(tmp_path / f"later-{i}") for i in range(6)] == [0] * 6
