"""The fork server of a session whose runs each start from a fresh process (keepState false, Python): the server's
side (prestart.ForkServer is the runner's).

It is an interpreter started as a prestarted program is (prestart.py: `python3 -u -c BOOTSTRAP`, the same
environment), but left outside the program's confinement, and it never runs a program: for each run it forks the
run's process ready-made, so a run pays its forks (the mirror, the init, the program) but not an exec, an
interpreter's start and the bootstrap's imports (~60 ms of CPU a run under gVisor), and starts from the server's
pages, which no run has written.

The fork takes the confinement a cold start's preexec gives (Guards.child_limits): a session of its own, a user,
PID and mount namespace of its own under an init of ours (the user namespace because the server, an exec'd
process, has no capability to make the others; the program is then left none, as an exec leaves it), its rlimits,
its niceness and the syscall filter. In that namespace the server does not exist: no signal, ptrace or /proc of
the program reaches it. Its fds are a cold start's: the run's pipes on 1 and 2, /dev/null on 0, the channel at its
number; the fork then goes on as prestarted.main would in a process started for the run.

The runner and the server speak on a SOCK_SEQPACKET pair, one message each: `fork` with three fds (the program's
channel, its stdout, its stderr), answered `pid <pid>` (or `refused`); then, once that process ended, `exit <pid>
<wait status> <cpu seconds> <max rss KiB>` (its CPU, which the runner cannot reap itself). One fork at a time.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket

from .confinement import MAX_CLOSE_FD
from .limits import Guards
from .seccomp import syscall_filter

# {"workDir", "inputDir", "inputsDir", "diskBytes", "maxProcesses", "pid1"}
SETTINGS_VARIABLE = "CODERUN_FORK_SERVER"
MAX_REQUEST_BYTES = 64
FAILED_FORK_STATUS = 127  # a fork that could not be confined: it never answers its run (prestart.Prestarted.take)


def serve(control: socket.socket) -> socket.socket:
    """Fork a program for each request until the runner closes the channel (the server then exits). Returns only in
    a forked program, confined, with its channel; the server itself never returns."""
    settings = json.loads(os.environ.pop(SETTINGS_VARIABLE))
    guards = Guards(os.path.dirname(settings["workDir"]), settings["diskBytes"], 0, settings["maxProcesses"], None,
                    settings["pid1"], settings["inputDir"], inputs_dir=settings.get("inputsDir"))
    guards.forked = True
    # What every fork would import or compute as it confines itself, once here rather than in each run's CPU.
    importlib.import_module("ctypes")  # confinement's and seccomp's, imported where they are used
    syscall_filter(os.uname().machine)
    wake_read, wake_write = os.pipe()
    for fd in (wake_read, wake_write):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda _number, _frame: None)
    child = None
    while True:
        ready = select.select([control, wake_read], [], [])[0]
        if wake_read in ready:
            drain(wake_read)
            child = report_exit(control, child)
        if control not in ready:
            continue
        message, fds, _flags, _address = socket.recv_fds(control, MAX_REQUEST_BYTES, 3)
        if not message:
            os._exit(0)  # the runner gave the server up (or ended)
        if message != b"fork" or len(fds) != 3 or child is not None:
            for fd in fds:
                os.close(fd)
            control.send(b"refused")
            continue
        child = os.fork()
        if child == 0:
            return become_program(control, (wake_read, wake_write), fds, settings["workDir"], guards)
        for fd in fds:
            os.close(fd)
        control.send(b"pid %d" % child)


def drain(fd: int) -> None:
    try:
        while os.read(fd, 64):
            pass
    except BlockingIOError:
        pass


def report_exit(control: socket.socket, child: int | None) -> int | None:
    """Reap what ended; tell the runner how the current fork ended (None then: the next may come)."""
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return child
        if pid == 0:
            return child
        if pid == child:
            control.send(b"exit %d %d %.6f %d" % (pid, status, usage.ru_utime + usage.ru_stime, usage.ru_maxrss))
            child = None


def become_program(control: socket.socket, wake: tuple[int, int], fds: list[int], work_dir: str,
                   guards: Guards) -> socket.socket:
    """In the fork: what a cold start's Popen and preexec make of it (its session, fds, working dir and
    confinement), then its channel. A fork that cannot take them (its namespaces, or its capabilities dropped)
    ends, as a cold start whose preexec failed would not run either."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        channel_fd = control.fileno()  # the number a prestarted program's channel has
        control.close()
        for fd in wake:
            os.close(fd)
        channel, stdout, stderr = fds
        os.setsid()
        os.chdir(work_dir)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        os.dup2(channel, channel_fd)
        os.closerange(3, channel_fd)
        os.closerange(channel_fd + 1, MAX_CLOSE_FD)
        guards.child_limits()  # returns in the program (its namespace's init and the mirror never return)
    except BaseException:  # noqa: BLE001 - nothing of a half-made fork may run
        os._exit(FAILED_FORK_STATUS)
    return socket.socket(fileno=channel_fd)
