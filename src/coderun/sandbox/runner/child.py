"""The program's run: its environment, the loop that drains its pipes and enforces the deadline, the flood cap and
the sandbox's limits, and what it used and whether the kernel's OOM killer ended it."""

from __future__ import annotations

import collections
import os
import resource
import selectors
import signal
import subprocess
import threading
import time

from .capture import READ_CHUNK, StreamCapture
from .limits import Guards
from .processes import cpu_seconds_of, kill_all_other_processes, kill_process_group, stop_process_group
from .protocol import DISK_LIMIT_EXCEEDED, OUTPUT_LIMIT_EXCEEDED, TIMEOUT

# Once the child is gone, how long to keep reading pipes that an escaped
# process (only possible when the runner is not PID 1) may still hold open.
DRAIN_GRACE_SECONDS = 0.5
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
# Per cent of the memory limit V8's old space may take: the rest is the young generation, code and Node's own.
V8_HEAP_SHARE = 80


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


# How the child ended. runner_kill_reason is the reason the runner stopped it
# (TIMEOUT, OUTPUT_LIMIT_EXCEEDED or a sandbox limit, then with `limit`), else None. (A namedtuple, not a dataclass: the
# dataclasses import costs ~10 ms on every run.)
# cpu_at_kill: what the program's processes had used when the runner killed them (0.0 if it did not): the usage of
# a namespace whose init dies with them is not always handed on to us (its dying init auto-reaps them).
ChildOutcome = collections.namedtuple(
    "ChildOutcome", ["returncode", "runner_kill_reason", "wall_seconds", "stdout", "stderr", "limit", "cpu_at_kill"],
    defaults=(None, 0.0))


# The waiter returns as soon as the child is reaped (proc.wait above): past this it is left, and its pipe with it.
WAITER_JOIN_SECONDS = 5.0


def run_child(command: list[str], cwd: str, env: dict, stdin_path: str | None,
              timeout_seconds: float, output_bytes: int, flood_bytes: int,
              is_pid1: bool, guards: Guards | None = None, spared: frozenset[int] = frozenset()) -> ChildOutcome:
    """Start the program and run it (supervise_child)."""
    with open(stdin_path or os.devnull, "rb") as stdin:
        started = time.monotonic()
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, close_fds=True,
                                preexec_fn=guards.child_limits if guards else None)
    return supervise_child(proc, started, timeout_seconds, output_bytes, flood_bytes, is_pid1, guards, spared)


def supervise_child(proc, started: float, timeout_seconds: float, output_bytes: int,
                    flood_bytes: int, is_pid1: bool, guards: Guards | None = None,
                    spared: frozenset[int] = frozenset()) -> ChildOutcome:
    """Run the program `proc` (a Popen started at `started`, or prestarted and handed its run then, or a
    prestart.ForkedProgram), enforcing the deadline and the output flood cap. `spared`: the fork server, which
    outlives the run.

    One selector loop drains both pipes (a blocking read in a thread could not
    be abandoned when an escaped process keeps a pipe open); a waiter thread
    only reports the child's exit through a self-pipe, without reaping it, so
    the process group id stays reserved until the group has been killed.
    """
    stdout = StreamCapture(output_bytes)
    stderr = StreamCapture(output_bytes)
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

    waiter = threading.Thread(target=wait_for_exit, name="wait_for_exit", daemon=True)
    waiter.start()
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ, stdout)
    selector.register(proc.stderr, selectors.EVENT_READ, stderr)
    selector.register(wake_read, selectors.EVENT_READ, None)
    open_streams = 2
    deadline = started + timeout_seconds
    runner_kill_reason = None
    limit = None
    drain_until = None
    cpu_at_kill = 0.0

    def kill_program() -> None:
        nonlocal cpu_at_kill
        if guards is not None:
            cpu_at_kill = cpu_seconds_of(guards.program_pids())
        kill_process_group(proc.pid)  # escaped processes die with everything else at exit

    try:
        while True:
            now = time.monotonic()
            if drain_until is None and runner_kill_reason is None:
                broken = guards.check(now) if guards is not None and guards.due(now) else None
                if broken:
                    (runner_kill_reason, limit) = broken
                    kill_program()
                elif stdout.total + stderr.total > flood_bytes:
                    runner_kill_reason = OUTPUT_LIMIT_EXCEEDED
                    kill_program()
                elif not exited_at and now >= deadline:
                    # A limit met by then is what stopped the program (e.g. a fork bomb that starved us of CPU).
                    # The program is frozen first: a file flood running on beside the last count would stretch
                    # it, and the run, far past the deadline at a low CPU limit (a 120 s run ended at 192 s).
                    stop_process_group(proc.pid)
                    broken = guards.check(now) if guards is not None else None
                    runner_kill_reason, limit = broken or (TIMEOUT, None)
                    kill_program()
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
                    kill_all_other_processes(spared=spared)
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
        # The waiter writes its byte after it recorded the exit this loop may already have acted on: its fd is
        # closed only once it is done, or its number, reused by the next run's file, would take that byte.
        waiter.join(WAITER_JOIN_SECONDS)
        if not waiter.is_alive():
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
    return ChildOutcome(returncode, runner_kill_reason, exited_at[0] - started, stdout, stderr, limit, cpu_at_kill)


def child_metrics(wall_seconds: float, before=None, prestart_cpu_seconds: float = 0.0,
                  elsewhere: tuple[float, int] = (0.0, 0), cpu_at_kill: float = 0.0) -> dict:
    """What the program used; `before` (the children's usage when it started) takes out a session's earlier runs'
    CPU, `prestart_cpu_seconds` what a prestarted process spent before its run (its start and preloads),
    `elsewhere` is the (CPU, max RSS) of a fork the fork server reaped, `cpu_at_kill` what its processes had used
    when the runner killed them, if it did. maxRSSBytes is the largest of any child so far: in a session, of this
    run or an earlier one."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = usage.ru_utime + usage.ru_stime + elsewhere[0]
    if before is not None:
        cpu_seconds -= before.ru_utime + before.ru_stime
    cpu_seconds = max(max(cpu_seconds, cpu_at_kill) - prestart_cpu_seconds, 0.0)
    return {
        "wallMillis": int(round(wall_seconds * 1000)),
        "cpuMillis": int(round(cpu_seconds * 1000)),
        "maxRSSBytes": max(int(usage.ru_maxrss) * 1024, elsewhere[1]),  # ru_maxrss is KiB on Linux
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
