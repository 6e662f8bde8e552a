"""keepState: one interpreter for all of a session's runs, so variables persist (prestarted.serve_runs is its side).

It is started as a prestarted program is (prestart.start_program: the program's confinement, the preloads), once
per session, and told each run by a word on its channel; it answers `done <status>` when the run's code has ended
(its exit status as a cold process's would be). Between runs it stays; what a run started besides (processes) is
killed when the run ends, as every run's is. At the run's deadline, or when it breaks a limit, the interpreter is
interrupted (SIGINT: KeyboardInterrupt in the program) and kills its leftovers; if it does not answer within
INTERRUPT_GRACE_SECONDS, or it dies (os._exit, a crash), the interpreter is lost: the run's frame says why
(`interpreterLost`) and the session ends, its variables with it.

The runner trusts nothing the interpreter says after the first run started: the status is that run's own report
(what the caller's own code made it), the CPU and memory are read from /proc, every read is bounded, every wait
has a deadline.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import time

from .capture import READ_CHUNK, StreamCapture
from .child import ChildOutcome
from .limits import Guards
from .prestart import FINAL_DRAIN_BYTES, drain_pipe, end_program, send_word
from .processes import cpu_seconds_of, kill_all_other_processes, kill_process_group, proc_stats
from .protocol import OUTPUT_LIMIT_EXCEEDED, TIMEOUT

INTERRUPT_GRACE_SECONDS = 2.0
MAX_REPORT_BYTES = 32
LEFTOVER_KILL_SECONDS = 2.0
def child_of(parent: int) -> int | None:
    """The one child of `parent` (the chain right after its start, before any program code ran)."""
    children = [pid for pid, fields in proc_stats(os.getpid()) if int(fields[1]) == parent]
    return children[0] if len(children) == 1 else None


class KeptInterpreter:
    """The session's interpreter: `proc` (the Popen: the mirror of the program's exit, as for any program), the
    channel, and the chain of processes that must outlive each run (mirror, namespace init, the interpreter)."""

    def __init__(self, settings: dict, proc: subprocess.Popen, channel: socket.socket, chain: frozenset[int],
                 interpreter: int):
        self.settings, self.proc, self.channel, self.chain, self.interpreter = \
            settings, proc, channel, chain, interpreter
        for stream in (proc.stdout, proc.stderr):
            os.set_blocking(stream.fileno(), False)

    @classmethod
    def adopt(cls, settings: dict, proc: subprocess.Popen, channel: socket.socket) -> "KeptInterpreter":
        """Record the chain now, before any program code ran: as PID 1 the interpreter is the init's child, the
        init the mirror's; without namespaces (the runner's tests) the mirror is the interpreter."""
        init = child_of(proc.pid)
        interpreter = child_of(init) if init is not None else None
        if interpreter is None:
            init, interpreter = None, proc.pid
        return cls(settings, proc, channel, frozenset(p for p in (proc.pid, init, interpreter) if p), interpreter)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, env: dict, stdin_path: str | None, code_file: str, timeout_seconds: float, output_bytes: int,
            flood_bytes: int, guards: Guards | None) -> tuple[ChildOutcome | None, str | None, dict]:
        """One run: (its outcome, or None if the run never reached the interpreter; why the interpreter is lost, or
        None; its metrics). Between runs the interpreter is stopped (SIGSTOP: every thread a run left frozen, so
        nothing of a run goes on unwatched) and what the runs started is gone."""
        stdout, stderr = StreamCapture(output_bytes), StreamCapture(output_bytes)
        if guards is not None:
            guards.session = self.proc.pid
        if not self.alive():
            return None, "the interpreter had ended before this run", {}
        self._drop_stale()
        self._signal(signal.SIGCONT)
        cpu_before = self.cpu_seconds()
        started = time.monotonic()
        lost = self._send(env, stdin_path, code_file, timeout_seconds)
        if lost is not None:
            self._end_all()
            return None, lost, {}
        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ, stdout)
        selector.register(self.proc.stderr, selectors.EVENT_READ, stderr)
        selector.register(self.channel, selectors.EVENT_READ, None)
        deadline, interrupted_at, closed = started + timeout_seconds, None, []
        runner_kill_reason, limit, status, report = None, None, None, b""
        try:
            while lost is None and status is None:
                now = time.monotonic()
                if runner_kill_reason is None:
                    broken = guards.check(now) if guards is not None and guards.due(now) else None
                    if broken is None and stdout.total + stderr.total > flood_bytes:
                        broken = (OUTPUT_LIMIT_EXCEEDED, None)
                    if broken is None and now >= deadline:
                        broken = (TIMEOUT, None)
                    if broken is not None:
                        runner_kill_reason, limit = broken
                        interrupted_at = now
                        self.kill_leftovers()
                        self._signal(signal.SIGINT)
                elif now >= interrupted_at + INTERRUPT_GRACE_SECONDS:
                    lost = (f"the interpreter did not stop within {INTERRUPT_GRACE_SECONDS:g} s of the interrupt "
                            f"sent at the run's {runner_kill_reason}")
                    break
                wait = (interrupted_at + INTERRUPT_GRACE_SECONDS if interrupted_at is not None
                        else min(deadline, guards.next_check if guards is not None else deadline)) - now
                for key, _ in selector.select(max(wait, 0)):
                    if key.data is not None:
                        # One chunk a wake-up, as a cold run's loop reads: the checks above come between.
                        if not _read_chunk(key.fileobj, key.data):
                            selector.unregister(key.fileobj)
                            closed.append("stdout" if key.fileobj is self.proc.stdout else "stderr")
                        continue
                    chunk = self.channel.recv(MAX_REPORT_BYTES)
                    if not chunk:
                        lost = "the interpreter ended (os._exit, a signal or a crash) during the run"
                        break
                    report += chunk
                    status = _status(report)
                    if status is None and (b"\n" in report or len(report) >= MAX_REPORT_BYTES):
                        lost = "the interpreter answered the run with something other than its status"
                        break
        except OSError as exc:
            lost = f"the interpreter's channel failed: {exc}"
        finally:
            selector.close()
        wall = time.monotonic() - started
        if lost is None:
            self._signal(signal.SIGSTOP)  # until the next run's word
            if not self.kill_leftovers():
                lost = "processes the run started could not all be ended"
            elif closed:
                lost = f"the run closed the interpreter's {' and '.join(closed)}: later runs could not print"
        if lost is not None:
            ended = self._end_all()
            status = ended if status is None else status  # a run that answered keeps its own exit
        # The interpreter is stopped or gone, the run's processes too: what is left in the pipes is bounded.
        for stream, capture in ((self.proc.stdout, stdout), (self.proc.stderr, stderr)):
            drain_pipe(stream, capture, FINAL_DRAIN_BYTES)
        if runner_kill_reason is None and guards is not None:
            broken = guards.check(time.monotonic(), final=True)
            if broken:
                runner_kill_reason, limit = broken
        metrics = {"wallMillis": int(round(wall * 1000)),
                   "cpuMillis": int(round(max(self.cpu_seconds(default=cpu_before) - cpu_before, 0.0) * 1000)),
                   "maxRSSBytes": self.peak_rss()}
        return ChildOutcome(status, runner_kill_reason, wall, stdout, stderr, limit), lost, metrics

    def _drop_stale(self) -> None:
        """What came before the run (a frozen thread's last write, a second `done` it sent) is not the run's."""
        for stream in (self.proc.stdout, self.proc.stderr):
            drain_pipe(stream, None, FINAL_DRAIN_BYTES)
        self.channel.setblocking(False)
        try:
            while self.channel.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _send(self, env: dict, stdin_path: str | None, code_file: str, timeout_seconds: float) -> str | None:
        self.channel.settimeout(timeout_seconds)
        try:
            send_word(self.channel, env, stdin_path, code_file)
        except OSError as exc:
            return f"the run could not be handed to the interpreter ({exc})"
        finally:
            self.channel.setblocking(False)
        return None

    def _signal(self, number: int) -> None:
        try:
            os.kill(self.interpreter, number)
        except OSError:
            pass

    def kill_leftovers(self) -> bool:
        """Every process but the chain (and us): as PID 1 all of them, else (the runner's tests) those of the
        interpreter's session. False if some outlived the tries."""
        own = os.getpid()
        if own == 1:
            return kill_all_other_processes(LEFTOVER_KILL_SECONDS, spared=self.chain)
        give_up = time.monotonic() + LEFTOVER_KILL_SECONDS
        while time.monotonic() < give_up:
            left = [pid for pid, fields in proc_stats(own) if pid not in self.chain and fields[0] not in (b"Z", b"X")
                    and int(fields[3]) == self.proc.pid]
            if not left:
                return True
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.005)
        return False

    def _end_all(self) -> int:
        """The interpreter is lost: end it and its namespace; the run ends as its process did (or killed)."""
        kill_process_group(self.proc.pid)
        try:
            status = self.proc.wait(timeout=LEFTOVER_KILL_SECONDS)
        except subprocess.TimeoutExpired:
            status = -signal.SIGKILL
        self.discard()
        return status

    def discard(self) -> None:
        end_program(self.proc, self.channel)

    def cpu_seconds(self, default: float = 0.0) -> float:
        """The interpreter's CPU, its reaped children's with it, from /proc (not from anything it says)."""
        return cpu_seconds_of([self.interpreter], default)

    def peak_rss(self) -> int:
        try:
            with open(f"/proc/{self.interpreter}/status", "rb") as handle:
                for line in handle:
                    if line.startswith(b"VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, IndexError, ValueError):
            pass
        return 0


def _read_chunk(stream, capture: StreamCapture) -> bool:
    """One read of a ready pipe into capture; False at its end (every writer closed it)."""
    try:
        chunk = os.read(stream.fileno(), READ_CHUNK)
    except BlockingIOError:
        return True
    if chunk:
        capture.feed(chunk)
    return bool(chunk)


def _status(report: bytes) -> int | None:
    """`done <int>\\n` -> the int; anything else (so far) -> None."""
    if not report.endswith(b"\n"):
        return None
    word, _, number = report[:-1].partition(b" ")
    try:
        value = int(number)
    except ValueError:
        return None
    return value if word == b"done" and -64 <= value <= 255 else None
