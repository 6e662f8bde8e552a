"""PID 1 of every sandbox container: read the input, run the program, print exactly one frame and vouch for it."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import resource
import signal
import sys
import time
import types

from .artifacts import Store, collect_artifacts
from .child import (OOM_EVIDENCE_WAIT_SECONDS, cgroup_reports_oom_kill, child_environment, child_metrics, run_child,
                    supervise_child)
from .confinement import enter_user_namespace, make_undumpable, mount_capped_scratch
from .errors import V8_HEAP_EXHAUSTED
from .data import DataService, HeldInput, InputFailure, lay_out_inputs
from .frame import encode_frame, failure_frame, input_error_frame, result_frame, termination_summary
from .inputs import (InputIncomplete, InvalidInput, empty_directory, lay_out_input, link_input, load_run_spec,
                     materialise_inputs, read_stdin_document)
from .limits import Guards
from .kept_interpreter import KeptInterpreter
from .prestart import ForkServer, Prestarted, PrestartSettingsError, fits, parse_settings, start_program
from .processes import kill_all_other_processes
from .protocol import (FRAME_PREFIX, INPUT_INCOMPLETE, INVALID_INPUT, RUNNER_ERROR, SIGNALED,
                       SESSION_SETTINGS_KEY, accepted_line)
from .input_stream import SessionInput, SessionInputs

# Signals a program may send to PID 1: a no-op handler (reset to the default at exec, unlike SIG_IGN, which
# the program would inherit) keeps the runner alive to report.
SESSION_KEY = re.compile(r"^(?:[0-9a-f]{2}){32,64}$")

SHIELDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGPIPE")


class SandboxMismatch(Exception):
    """The sandbox was set up (its /tmp mounted, its program prestarted) for other limits than the run's."""


class ScratchMount:
    """Whether the scratch dir is a capped tmpfs of ours (confinement.mount_capped_scratch). It is mounted once,
    over the empty scratch dir, before the first program (or the prestarted one, whose mount namespace is a copy
    made then): a session's later runs keep it, and what is in it, so every run must ask for the same caps."""

    def __init__(self):
        self.tried, self.capped, self.caps = False, False, None

    def ensure(self, spec: dict, scratch_dir: str, own_namespaces: bool) -> bool:
        caps = (spec["scratchTmpfs"], spec["maxInodes"], spec["diskBytes"])
        if not self.tried:
            self.tried, self.caps = True, caps
            self.capped = bool(own_namespaces and spec["scratchTmpfs"] and mount_capped_scratch(
                scratch_dir, spec["maxInodes"], spec["diskBytes"]))
        elif caps != self.caps:
            raise SandboxMismatch(f"this sandbox's /tmp was set up for (tmpfs, inodes, bytes) {self.caps}, "
                                  f"the run asks for {caps}")
        return self.capped


class Sandbox:
    """What a warm or session pod keeps from run to run: its scratch mount, and the program process prestarted
    for the next run (the operator's `--prestart` settings; none for a runtime it cannot stand in for), or with
    keepState (`--keep-state`) the one interpreter every run of the session runs in. A session's Python programs
    are forked by its fork server (forkserver.py), once it serves one (`in_session`)."""

    def __init__(self, args, is_pid1: bool, own_namespaces: bool, settings: dict | None = None):
        self.args, self.is_pid1, self.own_namespaces, self.settings = args, is_pid1, own_namespaces, settings
        self.keep_state = args.keep_state
        self.scratch = ScratchMount()
        self.prestarted: Prestarted | None = None
        self.kept: KeptInterpreter | None = None
        self.in_session = False
        self.fork_server: ForkServer | None = None
        self.fork_server_tried = False  # one start a sandbox: a server that fails leaves the runs to exec
        self.held_inputs: dict[str, HeldInput] = {}  # the data plane's inputs laid out so far: a session keeps them

    def prestart(self) -> None:
        """Start the next run's program now, under the limits the pod was made for (one left from before is
        given up first: as PID 1 the last frame's printing killed it). An optimisation only: if it fails, every
        later run starts cold. With keepState, the session's interpreter, once: without it no run can keep state,
        and each is refused (session_run says so)."""
        if self.prestarted is not None:
            self.take_prestarted().discard()
        if self.settings is None or (self.keep_state and self.kept is not None):
            return
        try:
            paths = ProgramPaths(self.args)
            capped = self.scratch.ensure(self.settings, paths.scratch, self.own_namespaces)
            paths.make()
            guards = Guards(paths.scratch, self.settings["diskBytes"], self.settings["maxInodes"],
                            self.settings["maxProcesses"], None, self.is_pid1, paths.input, capped, paths.inputs)
            # What every run's environment has (Node reads its heap size from it as it starts); the word
            # brings the run's own.
            base_env = paths.environment({}, self.settings["language"], self.settings["memoryBytes"])
            if self.keep_state:
                started = start_program(self.settings, paths.work, base_env, guards, keep=True)
                self.kept = KeptInterpreter.adopt(self.settings, *started) if started is not None else None
            else:
                server = self.serving_fork_server(paths, base_env)
                self.prestarted = ((server and Prestarted.fork(server, self.settings, paths.home))
                                   or Prestarted.start(self.settings, paths.work, base_env, guards))
        except Exception as exc:  # noqa: BLE001
            print(f"coderun-runner: could not prestart ({type(exc).__name__}: {exc}); runs start cold",
                  file=sys.stderr)
            self.settings = None

    def serving_fork_server(self, paths: "ProgramPaths", base_env: dict) -> ForkServer | None:
        """The session's fork server, started with the first program it can fork (Python's, in a session, as PID 1
        with namespaces of our own: only there is the server out of the programs' reach); None once it failed."""
        if not self.fork_server_tried and self.in_session and self.own_namespaces:
            self.fork_server_tried = True
            self.fork_server = ForkServer.start(self.settings, paths.work, paths.input, base_env, self.is_pid1,
                                                paths.inputs)
        return self.fork_server if self.fork_server is not None and self.fork_server.serves() else None

    def fork_server_pids(self) -> frozenset[int]:
        """The fork server, while it serves: it outlives each run and is not counted as the run's."""
        return self.fork_server.pids if self.fork_server is not None and self.fork_server.serves() else frozenset()

    def spared(self) -> frozenset[int]:
        """What must outlive a run's frame: the keepState interpreter's chain, or the fork server."""
        return self.kept.chain if self.kept is not None else self.fork_server_pids()

    def take_prestarted(self) -> Prestarted | None:
        prestarted, self.prestarted = self.prestarted, None
        return prestarted


class ProgramPaths:
    """Where the program lives: its work dir (cwd), the scratch dir above it (/tmp: HOME and TMPDIR), outputs; and
    the data plane's inputs dir (its own volume, read-only to the program)."""

    def __init__(self, args):
        # Absolute, because the program's cwd is the work dir.
        self.work, self.outputs = os.path.abspath(args.work), os.path.abspath(args.outputs)
        self.input = os.path.abspath(args.input)
        self.inputs = os.path.abspath(args.inputs)
        self.scratch = os.path.dirname(self.work)
        self.home = os.path.join(self.scratch, "home")

    def make(self) -> None:
        for path in (self.work, self.home, self.outputs):
            os.makedirs(path, exist_ok=True)
        # Before any program's mount namespace is made (a prestarted one's too, before its run's input comes), so
        # the mounts that hide the raw input (run.json holds the data plane's grant) and make the inputs dir
        # read-only (confinement) have their dirs to go over. Only the dirs themselves: their parents are the
        # pod's (where the pod has no volume for inputs, a run with inputs says so).
        for path, mode in ((self.input, 0o700), (self.inputs, 0o755)):
            try:
                os.mkdir(path, mode)
            except OSError:
                pass

    def environment(self, spec_env: dict, language: str, memory_bytes: int) -> dict:
        return child_environment(spec_env, self.scratch, self.home, self.outputs,
                                 memory_bytes if language == "javascript" else None)


def execute(args: types.SimpleNamespace, is_pid1: bool, termination_fd: int | None = None,
            own_namespaces: bool = False, scratch: ScratchMount | None = None,
            prestarted: Prestarted | None = None, kept: KeptInterpreter | None = None,
            spared: frozenset[int] = frozenset(), held_inputs: dict[str, HeldInput] | None = None) -> dict:
    """Run the program of the input at args.input (its data-plane inputs laid out first; `held_inputs`: what the
    sandbox holds of them from earlier runs): in `kept` (a keepState session's interpreter), in
    `prestarted` (a process started for it before it came) when the run starts exactly as that process did, else
    in a process started now (a cold start). A prestarted process the run did not take is ended, whatever
    happened. `spared`: the session's fork server, which outlives the run (and is not counted as its)."""
    try:
        return _execute(args, is_pid1, termination_fd, own_namespaces, scratch, prestarted, kept, spared,
                        {} if held_inputs is None else held_inputs)
    finally:
        if prestarted is not None:
            prestarted.discard()  # a no-op once taken: its run reaped it


def _execute(args: types.SimpleNamespace, is_pid1: bool, termination_fd: int | None, own_namespaces: bool,
             scratch: ScratchMount | None, prestarted: Prestarted | None, kept: KeptInterpreter | None,
             spared: frozenset[int], held_inputs: dict[str, HeldInput]) -> dict:
    paths = ProgramPaths(args)
    scratch = scratch or ScratchMount()
    try:
        spec = load_run_spec(args.input)
        # Before the inputs are laid out there: they count against the caps, as the walk counts them.
        scratch_capped = scratch.ensure(spec, paths.scratch, own_namespaces)
        materialise_inputs(spec, args.input, paths.work)
        stdin_path = None
        if spec["stdinKey"] is not None:
            stdin_path = os.path.join(args.input, spec["stdinKey"])
            if not os.path.isfile(stdin_path):
                raise InvalidInput(f"input key {spec['stdinKey']!r} is missing")
    except (InvalidInput, SandboxMismatch) as exc:
        return failure_frame(INVALID_INPUT if isinstance(exc, InvalidInput) else RUNNER_ERROR, str(exc))
    paths.make()
    try:
        service = fetch_inputs(spec, paths, held_inputs)
    except InputFailure as exc:
        return input_error_frame(exc.path, exc.reason, exc.message)
    except InvalidInput as exc:
        return failure_frame(INVALID_INPUT, str(exc))
    store = service.store if service is not None and spec["data"]["artifactsToStore"] else None
    env = paths.environment(spec["env"], spec["language"], spec["memoryBytes"])
    guards = Guards(paths.scratch, spec["diskBytes"], spec["maxInodes"], spec["maxProcesses"], termination_fd,
                    is_pid1, paths.input, scratch_capped, paths.inputs)
    guards.uncounted = spared
    if kept is not None:
        return run_in_kept(kept, spec, env, stdin_path, guards, paths, store)
    prestart_cpu = None
    if prestarted is not None:
        # A process given up is reaped here, before the usage below: its start is not the run's either.
        prestart_cpu = prestarted.take(env, stdin_path, spec["codeFile"]) if fits(prestarted.settings, spec) else None
        if prestart_cpu is None:
            prestarted.discard()
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)  # a session's earlier runs are not this one's
    outcome = None
    if prestart_cpu is not None:
        outcome = supervise_child(prestarted.proc, time.monotonic(), spec["timeoutSeconds"], spec["outputBytes"],
                                  spec["floodBytes"], is_pid1, guards, spared)
    else:
        try:
            outcome = run_child(spec["command"], paths.work, env, stdin_path, spec["timeoutSeconds"],
                                spec["outputBytes"], spec["floodBytes"], is_pid1, guards, spared)
        except OSError as exc:  # e.g. the image lacks the interpreter
            return failure_frame(RUNNER_ERROR, f"could not start {spec['command'][0]!r}: {exc}")
    metrics = child_metrics(outcome.wall_seconds, usage_before, prestart_cpu or 0.0,
                            prestarted.usage_elsewhere() if prestart_cpu is not None else (0.0, 0),
                            outcome.cpu_at_kill)
    oom_killed = outcome.runner_kill_reason is None and (
        (outcome.returncode == -signal.SIGKILL and cgroup_reports_oom_kill(wait_seconds=OOM_EVIDENCE_WAIT_SECONDS))
        or (outcome.returncode < 0 and bool(V8_HEAP_EXHAUSTED.search(outcome.stderr.text_for_parsing()))))
    artifacts, skipped, unlisted = collect_artifacts(paths.outputs, spec["artifacts"], store)
    frame = result_frame(spec, outcome, metrics, oom_killed, artifacts, skipped, unlisted)
    if prestart_cpu is not None:
        frame["prestarted"] = True  # the program ran in a process started before its code came
    return frame


def fetch_inputs(spec: dict, paths: ProgramPaths, held_inputs: dict[str, HeldInput]) -> DataService | None:
    """The run's data-plane inputs in the inputs dir (data.py), each linked from the work dir at its path; what an
    earlier run of the session held and this one does not name is taken out. The run's data service, if any."""
    data = spec["data"]
    service = DataService(data) if data is not None else None
    inputs = data["inputs"] if data is not None else []
    if inputs or held_inputs:
        lay_out_inputs(inputs, paths.inputs, held_inputs, service)
    for entry in inputs:
        link_input(paths.work, entry["path"], os.path.join(paths.inputs, entry["path"]))
    return service


def run_in_kept(kept: KeptInterpreter, spec: dict, env: dict, stdin_path: str | None, guards: Guards,
                  paths: ProgramPaths, store: Store | None = None) -> dict:
    """A keepState run: in the session's interpreter, which must be able to stand in for the run's start."""
    if not fits(kept.settings, spec):
        return failure_frame(INVALID_INPUT, "a keepState session runs every run in the one interpreter it started "
                                            "with the session: a run cannot change how it starts (its command, or "
                                            "a variable such as PYTHONPATH read at start); run it in a session "
                                            "with keepState false")
    outcome, lost, metrics = kept.run(env, stdin_path, spec["codeFile"], spec["timeoutSeconds"],
                                        spec["outputBytes"], spec["floodBytes"], guards)
    if outcome is None:  # the run never reached the interpreter: nothing of it ran
        frame = failure_frame(RUNNER_ERROR, f"the session's interpreter could not take the run ({lost})")
        frame["interpreterLost"] = lost
        return frame
    oom_killed = (outcome.runner_kill_reason is None and outcome.returncode == -signal.SIGKILL
                  and cgroup_reports_oom_kill(wait_seconds=OOM_EVIDENCE_WAIT_SECONDS))
    artifacts, skipped, unlisted = collect_artifacts(paths.outputs, spec["artifacts"], store)
    frame = result_frame(spec, outcome, metrics, oom_killed, artifacts, skipped, unlisted)
    frame["prestarted"] = True
    if lost is not None:
        frame["interpreterLost"] = lost
    return frame


DEFAULT_PATHS = {
    "input": "/coderun/input",                      # the input ConfigMap mount, or where --input-stdin writes it
    "inputs": "/coderun/inputs",                    # the data plane's inputs (a volume of their own), read-only to it
    "work": "/tmp/work",                            # writable; the program's cwd
    "outputs": "/tmp/outputs",                      # CODERUN_OUTPUT_DIR, collected as artifacts
    "termination_log": "/dev/termination-log",
    "prestart": "",                                 # a warm or session pod's settings (JSON) to prestart programs by
}
USAGE = ("usage: python3 -I /opt/coderun [--input DIR] [--input-stdin | --session] [--work DIR] [--outputs DIR]\n"
         "                               [--inputs DIR]\n"
         "                               [--termination-log FILE] [--prestart JSON]\n"
         "Run one sandboxed program and print a framed result. --input-stdin (a warm pool pod): wait for the\n"
         "input on stdin and write it to the input dir (a volume of its own) instead of reading a mounted ConfigMap.\n"
         "--session (a session pod): one run per input document on stdin, a frame each, until stdin ends.\n"
         "--prestart (with either): start each program before its input comes, as these run.json settings say.\n"
         "--keep-state (with --session and --prestart): one interpreter for all the session's runs.\n"
         "--inputs: where run.json's data-plane inputs are fetched to (linked from the work dir, read-only to it).")


def parse_args(argv: list[str]) -> types.SimpleNamespace:
    """`--name VALUE` or `--name=VALUE` for the paths. Hand-rolled
    because importing argparse costs ~10 ms on every run."""
    paths = dict(DEFAULT_PATHS)
    args, flags = list(argv), {"input_stdin": False, "session": False, "keep_state": False}
    while args:
        option = args.pop(0)
        if option in ("-h", "--help"):
            print(USAGE)
            sys.exit(0)
        if option in ("--input-stdin", "--session", "--keep-state"):
            flags[option[2:].replace("-", "_")] = True
            continue
        name, has_value, value = option.partition("=")
        key = name[2:].replace("-", "_") if name.startswith("--") else None
        if key not in paths or not (has_value or args):
            print(f"{USAGE}\ncoderun-runner: bad argument {option!r}", file=sys.stderr)
            sys.exit(2)
        paths[key] = value if has_value else args.pop(0)
    if flags["input_stdin"] and flags["session"]:
        print(f"{USAGE}\ncoderun-runner: --input-stdin and --session are two modes: give one", file=sys.stderr)
        sys.exit(2)
    return types.SimpleNamespace(**paths, **flags)


def prestart_settings(args) -> dict | None:
    """The --prestart settings, or None (none given, or not usable: the runs then start cold, as before)."""
    if not args.prestart or not (args.input_stdin or args.session):
        return None
    try:
        return parse_settings(args.prestart)
    except PrestartSettingsError as exc:
        print(f"coderun-runner: {exc}; every run starts cold", file=sys.stderr)
        return None


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


def print_frame(frame: dict, is_pid1: bool, spared: frozenset[int] = frozenset()) -> bytes:
    """Print the frame once nothing of the program is left to print after it (but the keepState interpreter,
    `spared`, whose run has ended); return its JSON text."""
    if is_pid1:
        kill_all_other_processes(spared=spared)
    frame_json = encode_frame(frame)
    out = sys.stdout.buffer
    # The leading newline ends any partial line a program wrote to our stdout
    # (via /proc/1/fd/1), so the frame always starts its own line.
    out.write(b"\n" + FRAME_PREFIX.encode("ascii") + frame_json + b"\n")
    out.flush()
    return frame_json


def announce_accepted(nonce: str) -> None:
    """The operator's proof that the program may be running: a digest of the nonce, never the nonce."""
    sys.stdout.buffer.write(accepted_line(hashlib.sha256(nonce.encode()).hexdigest()).encode())
    sys.stdout.buffer.flush()


def accept_stdin_input(input_dir: str) -> tuple[str | None, dict | None, SessionInput | None]:
    """A warm pod's input: (nonce, None, None) once all of it is read, announced on stdout (the operator's proof
    that the program may be running); else (None, the failure frame, None). A session's first document (it
    carries the session's settings: a session claimed this pool pod) is returned unread as the third, for
    serve_session. The nonce is never written anywhere the program can read: only this process, undumpable and
    outside the program's PID namespace, holds it."""
    try:
        nonce, entries = read_stdin_document(sys.stdin.buffer)
        if SESSION_SETTINGS_KEY in entries:
            return None, None, SessionInput(nonce, entries, None)
        lay_out_input(entries, input_dir)
    except InputIncomplete as exc:
        return None, failure_frame(INPUT_INCOMPLETE, str(exc)), None
    except InvalidInput as exc:
        return None, failure_frame(INVALID_INPUT, str(exc)), None
    except OSError as exc:
        return None, failure_frame(RUNNER_ERROR, f"could not read the input: {exc}"), None
    announce_accepted(nonce)
    return nonce, None, None


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
    sandbox = Sandbox(args, is_pid1, own_namespaces, prestart_settings(args))
    if args.session:
        serve_session(args, termination_fd, sandbox)
        return 0
    nonce, frame = None, None
    if args.input_stdin:
        sandbox.prestart()  # while the pod waits for its run
        nonce, frame, session_first = accept_stdin_input(args.input)
        if session_first is not None:  # a session claimed this pool pod: it is that session's sandbox now
            serve_session(args, termination_fd, sandbox, session_first)
            return 0
        started_at_millis = int(time.time() * 1000)  # the program's start-up begins now, not at the pod's
    if frame is None:
        try:
            frame = execute(args, is_pid1, termination_fd, own_namespaces, sandbox.scratch, sandbox.take_prestarted())
        except Exception as exc:  # the frame must still be printed
            frame = failure_frame(RUNNER_ERROR, f"runner failed: {type(exc).__name__}: {exc}")
    frame["startedAtMillis"] = started_at_millis
    if nonce is not None:
        frame["nonce"] = nonce
    frame_json = print_frame(frame, is_pid1)
    write_termination_log(termination_fd, termination_summary(frame, frame_json))
    return 0


def session_settings(entries: dict[str, bytes], keep_state: bool | None = False) -> tuple[bytes, bool]:
    """The session's key and keepState from its first document's `session.json` ({"key": 64-128 hex digits,
    "keepState"}), taken out of the run's keys: the program never sees them. InvalidInput if there is none or it
    is malformed, or if its keepState is not the one the pod's runner was started with (`--keep-state`; None: a
    pool pod's runner, which takes the session's)."""
    try:
        settings = json.loads(entries.pop(SESSION_SETTINGS_KEY))
    except KeyError:
        raise InvalidInput(f"the session's first input has no {SESSION_SETTINGS_KEY}") from None
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput(f"{SESSION_SETTINGS_KEY} is not valid JSON") from None
    key = settings.get("key") if isinstance(settings, dict) else None
    if not (isinstance(key, str) and SESSION_KEY.match(key)):
        raise InvalidInput(f"{SESSION_SETTINGS_KEY}: key must be 64-128 hex digits")
    if not isinstance(settings.get("keepState", False), bool):
        raise InvalidInput(f"{SESSION_SETTINGS_KEY}: keepState must be true or false")
    if keep_state is not None and settings.get("keepState", False) is not keep_state:
        raise InvalidInput(f"{SESSION_SETTINGS_KEY}: keepState must be {str(keep_state).lower()}, as the session's "
                           "sandbox was started")
    return bytes.fromhex(key), settings.get("keepState", False)


def session_run(document, args, termination_fd: int | None, sandbox: Sandbox) -> dict:
    """One run of a session: its keys laid out afresh in the input dir (nothing of the last run's input stays),
    the outputs dir emptied, the work dir as the last run left it, and the program run as a cold run's."""
    if document.error is not None:
        return failure_frame(INVALID_INPUT, document.error)
    try:
        empty_directory(args.input)
        lay_out_input(document.entries, args.input)
        empty_directory(args.outputs)
    except InvalidInput as exc:
        return failure_frame(INVALID_INPUT, str(exc))
    except OSError as exc:
        return failure_frame(RUNNER_ERROR, f"could not lay out the run's input: {exc}")
    if termination_fd is not None:
        os.ftruncate(termination_fd, 0)  # what an earlier run wrote there was that run's violation, not this one's
    announce_accepted(document.nonce)
    if sandbox.keep_state and sandbox.kept is None:
        return failure_frame(RUNNER_ERROR, "the keepState session's interpreter could not be started")
    # (The keepState interpreter's chain is counted as the run's, as a cold program's own chain would be.)
    return execute(args, sandbox.is_pid1, termination_fd, sandbox.own_namespaces, sandbox.scratch,
                   sandbox.take_prestarted(), sandbox.kept, sandbox.fork_server_pids(), sandbox.held_inputs)


def killed_unasked(frame: dict) -> bool:
    """The program died of a SIGKILL that the runner did not send (its own kills have their own reasons)."""
    return frame.get("reason") == SIGNALED and frame.get("signal") == signal.SIGKILL and not frame.get("oomKilled")


def serve_session(args, termination_fd: int | None, sandbox: Sandbox, first: SessionInput | None = None) -> None:
    """--session: a run per document on stdin (input_stream.SessionInputs), each answered by a frame with its own
    nonce, until the stream ends. The first document carries the session's key; every later one must carry its
    MAC. Every process a run left is killed before its frame, so none is alive when the next run starts, and
    none can print into a later run's output. The termination log gets the last frame's summary at the end
    (emptied before each run: a program that writes it breaks the sandbox's rule in its own run, as cold).
    `first`: a pool pod's first document, already read (its program prestarted for a run, not for keepState)."""
    inputs = SessionInputs(sys.stdin.buffer)
    is_pid1 = sandbox.is_pid1
    sandbox.in_session = True
    frame_json, frame = None, None
    try:
        if first is None:
            sandbox.prestart()
        for document in itertools.chain([first] if first is not None else [], inputs):
            started_at_millis = int(time.time() * 1000)
            try:
                if inputs.key is None and document.error is None:
                    inputs.key, keep_state = session_settings(document.entries,
                                                              None if first is not None else sandbox.keep_state)
                    if keep_state and not sandbox.keep_state:  # a pool pod's: its prestarted program gives way
                        sandbox.keep_state = True
                        sandbox.prestart()
                frame = session_run(document, args, termination_fd, sandbox)
            except InvalidInput as exc:
                frame = failure_frame(INVALID_INPUT, str(exc))
            except Exception as exc:  # the frame must still be printed
                frame = failure_frame(RUNNER_ERROR, f"runner failed: {type(exc).__name__}: {exc}")
            frame["startedAtMillis"] = started_at_millis
            if document.nonce is not None:
                frame["nonce"] = document.nonce
            frame_json = print_frame(frame, is_pid1, sandbox.spared())
            if inputs.key is None:
                return  # without the session's key no later document could be told from another client's
            if frame.get("interpreterLost"):
                return  # a keepState session without its interpreter has nothing left to keep: it ends
            if killed_unasked(frame):
                # A SIGKILL the runner did not send is most often the sandbox's memory running out (gVisor's
                # cgroupfs keeps no OOM count to read here). The container's end is what says so (OOMKilled, as
                # for a cold run), and a sandbox under that pressure cannot be vouched for: the session ends.
                return
            sandbox.prestart()  # the next run's program, started while the session waits for it
    except InputIncomplete as exc:  # the stream broke: nothing after could be read in step
        frame = failure_frame(INPUT_INCOMPLETE, str(exc))
        frame_json = print_frame(frame, is_pid1)
    finally:
        if frame_json is not None:
            write_termination_log(termination_fd, termination_summary(frame, frame_json))
        elif termination_fd is not None:
            os.close(termination_fd)
