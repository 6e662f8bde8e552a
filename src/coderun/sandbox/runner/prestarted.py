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

import importlib
import json
import os
import resource
import signal
import socket
import sys
import warnings

from .interpreter import main_module, run_as_main

FD_VARIABLE = "CODERUN_PRESTART_FD"
MODULES_VARIABLE = "CODERUN_PRESTART_MODULES"
OWN_PACKAGE = "coderun"
MAX_WORD_BYTES = 1024 * 1024  # the run's environment: the spec's env is bounded far below this


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
    finally:
        for fd, saved in zip((1, 2), saved_fds):
            os.dup2(saved, fd)
            os.close(saved)
        os.close(null)
        os.close(unread)
        sys.path[:] = saved_path
    # A warning an import printed (to /dev/null) would otherwise count as shown: the program's own trigger shows it.
    warnings._filters_mutated()  # type: ignore[attr-defined]


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


def main(own_path: str) -> None:
    channel = socket.socket(fileno=int(os.environ.pop(FD_VARIABLE)))
    modules = [name for name in os.environ.pop(MODULES_VARIABLE, "").split(",") if name]
    preload(modules)
    word, stdin_fd = receive_word(channel)
    os.environ.clear()
    os.environ.update(word["env"])
    if stdin_fd is not None:
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    channel.sendall(b"%.6f\n" % (usage.ru_utime + usage.ru_stime))
    channel.close()
    forget_ourselves(own_path)
    code_file = word["codeFile"]
    sys.orig_argv[:] = [sys.orig_argv[0], "-u", code_file]
    end_as_cpython(run_as_main(main_module(os.path.join(os.getcwd(), code_file)), os.getcwd(), code_file))
