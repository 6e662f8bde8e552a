"""One run's `status.audit`, from the decoded points of its container: pure and bounded, however many points come.

Feed every point of the run's sandbox connection to `RunAudit.add` in the order they arrived, then call
`summary()`. Points of other containers (the pod's pause container) are skipped; the process table is kept from
the container's start, but activity before `since_ns` (a warm pod's claim, on the sandbox's clock) is not the
run's and is skipped."""

from __future__ import annotations

import errno
from dataclasses import dataclass, field

from . import paths, sockaddr
from .points import container_pb2, sentry_pb2, syscall_pb2
from .processes import PROGRAM, RUNNER, ProcessTable, is_prestarted
from .wire import Point

SOURCE = "gvisor-trace"
O_ACCMODE, O_WRONLY, O_RDWR, O_CREAT, O_TRUNC = 0o3, 0o1, 0o2, 0o100, 0o1000
DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
CONNECT_RESULTS = {0: "connected", errno.EINPROGRESS: "inProgress", errno.ECONNREFUSED: "refused",
                   errno.ETIMEDOUT: "timedOut", errno.ENETUNREACH: "unreachable", errno.EHOSTUNREACH: "unreachable",
                   errno.EACCES: "denied", errno.EPERM: "denied"}
# Raw points (syscall/sysno/N/exit) for what has no schema: addressed sends, and openat2, whose path gVisor does
# not record (only that it happened and what it returned).
SENDTO, SENDMSG, SENDMMSG, OPENAT2 = 44, 46, 307, 437
WRAP = 2 ** 32


@dataclass(frozen=True)
class Bounds:
    files: int = 50            # filesRead, filesWritten entries
    examples: int = 10         # outsideWorkdir.examples
    connects: int = 50         # connectAttempts entries
    processes: int = 50        # processes entries
    sockets: int = 20          # socketsOpened entries
    tracked: int = 1000        # distinct keys remembered per list: past it, only counted
    argv_items: int = 16
    argv_chars: int = 256


@dataclass
class _Entry:
    count: int = 0
    failed: int = 0
    denied: int = 0
    bytes: int = 0


@dataclass
class _Keyed:
    """A bounded map from key to entry: keys past `tracked` are only counted in `untracked`."""
    tracked: int
    entries: dict = field(default_factory=dict)
    untracked: int = 0

    def get(self, key) -> _Entry | None:
        entry = self.entries.get(key)
        if entry is None:
            if len(self.entries) >= self.tracked:
                self.untracked += 1
                return None
            entry = self.entries[key] = _Entry()
        return entry


def _errno(message) -> int:
    """The errno a syscall exit point carries (0: it succeeded, or the point is an enter point)."""
    return int(message.exit.errorno)


class RunAudit:
    def __init__(self, container_id: str, workdir: str = "/tmp/work", own_dirs: tuple[str, ...] = ("/tmp",),
                 since_ns: int = 0, bounds: Bounds = Bounds()):
        self.container_id, self.workdir, self.own_dirs = container_id, workdir, own_dirs
        self.since_ns, self.bounds = since_ns, bounds
        self.table = ProcessTable()
        self.started = False
        self.read = _Keyed(bounds.tracked)
        self.written = _Keyed(bounds.tracked)
        self.connects = _Keyed(bounds.tracked)
        self.sockets = _Keyed(bounds.tracked)
        self.outside = {"reads": 0, "writes": 0, "denied": 0}
        self.examples: list[str] = []
        self.examples_seen: set[str] = set()
        self.runner = {"filesRead": 0, "filesWritten": 0}
        self.counts = {"syscallsDenied": 0, "openat2": 0, "addressedSends": 0, "pointsLost": 0,
                       "pointsUnknown": 0}
        self.failed_execs = 0
        self._exec_calls: dict[int, bool] = {}  # threads whose last execve call is not yet known to have run
        self._dropped: int | None = None  # the sink's last dropped_count (it wraps at 2**32)

    # --- input

    def add(self, point: Point) -> None:
        self._count_drops(point.dropped_count)
        message = point.message
        if message is None:
            self.counts["pointsUnknown"] += 1
            return
        context = message.context_data
        if context.container_id != self.container_id:
            return
        if isinstance(message, container_pb2.Start):
            self.started = True
            self.table.start_container(context.thread_group_id, list(message.args), context.time_ns)
            return
        handler = _HANDLERS.get(type(message))
        if handler is not None:
            handler(self, message, context)

    def add_lost(self, count: int) -> None:
        """Points the agent itself could not keep (its own buffer was full)."""
        self.counts["pointsLost"] += count

    def _count_drops(self, dropped: int) -> None:
        if self._dropped is not None:
            self.counts["pointsLost"] += (dropped - self._dropped) % WRAP
        elif dropped:
            self.counts["pointsLost"] += dropped
        self._dropped = dropped

    def _side(self, context) -> str:
        return self.table.side(context.thread_group_id, context.parent_thread_group_id)

    def _in_run(self, context) -> bool:
        return context.time_ns >= self.since_ns

    # --- processes (the table always follows; the record only after since_ns)

    def _clone(self, message: sentry_pb2.CloneInfo, context) -> None:
        self.table.clone(context.thread_group_id, context.parent_thread_group_id, message.created_thread_group_id,
                         message.flags, context.time_ns)

    def _exec(self, message: sentry_pb2.ExecveInfo, context) -> None:
        self._exec_calls.pop(context.thread_id, None)  # the call this thread made succeeded
        self.table.execve(context.thread_group_id, context.parent_thread_group_id, list(message.argv),
                          message.binary_path, message.binary_in_memfd)

    def _exit_notify(self, message: sentry_pb2.ExitNotifyParentInfo, context) -> None:
        self.table.exit(context.thread_group_id, context.parent_thread_group_id, message.exit_status, context.time_ns)

    def _task_exit(self, message: sentry_pb2.TaskExit, context) -> None:
        # Every thread's end; only the leader's says the process ended (exit_notify_parent, if it comes, agrees).
        if self._exec_calls.pop(context.thread_id, False):
            self.failed_execs += 1  # its last execve call never became an exec
        if context.thread_id == context.thread_group_id:
            self.table.exit(context.thread_group_id, context.parent_thread_group_id, message.exit_status,
                            context.time_ns)

    def _failed_exec(self, message: syscall_pb2.Execve, context) -> None:
        if not self._in_run(context) or self._side(context) != PROGRAM:
            return
        number = _errno(message)
        if number:
            self.failed_execs += 1
            self._note_denied(number)
            return
        # gVisor's execve exit point carries no errno (seen on the cluster: `{}` for a missing binary as for the
        # one that ran): a call that the exec itself (sentry/execve) does not follow on the same thread, before
        # the thread's next call or its end, failed. Python's and the shells' PATH searches make one per
        # directory.
        if self._exec_calls.pop(context.thread_id, False):
            self.failed_execs += 1
        self._exec_calls[context.thread_id] = True

    # --- files

    def _note_denied(self, number: int) -> bool:
        if number in DENIED_ERRNOS:
            self.counts["syscallsDenied"] += 1
            return True
        return False

    def _open(self, message: syscall_pb2.Open, context) -> None:
        if not self._in_run(context):
            return
        path = paths.resolve(message.pathname, message.fd_path, message.fd, context.cwd)
        flags = message.flags
        writes = flags & O_ACCMODE in (O_WRONLY, O_RDWR) or flags & (O_CREAT | O_TRUNC)
        number = _errno(message)
        if self._side(context) == RUNNER:
            if not number:
                self.runner["filesWritten" if writes else "filesRead"] += 1
            return
        denied = self._note_denied(number)
        if path == self.workdir and not writes and not number:
            return  # the interpreter listing its script's directory for imports: every run does it
        if any(paths.is_under(path, own) for own in self.own_dirs):
            entry = (self.written if writes else self.read).get(path)
            if entry is not None:
                entry.count += not number
                entry.failed += bool(number) and not denied
                entry.denied += denied
            return
        self.outside["writes" if writes else "reads"] += 1
        self.outside["denied"] += denied
        if (denied or not paths.is_routine(path)) and path not in self.examples_seen:
            if len(self.examples_seen) < self.bounds.tracked:
                self.examples_seen.add(path)
                self.examples.append(path)

    def _write(self, message: syscall_pb2.Write, context) -> None:
        """Bytes written, when the session traces writes (session.py `write_bytes`)."""
        number = _errno(message)
        if number or not self._in_run(context) or self._side(context) == RUNNER:
            return
        if message.fd_path.startswith("/") and any(paths.is_under(message.fd_path, d) for d in self.own_dirs):
            entry = self.written.get(message.fd_path)
            if entry is not None:
                entry.bytes += max(message.exit.result, 0)

    # --- network

    def _socket(self, message: syscall_pb2.Socket, context) -> None:
        if not self._in_run(context) or self._side(context) == RUNNER:
            return
        number = _errno(message)
        self._note_denied(number)
        key = (sockaddr.family_name(message.domain), sockaddr.protocol_name(message.domain, message.type),
               CONNECT_RESULTS.get(number, errno.errorcode.get(number, str(number))) if number else "created")
        entry = self.sockets.get(key)
        if entry is not None:
            entry.count += 1

    def _connect(self, message: syscall_pb2.Connect, context) -> None:
        if not self._in_run(context) or self._side(context) == RUNNER:
            return
        number = _errno(message)
        self._note_denied(number)
        address = sockaddr.parse(message.address)
        result = CONNECT_RESULTS.get(number, errno.errorcode.get(number, str(number)))
        entry = self.connects.get((address.family, address.address, address.port, result))
        if entry is not None:
            entry.count += 1

    def _raw(self, message: syscall_pb2.Syscall, context) -> None:
        if not self._in_run(context) or self._side(context) == RUNNER:
            return
        self._note_denied(_errno(message))
        if message.sysno == OPENAT2:
            self.counts["openat2"] += 1
        elif message.sysno in (SENDMSG, SENDMMSG) or (message.sysno == SENDTO and message.arg5):
            self.counts["addressedSends"] += 1

    # --- output

    def summary(self) -> dict:
        if not self.started:
            return {"source": SOURCE, "complete": False,
                    "message": "no trace of this container reached the audit agent"}
        bounds = self.bounds
        program = self.table.program(self.since_ns)
        omitted = {}

        def bounded(name: str, items: list, limit: int, untracked: int = 0) -> list:
            if len(items) + untracked > limit:
                omitted[name] = len(items) + untracked - min(len(items), limit)
            return items[:limit]

        def files(keyed: _Keyed) -> list[dict]:
            # The work dir first (inputs and what the program made there), then the rest of the run's own dirs.
            ordered = sorted(keyed.entries.items(), key=lambda item: not paths.is_under(item[0], self.workdir))
            out = []
            for path, entry in ordered:
                row = {"path": paths.shown(path, self.workdir), "count": entry.count}
                row.update({k: v for k, v in (("failed", entry.failed), ("denied", entry.denied),
                                              ("bytes", entry.bytes)) if v})
                out.append(row)
            return out

        connects = [{"family": family, "address": paths.escape(address), "port": port, "result": result,
                     "count": entry.count}
                    for (family, address, port, result), entry in self.connects.entries.items()]
        sockets = [{"family": family, "protocol": protocol, "result": result, "count": entry.count}
                   for (family, protocol, result), entry in self.sockets.entries.items()]
        processes = []
        for process in program:
            row = {"argv": [paths.escape(arg, bounds.argv_chars) for arg in process.argv[:bounds.argv_items]]}
            if len(process.argv) > bounds.argv_items:
                row["argvOmitted"] = len(process.argv) - bounds.argv_items
            if process.from_memfd:
                row["fromMemfd"] = True
            if self.table.is_root(process) and is_prestarted(process):
                # The run's prestarted interpreter: its start was not the run's. Told by what it is (the runner's
                # side started it with the bootstrap), not by comparing its start with the run's: the operator's
                # clock and the Sentry's differ by more than a back-to-back session's gap.
                row["startedBeforeRun"] = True
            row.update(process.exit_fields())
            processes.append(row)
        audit = {
            "source": SOURCE,
            # The runner's own end, or every program process's, was recorded: the run's points came before.
            "complete": self.table.runner_exited or self.table.program_ended(self.since_ns),
            "filesRead": bounded("filesRead", files(self.read), bounds.files, self.read.untracked),
            "filesWritten": bounded("filesWritten", files(self.written), bounds.files, self.written.untracked),
            "outsideWorkdir": {**self.outside,
                               "examples": [paths.escape(p) for p in self.examples[:bounds.examples]]},
            "connectAttempts": bounded("connectAttempts", connects, bounds.connects, self.connects.untracked),
            "socketsOpened": bounded("socketsOpened", sockets, bounds.sockets, self.sockets.untracked),
            "processes": bounded("processes", processes, bounds.processes),
            "counts": {
                "processes": len(program),
                "failedExecs": self.failed_execs,
                "connectAttempts": sum(e.count for e in self.connects.entries.values()) + self.connects.untracked,
                **self.counts,
            },
            # The helpers the runner forked (since the claim), not the one that became the program.
            "runner": {**self.runner, "processes": sum(
                1 for p in self.table.processes.values()
                if p.side == RUNNER and p.tgid != self.table.runner_root and p.started_ns >= self.since_ns)},
        }
        if len(self.examples) > bounds.examples:
            omitted["outsideWorkdirExamples"] = len(self.examples) - bounds.examples
        if omitted:
            audit["omitted"] = omitted
        return audit


_HANDLERS = {
    sentry_pb2.CloneInfo: RunAudit._clone,
    sentry_pb2.ExecveInfo: RunAudit._exec,
    sentry_pb2.ExitNotifyParentInfo: RunAudit._exit_notify,
    sentry_pb2.TaskExit: RunAudit._task_exit,
    syscall_pb2.Execve: RunAudit._failed_exec,
    syscall_pb2.Open: RunAudit._open,
    syscall_pb2.Write: RunAudit._write,
    syscall_pb2.Socket: RunAudit._socket,
    syscall_pb2.Connect: RunAudit._connect,
    syscall_pb2.Syscall: RunAudit._raw,
}
