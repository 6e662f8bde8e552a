"""A program's process started before its code arrives: the runner's side of prestarted.py (Python) and
prestarted.js (Node).

A warm pod starts one as it boots, a session as each run ends, so a run pays neither the interpreter's start under
gVisor (Python ~110 ms, Node more) nor Python's common imports (pandas: ~750 ms). It is started as the program
itself would be, by the same Popen and preexec (the program's namespaces, rlimits and syscall filter), with the
environment every run gets, and waits on a socketpair for the run's word. The settings it was started with come
from the operator (`--prestart JSON`: the pod's language, command, code file and limits); a run whose spec differs
in anything its start depends on (another command, a startup variable such as PYTHONPATH or NODE_OPTIONS in its
env) gives it up and starts cold.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import resource
import select
import signal
import socket
import subprocess
import threading
import time

from .capture import READ_CHUNK, StreamCapture
from .inputs import InvalidInput, parse_run_spec
from .forkserver import FAILED_FORK_STATUS, SETTINGS_VARIABLE
from .limits import Guards
from .processes import kill_all_other_processes, kill_process_group
from .prestarted import FD_VARIABLE, KEEP_VARIABLE, MODULES_VARIABLE
from .protocol import FORK_SERVER_MARK, NODE_PRESTART_FILE, PRESTART_MODULE, can_keep_state, can_prestart

# What the runner's package root is: /opt/coderun in the images (the program imports prestarted from there).
RUNNER_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# `-c` puts the work dir first on sys.path, where an earlier run of a session may have left a json.py: it goes
# before anything is imported (prestarted.main puts it back for the program).
BOOTSTRAP = ("import sys; sys.path[0:1] = [{root!r}]; "
             f"from {PRESTART_MODULE} import main; main({{root!r}}{{serve_forks}})")
# Modules imported before the code arrives, each only where the pod's memory leaves the program room for it: a
# preloaded module's pages count against the pod's limit whether or not the program imports it, and a program
# that fits cold must fit here too. (numpy ~25 MiB, and pandas ~60 MiB more, resident under gVisor.)
PRELOADS = (("numpy", 256 * 1048576), ("pandas", 512 * 1048576))
# Environment variables an interpreter (or a preloaded module, or the dynamic loader) reads as it starts: a run
# that sets one starts cold, since the prestarted process read the run-less value.
STARTUP_VARIABLES = ("PYTHON", "LD_", "LC_", "LANG", "LANGUAGE", "TZ", "HOME", "PATH", "MALLOC_", "GLIBC_TUNABLES",
                     "OPENBLAS", "OMP_", "MKL_", "GOTO", "NUMEXPR", "NPY_", "NUMPY_", "PANDAS",
                     "NODE", "UV_", "OPENSSL", "SSL_CERT", "ICU_", "TZDIR", "LOCPATH")
# The start is long done by the time a run comes, save on a pod that is still booting: the wait past that is
# bounded, and the run then starts cold.
ANSWER_SECONDS = 20.0
CHANNEL_FD = 1000  # or just under the fd limit, if lower
NODE_START_DIR = "/"  # the image's: read-only, and nothing of a run's there
FINAL_DRAIN_BYTES = 4 * 1024 * 1024  # what pipes can hold once every writer is stopped, with room
MAX_PRESTART_CPU_SECONDS = 60.0
SETTINGS_KEYS = ("language", "command", "codeFile", "diskBytes", "maxInodes", "maxProcesses", "memoryBytes",
                 "scratchTmpfs")


class PrestartSettingsError(ValueError):
    pass


def parse_settings(text: str) -> dict:
    """The operator's `--prestart` JSON: a run.json without a program (what the pod's runs share), checked and
    filled in as a run's own run.json is, so the two compare key by key (`fits`)."""
    try:
        return parse_run_spec(json.loads(text))
    except (ValueError, InvalidInput) as exc:
        raise PrestartSettingsError(f"--prestart: {exc}") from None


def preloads_for(memory_bytes: int | None) -> list[str]:
    return [name for name, needs in PRELOADS if memory_bytes is not None and memory_bytes >= needs]


def fits(settings: dict, spec: dict) -> bool:
    """Whether a run of `spec` would start exactly as the process prestarted with `settings` did. A Node run with
    stdin starts cold: JavaScript cannot make the file the word brings its fd 0, as a cold start's is."""
    return (all(spec.get(key) == settings[key] for key in SETTINGS_KEYS)
            and not any(name.startswith(STARTUP_VARIABLES) for name in spec.get("env", {}))
            and (settings["language"] == "python" or spec.get("stdinKey") is None))


def user_site_exists(home_dir: str) -> bool:
    """A session run may have installed packages (or a .pth file) under the home dir: an interpreter started now
    would run them outside any run's deadline. A cold start runs them inside the next run's."""
    return os.path.lexists(os.path.join(home_dir, ".local"))


def start_program(settings: dict, work_dir: str, base_env: dict, guards: Guards,
                  keep: bool = False) -> tuple[subprocess.Popen, socket.socket] | None:
    """The program's process, started as a cold one would be (the same Popen and preexec) but running
    prestarted.main, which waits on the returned channel; `keep`: it serves every run of a keepState session.
    None where it cannot stand in for the run's start."""
    if not (can_keep_state(settings) if keep else can_prestart(settings)) or user_site_exists(base_env["HOME"]):
        return None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # The channel's end goes at a high number: the number it leaves free when closed must not be one a cold start
    # has taken (Node's own fds come after it: the program's first open got 4 here, 18 cold).
    channel_fd = fcntl.fcntl(theirs.fileno(), fcntl.F_DUPFD, channel_fd_floor())
    theirs.close()
    env = dict(base_env, **{FD_VARIABLE: str(channel_fd)})
    if settings["language"] == "python":
        env[MODULES_VARIABLE] = ",".join(preloads_for(settings["memoryBytes"]))
        if keep:
            env[KEEP_VARIABLE] = "1"
        command, cwd = python_command(settings), work_dir
    else:
        # `node -r PRELOAD /tmp/work/main.js`, started in the image's root: Node resolves a preload's package scope
        # from its working dir up, which under /tmp a run could fill (a package.json whose "exports" names a file
        # of its own as any preload); in / it finds the image's. The preload waits for the word, moves to the work
        # dir, and returns: Node then looks up main.js's package scope and runs it as `node main.js` there would.
        command = [settings["command"][0], "-r", os.path.join(RUNNER_ROOT, NODE_PRESTART_FILE),
                   os.path.join(work_dir, settings["codeFile"])]
        cwd = NODE_START_DIR
    try:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                close_fds=True, pass_fds=(channel_fd,), preexec_fn=guards.child_limits)
    except OSError:
        ours.close()
        return None
    finally:
        os.close(channel_fd)
    return proc, ours


def python_command(settings: dict, serve_forks: bool = False) -> list[str]:
    """`python3 -u -c BOOTSTRAP`: a prestarted program's (its forks' too: the audit knows them by it)."""
    return [settings["command"][0], "-u", "-c",
            BOOTSTRAP.format(root=RUNNER_ROOT, serve_forks=FORK_SERVER_MARK if serve_forks else "")]


def channel_fd_floor() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return CHANNEL_FD if soft == resource.RLIM_INFINITY else min(CHANNEL_FD, soft - 1)


class Prestarted:
    """One program process, started and waiting: `take(env, stdin_path)` hands it the run (the Popen and the CPU it
    spent before the run), `discard()` ends it."""

    def __init__(self, settings: dict, proc: "subprocess.Popen | ForkedProgram", channel: socket.socket,
                 spared: frozenset[int] = frozenset()):
        self.settings, self.proc, self.channel, self.spared = settings, proc, channel, spared
        self.ended = False  # taken by its run (which reaps it) or discarded: nothing left to end

    @classmethod
    def start(cls, settings: dict, work_dir: str, base_env: dict, guards: Guards) -> "Prestarted | None":
        started = start_program(settings, work_dir, base_env, guards)
        return cls(settings, *started) if started is not None else None

    @classmethod
    def fork(cls, server: "ForkServer", settings: dict, home_dir: str) -> "Prestarted | None":
        """The program forked by the fork server, or None where it cannot stand in for the run's start (as
        start_program's), or the server failed."""
        if user_site_exists(home_dir):
            return None
        forked = server.fork()
        return cls(settings, *forked, spared=server.pids) if forked is not None else None

    def take(self, env: dict, stdin_path: str | None, code_file: str) -> float | None:
        """Hand the process its run: the CPU seconds it spent before it, or None if it did not answer in time, or
        answered that the run must start cold (its files would be shadowed by a module already imported). It is
        discarded then, and the run starts cold. One budget bounds the word and the answer together."""
        give_up = time.monotonic() + ANSWER_SECONDS
        self.channel.settimeout(ANSWER_SECONDS)  # a process still importing reads the word only when done
        try:
            self._discard_pending_output()
            send_word(self.channel, env, stdin_path, code_file)
            answer = self._answer(give_up)
        except OSError:
            answer = None
        self.channel.close()
        if answer is None:
            self.discard()
            if isinstance(self.proc, ForkedProgram) and self.proc.returncode == FAILED_FORK_STATUS:
                self.proc.server.stop()  # its forks cannot be confined here: the runs are prestarted by exec
        self.ended = True
        return answer

    def _discard_pending_output(self) -> None:
        """Nothing the process wrote before its run (nothing should: its preloads write to a pipe of their own) is
        the run's output."""
        for stream in (self.proc.stdout, self.proc.stderr):
            os.set_blocking(stream.fileno(), False)
            try:
                drain_pipe(stream, None, FINAL_DRAIN_BYTES)
            finally:
                os.set_blocking(stream.fileno(), True)

    def _answer(self, give_up: float) -> float | None:
        received = b""
        while not received.endswith(b"\n") and len(received) < 64:
            if not select.select([self.channel], [], [], max(give_up - time.monotonic(), 0))[0]:
                return None
            data = self.channel.recv(64)
            if not data:
                return None
            received += data
        try:
            cpu = float(received)
        except ValueError:
            return None  # "cold", or anything else
        # What an interpreter's start and preloads can cost; a figure past that is not believed (nor nan or inf).
        return min(max(cpu, 0.0), MAX_PRESTART_CPU_SECONDS) if math.isfinite(cpu) else None

    def discard(self) -> None:
        """End it, once."""
        if not self.ended:
            self.ended = True
            end_program(self.proc, self.channel, self.spared)

    def usage_elsewhere(self) -> tuple[float, int]:
        """(CPU seconds, max RSS bytes) of its process that the runner's own children's usage does not count: a
        fork's, which the fork server reaped."""
        if isinstance(self.proc, ForkedProgram):
            return self.proc.cpu_seconds, self.proc.max_rss_bytes
        return 0.0, 0


# The fork server answers a fork at once, unless it is still starting (its bootstrap's imports, on a pod that is
# itself starting): past this it is given up, and the runs start as before.
FORK_ANSWER_SECONDS = 20.0
MAX_SERVER_MESSAGE_BYTES = 128


class ForkServer:
    """The runner's side of forkserver.py: the server process and its channel. `fork()` hands out the next run's
    program (its Popen-like ForkedProgram, and its channel); `stop()` ends the server. Any failure stops it for good:
    the runs are then prestarted by exec, as before."""

    def __init__(self, proc: subprocess.Popen, control: socket.socket):
        self.proc, self.control = proc, control
        self.pids = frozenset({proc.pid})  # what a run's end must not kill
        self.stopped = False

    @classmethod
    def start(cls, settings: dict, work_dir: str, input_dir: str, base_env: dict,
              is_pid1: bool, inputs_dir: str | None = None) -> "ForkServer | None":
        """The server, for Python's prestarted programs (None for any other runtime, or if it cannot start)."""
        if not can_keep_state(settings) or user_site_exists(base_env["HOME"]):
            return None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # At the number a prestarted program's channel has: each fork's channel takes it over.
        control_fd = fcntl.fcntl(theirs.fileno(), fcntl.F_DUPFD, channel_fd_floor())
        theirs.close()
        server_settings = {"workDir": work_dir, "inputDir": input_dir, "inputsDir": inputs_dir,
                           "diskBytes": settings["diskBytes"], "maxProcesses": settings["maxProcesses"],
                           "pid1": is_pid1}
        env = dict(base_env, **{FD_VARIABLE: str(control_fd), SETTINGS_VARIABLE: json.dumps(server_settings),
                                MODULES_VARIABLE: ",".join(preloads_for(settings["memoryBytes"]))})
        try:
            # At the runner's priority: every run's end waits for its report (its forks lower their own). Its
            # stderr is the runner's: nothing of a run's, and what the server would say if it broke.
            proc = subprocess.Popen(python_command(settings, serve_forks=True), cwd="/", env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=None,
                                    start_new_session=True, close_fds=True, pass_fds=(control_fd,))
        except OSError:
            ours.close()
            return None
        finally:
            os.close(control_fd)
        return cls(proc, ours)

    def fork(self) -> tuple["ForkedProgram", socket.socket] | None:
        """The next program (and the runner's end of its channel), or None: the server is stopped then."""
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError:
            self.stop()
            return None
        pipes = []
        answer = b""
        try:
            pipes = [*os.pipe(), *os.pipe()]  # stdout's read and write ends, stderr's
            self.control.settimeout(FORK_ANSWER_SECONDS)
            socket.send_fds(self.control, [b"fork"], [theirs.fileno(), pipes[1], pipes[3]])
            answer = self.control.recv(MAX_SERVER_MESSAGE_BYTES)
        except OSError:
            pass
        finally:
            theirs.close()
            for fd in pipes[1::2]:
                os.close(fd)
        word, _, number = answer.partition(b" ")
        if word != b"pid" or not number.isdigit():
            ours.close()
            for fd in pipes[0::2]:
                os.close(fd)
            self.stop()
            return None
        return ForkedProgram(int(number), self, open(pipes[0], "rb"), open(pipes[2], "rb")), ours

    def exit_report(self, pid: int) -> tuple[int, float, int] | None:
        """(wait status, CPU seconds, max RSS KiB) of the fork `pid` once it ended; None if the server is gone."""
        while True:
            try:
                self.control.settimeout(None)
                report = self.control.recv(MAX_SERVER_MESSAGE_BYTES)
            except OSError:  # a channel closed (the server stopped) or broken
                return None
            fields = report.split()
            if not report:
                return None
            if len(fields) == 5 and fields[0] == b"exit" and fields[1] == b"%d" % pid:
                try:
                    return int(fields[2]), float(fields[3]), int(fields[4])
                except ValueError:
                    return None

    def serves(self) -> bool:
        return not self.stopped and self.proc.poll() is None

    def stop(self) -> None:
        """End it, once (the forks it made go on: they are their runs')."""
        if not self.stopped:
            self.stopped = True
            self.control.close()
            kill_process_group(self.proc.pid)
            self.proc.wait()


class ForkedProgram:
    """A program the fork server forked, as much of a Popen as a run needs: its pid (its session's), its pipes,
    and its exit status, which the server reports (it is the server's child, not ours)."""

    def __init__(self, pid: int, server: ForkServer, stdout, stderr):
        self.pid, self.server, self.stdout, self.stderr = pid, server, stdout, stderr
        self.returncode: int | None = None
        self.cpu_seconds, self.max_rss_bytes = 0.0, 0
        self._lock = threading.Lock()  # the run loop's waiter thread and the loop itself both wait

    def wait(self) -> int:
        with self._lock:
            if self.returncode is None:
                report = self.server.exit_report(self.pid)
                if report is None:  # the server is gone: its fork is ours now (PID 1 adopts orphans)
                    self.returncode = wait_for_orphan(self.pid)
                else:
                    status, cpu_seconds, max_rss_kib = report
                    self.cpu_seconds, self.max_rss_bytes = max(cpu_seconds, 0.0), max_rss_kib * 1024
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode


ADOPTION_SECONDS = 2.0


def wait_for_orphan(pid: int) -> int:
    """The exit of a process whose parent died: as PID 1 the runner adopts it (the kernel reparents it just after
    the parent's fds close, which is how we learnt of its death). Killed, if it never becomes ours."""
    give_up = time.monotonic() + ADOPTION_SECONDS
    while True:
        try:
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        except ChildProcessError:
            if time.monotonic() >= give_up:
                return -signal.SIGKILL
            time.sleep(0.01)


def drain_pipe(stream, capture: StreamCapture | None, most: int) -> None:
    """What a pipe holds now, up to `most` bytes (into capture, or dropped)."""
    taken = 0
    while taken < most:
        try:
            chunk = os.read(stream.fileno(), READ_CHUNK)
        except (BlockingIOError, ValueError, OSError):
            return
        if not chunk:
            return
        taken += len(chunk)
        if capture is not None:
            capture.feed(chunk)


def send_word(channel: socket.socket, env: dict, stdin_path: str | None, code_file: str) -> None:
    """The run's word to a prestarted program: its environment and code file, and its stdin as an fd."""
    word = (json.dumps({"env": env, "codeFile": code_file}) + "\n").encode()
    if stdin_path is not None:
        with open(stdin_path, "rb") as stdin:
            socket.send_fds(channel, [word], [stdin.fileno()])
    else:
        channel.sendall(word)


def end_program(proc, channel: socket.socket, spared: frozenset[int] = frozenset()) -> None:
    """End a prestarted program and everything of its namespace (as PID 1: what the preexec made for it), but
    `spared` (the fork server)."""
    channel.close()
    kill_process_group(proc.pid)
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    if os.getpid() == 1:
        kill_all_other_processes(spared=spared)

