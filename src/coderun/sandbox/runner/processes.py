"""The sandbox's process table: list it, reap what is handed to us as PID 1, and kill everything but the runner."""

from __future__ import annotations

import os
import signal
import time


def kill_process_group(pgid: int) -> None:
    signal_process_group(pgid, signal.SIGKILL)


# How long to wait for a stop to land on our child: a SIGSTOP takes effect when its target next runs.
STOP_WAIT_SECONDS = 0.5


def stop_process_group(pgid: int) -> None:
    """Freeze the group (it is killed next, never resumed) and wait, briefly, until its leader (our child) has
    stopped or exited, so that what is counted next no longer moves."""
    signal_process_group(pgid, signal.SIGSTOP)
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    ours = True
    while time.monotonic() < deadline:
        if ours:
            try:  # WNOWAIT: the stop or exit stays for the waits that follow
                if os.waitid(os.P_PID, pgid, os.WSTOPPED | os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                    return
            except ChildProcessError:  # the fork server's child: its state is read from /proc instead
                ours = False
            except OSError:
                return
        if not ours and process_state(pgid) not in (b"R", b"S", b"D"):
            return  # stopped, a zombie, or gone
        time.sleep(0.001)


def process_state(pid: int) -> bytes | None:
    """The state letter of /proc/<pid>/stat (R, S, D, T, t, Z, X...), or None for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds_of(pids, default: float | None = 0.0) -> float | None:
    """The CPU these processes used, their reaped children's with it (utime, stime, cutime, cstime of /proc's
    stat); `default` if none could be read."""
    ticks, read = 0, False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            ticks += sum(int(field) for field in fields[11:15])
            read = True
        except (OSError, IndexError, ValueError):
            continue
    return ticks / CLOCK_TICKS if read else default


def signal_process_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
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


def kill_all_other_processes(max_seconds: float = 2.0, spared: frozenset[int] = frozenset()) -> bool:
    """Only when PID 1 of the sandbox: no escaped daemon may outlive the frame.

    kill(-1) reaches every process of the PID namespace but its init in one pass that a fork cannot slip
    through (a fork racing the signal fails); the listing loop then reaps and confirms, and is the fallback.
    With `spared` (a keepState session's interpreter, between runs) the listing loop alone, sparing those.
    False if some process outlived `max_seconds` of tries.
    """
    own_pid = os.getpid()
    give_up = time.monotonic() + max_seconds
    while time.monotonic() < give_up:
        if own_pid == 1 and not spared:  # never outside a PID namespace of ours: kill(-1) would hit the host
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:  # ESRCH: nothing left
                pass
        alive = [pid for pid in live_process_ids(own_pid) if pid not in spared]
        if not alive:
            # The dead are reaped too: a killed namespace init's usage (the program's CPU with it) counts in ours
            # only once reaped, and it may be a zombie already (a fork server's run learns its end a hop late).
            reap_zombies()
            return True
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)
        reap_zombies()
    return False


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
