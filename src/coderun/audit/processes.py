"""Whose activity is it: the runner's or the program's, by process ancestry as the Sentry reports it.

In the run's container the runner is the init (container/start names its thread group). It starts the program
through helpers that never exec (the Popen child that mirrors the exit status, the program's PID namespace
init) and a last fork that execs the language command. So: the container's init and every process it or they
fork are the runner's, up to the first successful execve; that process (from its exec on) and every process
it forks are the program's. The creator decides, not the parent: CLONE_PARENT cannot move a process to the
runner's side. A process the table never saw created (its clone point was lost) takes its parent's side if the
parent is known, else the program's: what cannot be proven to be the runner's is never hidden as the runner's.

A session's fork server (runner forkserver.py) is the one exec that stays on the runner's side: the runner's own
child exec'ing the server's bootstrap. It never runs a program; it forks each one ready-made, through the same two
helpers (the mirror, the namespace's init), so the third fork down from it is the program, from its clone on.

Thread and thread group ids are the sandbox's root PID namespace's (seccheck LoadSeccheckDataLocked), so the
program's own PID namespace does not blur them."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from coderun.sandbox.runner.protocol import FORK_SERVER_MARK, NODE_PRESTART_FILE, PRESTART_MODULE

RUNNER, PROGRAM = "runner", "program"
# A fork server's chain on the runner's side: the server, its fork (the mirror), that one's (the namespace's init),
# whose fork is the program.
FORK_SERVER, FORK_MIRROR, FORK_INIT = "server", "mirror", "init"
NEXT_FORK_STAGE = {FORK_SERVER: FORK_MIRROR, FORK_MIRROR: FORK_INIT}


def is_prestarted(argv: list[str]) -> bool:
    """An interpreter the runner started before a run came (its argv: python3 -u -c <bootstrap>, or
    node -r <the runner's preload> FILE.js). Told from the whole argv at the exec: only a cut one is kept."""
    return len(argv) == 4 and ((argv[2] == "-c" and PRESTART_MODULE in argv[3])
                               or (argv[1] == "-r" and argv[2].endswith("/" + NODE_PRESTART_FILE)))


def is_fork_server(argv: list[str]) -> bool:
    """The argv of the runner's fork server (a prestarted program's bootstrap, marked): its forks inherit it."""
    return len(argv) == 4 and argv[2] == "-c" and PRESTART_MODULE in argv[3] and FORK_SERVER_MARK in argv[3]
CLONE_THREAD = 0x00010000
# Processes a table keeps: past it, those that ended are forgotten (counted by side), so a fork flood costs counts.
MAX_PROCESSES = 1024
# What of an argv a process keeps (an exec's may be megabytes): its first items, each cut, and how many there were.
ARGV_ITEMS, ARGV_CHARS = 16, 256
# What a process costs the agent's memory besides its argv's characters, roughly: charged to its budget.
PROCESS_BYTES = 400


def cut_argv(argv) -> list[str]:
    return [arg if len(arg) <= ARGV_CHARS else arg[:ARGV_CHARS - 1] + "…" for arg in argv[:ARGV_ITEMS]]


@dataclass
class Process:
    tgid: int
    side: str
    parent: int = 0
    started_ns: int = 0
    argv: list[str] = field(default_factory=list)  # cut_argv's: its first items, each cut
    argv_count: int = 0                              # how many items the whole argv had
    prestarted: bool = False                         # is_prestarted(the whole argv), told at the exec
    exec_path: str = ""
    from_memfd: bool = False
    wait_status: int | None = None  # as wait(2) reports it
    ended_ns: int | None = None
    fork_stage: str = ""  # on the runner's side, in a fork server's chain: FORK_SERVER, FORK_MIRROR or FORK_INIT

    def exit_fields(self) -> dict:
        """{'exitCode': n} or {'signal': 'SIGKILL'}, or {} while no exit was seen."""
        if self.wait_status is None:
            return {}
        if self.wait_status & 0x7F == 0:
            return {"exitCode": (self.wait_status >> 8) & 0xFF}
        number = self.wait_status & 0x7F
        try:
            return {"signal": signal.Signals(number).name}
        except ValueError:
            return {"signal": str(number)}


class ProcessTable:
    def __init__(self, charge=None) -> None:
        """charge(bytes) -> bool: the agent's memory budget for a process and its argv (None: no budget); when it
        is spent, a new process keeps no argv (only its count) and every ended process is forgotten (counted), so
        what is held past the budget is the live processes alone."""
        self.charge = charge
        self.processes: dict[int, Process] = {}
        self.runner_root: int | None = None
        self.runner_exited = False
        self.evicted = {RUNNER: 0, PROGRAM: 0}  # ended processes forgotten past MAX_PROCESSES

    def start_container(self, tgid: int, argv: list[str], started_ns: int) -> None:
        self.runner_root = tgid
        self.processes[tgid] = self._new(Process(tgid, RUNNER, started_ns=started_ns), argv)

    def _new(self, process: Process, argv, prestarted: bool = False) -> Process:
        """The process with its argv cut and charged (kept only if the budget allows)."""
        kept = cut_argv(argv)
        if self.charge is not None and not self.charge(PROCESS_BYTES + sum(len(arg) for arg in kept)):
            kept = []
            self._forget_ended(everyone=True)
        process.argv, process.argv_count, process.prestarted = kept, len(argv), prestarted
        return process

    def side(self, tgid: int, parent: int = 0) -> str:
        return self.process(tgid, parent).side

    def process(self, tgid: int, parent: int = 0) -> Process:
        """The table's entry, made on first sight from the parent's side (see the module's docstring), as its clone
        would have made it: under a fork server's chain, the fork's stage (and the program's side past the init)."""
        known = self.processes.get(tgid)
        if known is None:
            maker = self.processes.get(parent)
            known = self.processes[tgid] = self._new(
                Process(tgid, maker.side if maker is not None else PROGRAM, parent=parent), [])
            if maker is not None:
                self._descend(maker, known)
        return known

    @staticmethod
    def _descend(maker: Process, new: Process) -> None:
        if maker.side == RUNNER and maker.fork_stage:
            new.fork_stage = NEXT_FORK_STAGE.get(maker.fork_stage, "")
            if maker.fork_stage == FORK_INIT:
                new.side = PROGRAM

    def clone(self, creator: int, creator_parent: int, child: int, flags: int, started_ns: int) -> Process | None:
        """The new process, or None for a new thread of the creator's."""
        maker = self.process(creator, creator_parent)
        if flags & CLONE_THREAD or child == creator:
            return None
        # A recycled id starts afresh: nothing of the old process carries over.
        new = self.processes[child] = self._new(Process(child, maker.side, parent=creator, started_ns=started_ns),
                                                maker.argv, maker.prestarted)
        new.argv_count = maker.argv_count
        self._descend(maker, new)
        if len(self.processes) > MAX_PROCESSES:
            self._forget_ended()
        return new

    def _forget_ended(self, everyone: bool = False) -> None:
        """Forget the older half of the ended processes, or all of them (never the runner's root): amortised, a
        flood of forks costs a scan per MAX_PROCESSES / 2 of them."""
        ended = sorted((p for p in self.processes.values() if p.wait_status is not None and p.tgid != self.runner_root),
                       key=lambda p: p.ended_ns or 0)
        for process in ended if everyone else ended[:max(len(ended) // 2, len(self.processes) - MAX_PROCESSES)]:
            del self.processes[process.tgid]
            self.evicted[process.side] += 1

    def execve(self, tgid: int, parent: int, argv: list[str], path: str, from_memfd: bool) -> Process:
        process = self.process(tgid, parent)
        path = path if len(path) <= ARGV_CHARS else path[:ARGV_CHARS - 1] + "…"
        if process.side == RUNNER and tgid != self.runner_root:
            if process.parent == self.runner_root and not process.fork_stage and is_fork_server(argv):
                self._new(process, argv, is_prestarted(argv))
                process.exec_path, process.fork_stage = path, FORK_SERVER
                return process
            process.side = PROGRAM
            process.fork_stage = ""
        self._new(process, argv, is_prestarted(argv))
        process.exec_path, process.from_memfd = path, from_memfd
        return process

    def program(self, since_ns: int = 0) -> list[Process]:
        """The program's processes alive at or started since `since_ns` (a session's earlier runs ran in the same
        container, and ended before it). One started before it is the run's prestarted interpreter (runner
        prestart.py), its start not the run's (what it did then is not recorded either). The next run's, started
        by the runner once this run's program ended, is that run's, not this one's."""
        seen = [p for p in self.processes.values()
                if p.side == PROGRAM and (p.started_ns >= since_ns or p.ended_ns is None or p.ended_ns >= since_ns)]
        roots = sorted((p for p in seen if self.is_root(p)), key=lambda p: p.started_ns)
        if not roots or roots[0].ended_ns is None:
            return seen
        first_ended = roots[0].ended_ns
        later = {p.tgid for p in roots[1:] if p.started_ns >= first_ended and p.prestarted}
        return [p for p in seen if p.tgid not in later]

    def is_root(self, process: Process) -> bool:
        """A program process the runner's side started (the program itself, not one of its children)."""
        creator = self.processes.get(process.parent)
        return creator is not None and creator.side == RUNNER

    def program_ended(self, since_ns: int = 0) -> bool:
        """The program ran and every process of its side was seen ending (a warm pod's frame comes before the
        runner's own end: by then the runner has killed what the program left)."""
        program = self.program(since_ns)
        return bool(program) and all(p.wait_status is not None for p in program)

    def exit(self, tgid: int, parent: int, wait_status: int, ended_ns: int = 0) -> None:
        process = self.process(tgid, parent)
        process.wait_status, process.ended_ns = wait_status, ended_ns
        if tgid == self.runner_root:
            self.runner_exited = True
