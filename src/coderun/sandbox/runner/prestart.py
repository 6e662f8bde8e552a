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
import socket
import subprocess
import time

from .capture import READ_CHUNK, StreamCapture
from .inputs import InvalidInput, parse_run_spec
from .limits import Guards
from .processes import kill_all_other_processes, kill_process_group
from .prestarted import FD_VARIABLE, KEEP_VARIABLE, MODULES_VARIABLE
from .protocol import NODE_PRESTART_FILE, PRESTART_MODULE, can_keep_state, can_prestart

# What the runner's package root is: /opt/coderun in the images (the program imports prestarted from there).
RUNNER_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
# `-c` puts the work dir first on sys.path, where an earlier run of a session may have left a json.py: it goes
# before anything is imported (prestarted.main puts it back for the program).
BOOTSTRAP = ("import sys; sys.path[0:1] = [{root!r}]; "
             f"from {PRESTART_MODULE} import main; main({{root!r}})")
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
        command, cwd = [settings["command"][0], "-u", "-c", BOOTSTRAP.format(root=RUNNER_ROOT)], work_dir
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


def channel_fd_floor() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return CHANNEL_FD if soft == resource.RLIM_INFINITY else min(CHANNEL_FD, soft - 1)


class Prestarted:
    """One program process, started and waiting: `take(env, stdin_path)` hands it the run (the Popen and the CPU it
    spent before the run), `discard()` ends it."""

    def __init__(self, settings: dict, proc: subprocess.Popen, channel: socket.socket):
        self.settings, self.proc, self.channel = settings, proc, channel
        self.ended = False  # taken by its run (which reaps it) or discarded: nothing left to end

    @classmethod
    def start(cls, settings: dict, work_dir: str, base_env: dict, guards: Guards) -> "Prestarted | None":
        started = start_program(settings, work_dir, base_env, guards)
        return cls(settings, *started) if started is not None else None

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
            end_program(self.proc, self.channel)


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


def end_program(proc: subprocess.Popen, channel: socket.socket) -> None:
    """End a prestarted program and everything of its namespace (as PID 1: what the preexec made for it)."""
    channel.close()
    kill_process_group(proc.pid)
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    if os.getpid() == 1:
        kill_all_other_processes()

