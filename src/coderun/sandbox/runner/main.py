"""PID 1 of every sandbox container: read the input, run the program, print exactly one frame and vouch for it."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
import types

from .artifacts import collect_artifacts
from .child import OOM_EVIDENCE_WAIT_SECONDS, cgroup_reports_oom_kill, child_environment, child_metrics, run_child
from .confinement import enter_user_namespace, make_undumpable, mount_capped_scratch
from .errors import V8_HEAP_EXHAUSTED
from .frame import encode_frame, failure_frame, result_frame, termination_summary
from .inputs import InputIncomplete, InvalidInput, load_run_spec, materialise_inputs, read_stdin_input
from .limits import Guards
from .processes import kill_all_other_processes
from .protocol import ACCEPTED_PREFIX, FRAME_PREFIX, INPUT_INCOMPLETE, INVALID_INPUT, RUNNER_ERROR

# Signals a program may send to PID 1: a no-op handler (reset to the default at exec, unlike SIG_IGN, which
# the program would inherit) keeps the runner alive to report.
SHIELDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGPIPE")


def execute(args: types.SimpleNamespace, is_pid1: bool, termination_fd: int | None = None,
            own_namespaces: bool = False) -> dict:
    # Absolute, because the program's cwd is the work dir.
    work, outputs = os.path.abspath(args.work), os.path.abspath(args.outputs)
    scratch_dir = os.path.dirname(work)
    scratch_capped = False
    try:
        spec = load_run_spec(args.input)
        # Before the inputs are laid out there: they count against the caps, as the walk counts them.
        scratch_capped = own_namespaces and spec["scratchTmpfs"] and mount_capped_scratch(
            scratch_dir, spec["maxInodes"], spec["diskBytes"])
        materialise_inputs(spec, args.input, work)
        stdin_path = None
        if spec["stdinKey"] is not None:
            stdin_path = os.path.join(args.input, spec["stdinKey"])
            if not os.path.isfile(stdin_path):
                raise InvalidInput(f"input key {spec['stdinKey']!r} is missing")
    except InvalidInput as exc:
        return failure_frame(INVALID_INPUT, str(exc))
    home_dir = os.path.join(scratch_dir, "home")
    os.makedirs(home_dir, exist_ok=True)
    os.makedirs(outputs, exist_ok=True)
    env = child_environment(spec["env"], scratch_dir, home_dir, outputs,
                            spec["memoryBytes"] if spec["language"] == "javascript" else None)
    guards = Guards(scratch_dir, spec["diskBytes"], spec["maxInodes"], spec["maxProcesses"], termination_fd,
                    is_pid1, os.path.abspath(args.input), scratch_capped)
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
USAGE = ("usage: python3 -I /opt/coderun [--input DIR] [--input-stdin] [--work DIR] [--outputs DIR]\n"
         "                               [--termination-log FILE]\n"
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
            print(f"{USAGE}\ncoderun-runner: bad argument {option!r}", file=sys.stderr)
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
    own_namespaces = False
    if is_pid1:
        own_namespaces = enter_user_namespace()
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
            frame = execute(args, is_pid1, termination_fd, own_namespaces)
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
