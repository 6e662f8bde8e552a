"""The program's own process, started before its code arrives (prestart.py, the runner's side): the interpreter a
cold `python3 -u main.py` would be, started under the same confinement (its namespaces, rlimits and syscall filter
are in place before this file runs), with the image's common modules imported, waiting for the runner's word.

The word is the run's environment and, when the run has stdin, its file as an fd; the answer is the CPU time spent
so far (the run's metrics count only the program's own). Then nothing of this stays for the program to see: the
channel is closed, this package leaves sys.modules and sys.path, sys.argv and sys.orig_argv are a cold run's, and
the code runs as `__main__` (interpreter.run_as_main: tracebacks, `__file__`, exit codes and signals as cold).

Stdlib only before the preloads; started by the runner as `python3 -u -c BOOTSTRAP` with the channel's fd and the
modules to preload in CODERUN_PRESTART_FD and CODERUN_PRESTART_MODULES (both gone before the program starts).
"""

from __future__ import annotations

import gc
import importlib
import io
import json
import os
import resource
import select
import signal
import socket
import sys
import warnings

from .interpreter import main_module, run_as_main

FD_VARIABLE = "CODERUN_PRESTART_FD"
MODULES_VARIABLE = "CODERUN_PRESTART_MODULES"
KEEP_VARIABLE = "CODERUN_PRESTART_KEEP"  # set: serve every run of a keepState session (serve_runs)
OWN_PACKAGE = "coderun"
MAX_WORD_BYTES = 1024 * 1024  # the run's environment: the spec's env is bounded far below this
# The preloads wait this long for a run first: a run that comes at once (a session's next step, a harness's next
# program) finds the bare interpreter ready rather than wait for numpy's import; a pod left waiting longer (a pool
# pod, a session between an agent's steps) has them imported by the time its run comes.
PRELOAD_AFTER_IDLE_SECONDS = 1.0


# After its import, a module's first use still loads more (pandas's CSV parser, groupby and JSON writer: ~0.5 s
# under gVisor on a first read_csv): a small use of it, in memory, in a namespace thrown away, loads them too.
WARM_UPS = {
    "pandas": "import io\nimport pandas as pd\nframe = pd.read_csv(io.StringIO('k,a,b\\nx,1,2\\ny,3,4\\n'))\n"
              "frame['c'] = frame.a / frame.b\nframe.groupby('k').c.mean().round(4).to_json()\n"
              "f'{frame.c.mean():.2%}'\nframe.describe().to_string()\n",
}


def preload(modules: list[str]) -> None:
    """Import what the program would likely import, from the image's own paths only (not the work dir, where an
    earlier run of a session may have left a numpy.py: the program's own imports find it as a cold run's would),
    with stdout and stderr on a pipe nobody reads: nothing printed here may reach the run's output. (A pipe, not
    /dev/null: opening a file for writing would show in the audit of a run that came while this was still going.)
    A module that fails to import (or prints more than the pipe holds) is left for the program to import itself."""
    saved_path = list(sys.path)
    sys.path[:] = [entry for entry in sys.path if entry not in ("", ".")]
    unread, null = os.pipe()
    os.set_blocking(null, False)
    saved_fds = [os.dup(1), os.dup(2)]
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - absent from this image, or broken: the program meets it as cold
                sys.modules.pop(name, None)
                continue
            try:
                exec(compile(WARM_UPS.get(name, ""), "<coderun-warm-up>", "exec"), {})
            except Exception:  # noqa: BLE001 - a warm-up is an optimisation only
                pass
    finally:
        for fd, saved in zip((1, 2), saved_fds):
            os.dup2(saved, fd)
            os.close(saved)
        os.close(null)
        os.close(unread)
        sys.path[:] = saved_path
    # A warning an import printed (to /dev/null) would otherwise count as shown: the program's own trigger shows it.
    warnings._filters_mutated()  # type: ignore[attr-defined]
    # What the preloads made lives as long as the process: out of the collector's sight, no collection walks it
    # again, neither the program's nor the interpreter's own at exit (under gVisor a print(1) beside numpy spent
    # ~40 ms in those at its exit; frozen, as little as without numpy). The warm-ups' garbage goes first.
    gc.collect()
    gc.freeze()


def receive_word(channel: socket.socket) -> tuple[dict, int | None]:
    """The runner's word: a JSON {"env": {...}} and at most one fd (the run's stdin). SystemExit when the channel
    ends first: the runner gave this process up."""
    received, fds = b"", []
    while not received.endswith(b"\n"):
        data, new_fds, _flags, _address = socket.recv_fds(channel, 65536, 1)
        fds.extend(new_fds)
        if not data or len(received) + len(data) > MAX_WORD_BYTES:
            raise SystemExit(0)
        received += data
    word = json.loads(received)
    return word, (fds[0] if fds else None)


def shadowed(work_dir: str) -> list[str]:
    """Modules already imported that a file of the run would stand for in a cold start (a json.py or a numpy/ dir in
    the work dir, which a cold `python3 main.py` finds first): such a run must start cold to see its own."""
    names = set()
    try:
        entries = os.listdir(work_dir)
    except OSError:
        return []
    for entry in entries:
        name = entry.split(".", 1)[0]
        if entry.endswith((".py", ".pyc", ".so", ".pyd")) or os.path.isdir(os.path.join(work_dir, entry)):
            names.add(name)
    return sorted(name for name in names if name in sys.modules)


def forget_ourselves(own_path: str) -> None:
    """What the bootstrap added is not the program's: this package in sys.modules, its path in sys.path."""
    for name in [name for name in sys.modules if name == OWN_PACKAGE or name.startswith(OWN_PACKAGE + ".")]:
        del sys.modules[name]
    if own_path in sys.path:
        sys.path.remove(own_path)


def end_as_cpython(status: int) -> None:
    """End the process as `python3 main.py` would have: an exit status, or the signal (-status) of an uncaught
    KeyboardInterrupt, after the interpreter's own finalisation."""
    if status < 0:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: CPython would not print either
                pass
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


def take_run(word: dict, stdin_fd: int | None) -> None:
    """The run's environment (os.environ and the C environment under it) and stdin (the file, or /dev/null)."""
    os.environ.clear()
    os.environ.update(word["env"])
    if stdin_fd is not None:
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)


def serve_runs(channel: socket.socket, own_path: str) -> None:
    """keepState: every run of the session in one `__main__`, each answered `done <status>` once its code ended,
    its output flushed first (the runner takes what is in the pipes then as the run's). SIGINT (the runner's
    interrupt at a deadline) is the program's KeyboardInterrupt during a run and ignored between runs."""
    forget_ourselves(own_path)
    sys.path.insert(0, os.getcwd())  # what `-c` put there, taken out while we imported (run_as_main replaces it)
    module, encoding, errors = None, sys.stdin.encoding, sys.stdin.errors
    while True:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        word, stdin_fd = receive_word(channel)
        take_run(word, stdin_fd if stdin_fd is not None else os.open(os.devnull, os.O_RDONLY))
        # What the last run read of its stdin is not this one's: a fresh reader, as a cold start's.
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                     encoding=encoding, errors=errors)
        if module is None:
            module = main_module(os.path.join(os.getcwd(), word["codeFile"]))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            status = run_as_main(module, os.getcwd(), word["codeFile"])
        except KeyboardInterrupt:  # the interrupt landed outside the program's own code
            status = -signal.SIGINT
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a stream the program closed or replaced
                pass
        channel.sendall(b"done %d\n" % status)


def main(own_path: str, serve_forks: bool = False) -> None:
    """The prestarted program, or with `serve_forks` the fork server, whose forks go on from here as the program."""
    importlib.import_module("array")  # socket.recv_fds imports it at its first call: from the image, not the work dir
    channel = socket.socket(fileno=int(os.environ.pop(FD_VARIABLE)))
    if serve_forks:
        imported = set(sys.modules)
        from .forkserver import serve
        channel = serve(channel)
        # What the server imported to fork and confine (ctypes...) is not a prestarted program's: it goes.
        for name in set(sys.modules) - imported:
            del sys.modules[name]
    modules = [name for name in os.environ.pop(MODULES_VARIABLE, "").split(",") if name]
    keep = os.environ.pop(KEEP_VARIABLE, "") == "1"
    if modules and not select.select([channel], [], [], PRELOAD_AFTER_IDLE_SECONDS)[0]:
        preload(modules)
    if keep:
        serve_runs(channel, own_path)
        return
    word, stdin_fd = receive_word(channel)
    forget_ourselves(own_path)
    if shadowed(os.getcwd()):
        channel.sendall(b"cold\n")
        raise SystemExit(0)
    take_run(word, stdin_fd)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    channel.sendall(b"%.6f\n" % (usage.ru_utime + usage.ru_stime))
    channel.close()
    sys.path.insert(0, os.getcwd())  # what `-c` put there, taken out while we imported (run_as_main replaces it)
    code_file = word["codeFile"]
    sys.orig_argv[:] = [sys.orig_argv[0], "-u", code_file]
    end_as_cpython(run_as_main(main_module(os.path.join(os.getcwd(), code_file)), os.getcwd(), code_file))
