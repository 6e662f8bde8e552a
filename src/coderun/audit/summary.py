"""One run's `status.audit`, folded from the decoded points of its container as they arrive: pure and bounded,
however many points come.

Feed every point of the run's sandbox connection to `RunAudit.add` in the order they arrived (the node agent does
it on receipt), then call `summary()`. A flood costs counts, not records: repeated opens of one path are one row
with a count, distinct keys past `tracked` are only counted, and processes, connects, sockets and denied opens have
a reserve that routine points (the program's opens of its own dirs) cannot spend. Points of other containers (the
pod's pause container) are skipped; the process table is kept from the container's start, but activity before a
run's start (a warm pod's claim, a session's earlier runs, on the sandbox's clock) is not the run's: the fold keeps
its counters in segments split at quiet gaps and at the runner's run.json (written first for every run, and never
merged into an earlier segment), and `summary(since_ns)` adds up the segments from the run's own start (without
one, from the one the start falls in: a gap's worth of earlier activity at most is counted with it, never the
run's hidden). Points lost
on the way (gVisor's drop counter) make the summary `complete: false`, saying how many and from when."""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from . import paths, sockaddr
from .points import container_pb2, sentry_pb2, syscall_pb2
from .processes import ARGV_CHARS, ARGV_ITEMS, PROGRAM, RUNNER, ProcessTable
from .wire import Point

SOURCE = "gvisor-trace"
O_ACCMODE, O_WRONLY, O_RDWR, O_CREAT, O_TRUNC = 0o3, 0o1, 0o2, 0o100, 0o1000
RUN_INPUT = "/coderun/input/run.json"  # the runner writes it first for every run (sandbox/runner)
DENIED_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
CONNECT_RESULTS = {0: "connected", errno.EINPROGRESS: "inProgress", errno.ECONNREFUSED: "refused",
                   errno.ETIMEDOUT: "timedOut", errno.ENETUNREACH: "unreachable", errno.EHOSTUNREACH: "unreachable",
                   errno.EACCES: "denied", errno.EPERM: "denied"}
# Raw points (syscall/sysno/N/exit) for what has no schema: addressed sends, and openat2, whose path gVisor does
# not record (only that it happened and what it returned).
SENDTO, SENDMSG, SENDMMSG, OPENAT2 = 44, 46, 307, 437
# What a key costs the agent's memory, roughly (its entry, the dict's slot), besides its characters: charged to its
# budget (a routine key's to the routine share, any other's to the whole).
KEY_BYTES = 160
# Opens whose fields are longer in all are not remembered for their repeats (the cache stays small).
CACHED_CHARS = 512
# Example priority: a denied open first, then one that succeeded, then one that failed (a flood of missing paths
# cannot push a real read out of the examples).
DENIED, OPENED, FAILED = 0, 1, 2
# Past its room, a list keeps this many of its latest keys (and outsideWorkdir.examples its latest paths).
LATEST = 16
_UNKNOWN, _SKIPPED = "unknown", "skipped"  # an open not seen before; one that leaves no trace (the work dir's listing)


@dataclass(frozen=True)
class Bounds:
    files: int = 50            # filesRead, filesWritten entries
    examples: int = 10         # outsideWorkdir.examples
    connects: int = 50         # connectAttempts entries
    processes: int = 50        # processes entries
    sockets: int = 20          # socketsOpened entries
    tracked: int = 1000        # distinct keys remembered per list (all segments): past it, only counted
    reserve: int = 100         # more keys for denied opens, past tracked: a flood of routine paths cannot spend them
    argv_items: int = ARGV_ITEMS  # what the process table keeps of an argv (processes.py)
    argv_chars: int = ARGV_CHARS
    segment_gap_ns: int = 50_000_000  # a quiet gap this long starts a new segment (a run's start is after one)
    segments: int = 8          # segments kept; past it the two oldest after the first are merged


def iso_time(time_ns: int) -> str:
    """A sandbox clock's time as RFC 3339, to the millisecond."""
    moment = datetime.fromtimestamp(time_ns / 1e9, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


class Losses:
    """Points that never reached the fold, and when: gVisor's sink counts the points it dropped in every packet's
    header (cumulative per connection; concurrent writers deliver it out of order, so the count is the largest
    seen: a smaller one is an older packet, never a wrap), and the agent adds its own. Each rise is marked with the
    time of the point before it (the loss came after that one) and of the point that carried it."""
    MARKS = 32

    def __init__(self) -> None:
        self.dropped = 0       # the largest drop counter seen
        self.own = 0           # points the agent itself could not fold
        self.last_ns = 0       # the latest point's time
        self.marks: list[list[int]] = []  # [from_ns, to_ns, total lost by then], in order

    @property
    def total(self) -> int:
        return self.dropped + self.own

    def saw(self, dropped: int, time_ns: int) -> None:
        if dropped > self.dropped:
            self._mark(dropped - self.dropped, time_ns or self.last_ns)
            self.dropped = dropped
        if time_ns > self.last_ns:
            self.last_ns = time_ns

    def add(self, count: int, time_ns: int = 0) -> None:
        if count > 0:
            self.own += count
            self._mark(count, time_ns or self.last_ns)

    def _mark(self, count: int, to_ns: int) -> None:
        total = (self.marks[-1][2] if self.marks else 0) + count
        if len(self.marks) >= self.MARKS:
            self.marks[-1][1:] = [max(self.marks[-1][1], to_ns), total]  # the latest mark widens: bounded
        else:
            self.marks.append([self.last_ns, to_ns, total])

    def since(self, since_ns: int) -> tuple[int, int | None]:
        """(points lost that may be the run's, the time from which): every loss carried by a point at or after
        since_ns."""
        for index, (from_ns, to_ns, _) in enumerate(self.marks):
            if to_ns >= since_ns:
                return self.total - (self.marks[index - 1][2] if index else 0), from_ns
        return 0, None


@dataclass
class _Entry:
    count: int = 0
    failed: int = 0
    denied: int = 0
    bytes: int = 0
    gone: bool = False  # pushed out of a list's latest keys: only counted since

    def absorb(self, other: "_Entry") -> None:
        self.count += other.count
        self.failed += other.failed
        self.denied += other.denied
        self.bytes += other.bytes


@dataclass
class _Room:
    """The keys one list may still track, across segments; `reserve` more for what routine points cannot spend."""
    left: int
    reserve: int = 0

    def fits(self, reserved: bool) -> bool:
        """Whether one more key has a place: in the room, or (for what may spend it) in the reserve."""
        return self.left > 0 or (reserved and self.reserve > 0)

    def take(self) -> None:
        """One place taken: the room's first, the reserve's once it is spent."""
        if self.left > 0:
            self.left -= 1
        else:
            self.reserve -= 1


@dataclass
class _Keyed:
    """A bounded map from key to entry: the first keys up to its room, then the LATEST most recent ones (a flood
    cannot hide what comes after it); keys pushed out of those are only counted in `untracked`."""
    room: _Room
    charge: Callable[[int, bool], bool] | None = None  # the agent's memory budget (bytes, reserved) (None: none)
    entries: dict = field(default_factory=dict)
    latest: dict = field(default_factory=dict)
    untracked: int = 0

    def get(self, key, reserved: bool = False) -> _Entry | None:
        entry = self.entries.get(key) or self.latest.get(key)
        if entry is None:
            room = self.room
            if room.fits(reserved) and (self.charge is None or self.charge(KEY_BYTES + _chars(key), reserved)):
                room.take()
            else:
                if len(self.latest) >= LATEST:
                    oldest = self.latest.pop(next(iter(self.latest)))
                    oldest.gone = True
                    self.untracked += oldest.count + oldest.failed + oldest.denied or 1
                entry = self.latest[key] = _Entry()
                return entry
            entry = self.entries[key] = _Entry()
        return entry

    def items(self) -> list:
        return [*self.entries.items(), *self.latest.items()]

    def absorb(self, other: "_Keyed") -> None:
        for key, entry in other.items():
            mine = self.entries.get(key) or self.latest.get(key)
            if mine is None:
                self.latest[key] = entry  # within the room its keys took already
            else:
                mine.absorb(entry)
        self.untracked += other.untracked


class _Segment:
    """The run's counters over a stretch of the sandbox's time without a quiet gap."""

    def __init__(self, start_ns: int, rooms: dict[str, _Room], charge: Callable[[int, bool], bool] | None):
        self.start_ns = self.last_ns = start_ns  # its first point's time, and its latest's
        self.run_start = False  # begun by the runner's run.json for a run: where a session's or warm pod's run starts
        self.read = _Keyed(rooms["read"], charge)
        self.written = _Keyed(rooms["written"], charge)
        self.connects = _Keyed(rooms["connects"], charge)  # their own rooms: the reserve of connects and sockets
        self.sockets = _Keyed(rooms["sockets"], charge)
        self.outside = {"reads": 0, "writes": 0, "denied": 0}
        self.examples: dict[str, int] = {}  # path -> priority, in the order first seen
        self.examples_latest: dict[str, int] = {}  # past the room, the latest paths
        self.examples_untracked = 0
        self.runner = {"filesRead": 0, "filesWritten": 0}
        self.counts = {"syscallsDenied": 0, "openat2": 0, "addressedSends": 0, "pointsUnknown": 0}
        self.failed_execs = 0

    def absorb(self, other: "_Segment") -> None:
        for mine, theirs in ((self.read, other.read), (self.written, other.written),
                             (self.connects, other.connects), (self.sockets, other.sockets)):
            mine.absorb(theirs)
        self.add_counts(other)

    def add_counts(self, other: "_Segment") -> None:
        """Another segment's totals and examples added to this one's (its keyed lists are the caller's)."""
        for totals, more in ((self.outside, other.outside), (self.runner, other.runner),
                             (self.counts, other.counts)):
            for name, value in more.items():
                totals[name] += value
        for path, priority in other.examples.items():
            self.examples[path] = min(priority, self.examples.get(path, priority))
        for path, priority in other.examples_latest.items():
            self.examples_latest[path] = min(priority, self.examples_latest.get(path, priority))
        self.examples_untracked += other.examples_untracked
        self.failed_execs += other.failed_execs


def _chars(key) -> int:
    """The characters a key holds (a path, or a tuple of fields)."""
    return len(key) if isinstance(key, str) else sum(len(part) for part in key if isinstance(part, str))


def _errno(message) -> int:
    """The errno a syscall exit point carries (0: it succeeded, or the point is an enter point)."""
    return int(message.exit.errorno)


def _added_up(segments: list[_Segment]) -> _Segment:
    """One segment with the counts of all of them (theirs unchanged: the fold goes on); none: an empty one."""
    if len(segments) == 1:
        return segments[0]
    unbounded = _Room(2 ** 62)
    total = _Segment(segments[0].start_ns if segments else 0, dict.fromkeys(("read", "written", "connects", "sockets"), unbounded), None)
    for segment in segments:
        for name in ("read", "written", "connects", "sockets"):
            mine, theirs = getattr(total, name), getattr(segment, name)
            for key, entry in theirs.items():
                mine.entries.setdefault(key, _Entry()).absorb(entry)
            mine.untracked += theirs.untracked
        total.add_counts(segment)
    return total


class RunAudit:
    def __init__(self, container_id: str, workdir: str = "/tmp/work", own_dirs: tuple[str, ...] = ("/tmp",),
                 since_ns: int = 0, bounds: Bounds = Bounds(), losses: Losses | None = None,
                 charge: Callable[[int, bool], bool] | None = None):
        """since_ns: points before it are not folded at all (a question's start known in advance). losses: the
        connection's, when several containers share it. charge(bytes, reserved): the agent's memory budget for
        every key, example, process and segment, False when spent (the key is then only counted, the process keeps
        no argv); routine keys spend only its routine share (reserved False); a segment is never refused."""
        self.container_id, self.workdir, self.own_dirs = container_id, workdir, own_dirs
        self.since_ns, self.bounds = since_ns, bounds
        self.table = ProcessTable(None if charge is None else lambda size: charge(size, True))
        self.started = False
        self.losses = losses if losses is not None else Losses()
        self.charge = charge
        self.rooms = {"read": _Room(bounds.tracked, bounds.reserve), "written": _Room(bounds.tracked, bounds.reserve),
                      "connects": _Room(bounds.tracked), "sockets": _Room(bounds.tracked),
                      "examples": _Room(bounds.tracked, bounds.reserve)}
        self.segments = [_Segment(0, self.rooms, charge)]
        self.last_ns = 0  # this container's latest point
        self._exec_calls: dict[int, bool] = {}  # threads whose last execve call is not yet known to have run
        # What an open's fields came to (its side and its entry, or that it is skipped), for the flood's repeats:
        # cleared when a process changes (clone, exec) or a segment starts.
        self._opens: dict[tuple, _Entry | str | None] = {}

    @property
    def segment(self) -> _Segment:
        return self.segments[-1]

    # --- input

    def add(self, point: Point) -> None:
        message = point.message
        time_ns = message.context_data.time_ns if message is not None else 0
        self.losses.saw(point.dropped_count, time_ns)
        if message is None:
            self.segment.counts["pointsUnknown"] += 1
            return
        context = message.context_data
        if context.container_id != self.container_id:
            return
        if self._starts_a_run(message, context):
            self._new_segment(time_ns, run_start=True)
        elif self.last_ns and time_ns - self.last_ns >= self.bounds.segment_gap_ns:
            self._new_segment(time_ns)
        self.last_ns = max(self.last_ns, time_ns)
        self.segment.last_ns = max(self.segment.last_ns, time_ns)
        if isinstance(message, container_pb2.Start):
            self.started = True
            self.table.start_container(context.thread_group_id, list(message.args), context.time_ns)
            return
        handler = _HANDLERS.get(type(message))
        if handler is not None:
            handler(self, message, context)

    def _starts_a_run(self, message, context) -> bool:
        # The runner lays out each run's input, run.json first, before the run's program is given it (the mount is
        # read-only to the program, and the side is the runner's: a program cannot make one).
        return (isinstance(message, syscall_pb2.Open) and message.pathname == RUN_INPUT
                and bool(message.flags & O_CREAT) and not _errno(message)
                and self._side(context) == RUNNER)

    def _new_segment(self, start_ns: int, run_start: bool = False) -> None:
        # Never refused for want of room: a segment is what keeps a session's runs apart (refused, a later run
        # counted every earlier run's files), and there are at most bounds.segments + 1 of them.
        if self.charge is not None:
            self.charge(KEY_BYTES * 4, True)
        self.segments.append(_Segment(start_ns, self.rooms, self.charge))
        self.segment.run_start = run_start
        self._opens.clear()
        if len(self.segments) > self.bounds.segments:
            # The oldest segment past the first that no run started goes into the one before it, so that a long
            # run's quiet gaps never blur its start with an earlier run's; past that, the oldest runs blur together.
            index = next((i for i in range(2, len(self.segments) - 1) if not self.segments[i].run_start), 2)
            merged = self.segments.pop(index)
            self.segments[index - 1].absorb(merged)
            self.segments[index - 1].last_ns = max(self.segments[index - 1].last_ns, merged.last_ns)

    def compact(self) -> None:
        """The sandbox ended: what only later points would have needed goes."""
        self._exec_calls.clear()

    def _side(self, context) -> str:
        return self.table.side(context.thread_group_id, context.parent_thread_group_id)

    def _in_run(self, context) -> bool:
        return context.time_ns >= self.since_ns

    # --- processes (the table always follows; the record only after since_ns)

    def _clone(self, message: sentry_pb2.CloneInfo, context) -> None:
        self._opens.clear()
        self.table.clone(context.thread_group_id, context.parent_thread_group_id, message.created_thread_group_id,
                         message.flags, context.time_ns)

    def _exec(self, message: sentry_pb2.ExecveInfo, context) -> None:
        self._opens.clear()
        self._exec_calls.pop(context.thread_id, None)  # the call this thread made succeeded
        self.table.execve(context.thread_group_id, context.parent_thread_group_id, list(message.argv),
                          message.binary_path, message.binary_in_memfd)

    def _exit_notify(self, message: sentry_pb2.ExitNotifyParentInfo, context) -> None:
        self.table.exit(context.thread_group_id, context.parent_thread_group_id, message.exit_status, context.time_ns)

    def _task_exit(self, message: sentry_pb2.TaskExit, context) -> None:
        # Every thread's end; only the leader's says the process ended (exit_notify_parent, if it comes, agrees).
        if self._exec_calls.pop(context.thread_id, False):
            self.segment.failed_execs += 1  # its last execve call never became an exec
        if context.thread_id == context.thread_group_id:
            self.table.exit(context.thread_group_id, context.parent_thread_group_id, message.exit_status,
                            context.time_ns)

    def _failed_exec(self, message: syscall_pb2.Execve, context) -> None:
        if not self._in_run(context) or self._side(context) != PROGRAM:
            return
        number = _errno(message)
        if number:
            self.segment.failed_execs += 1
            self._note_denied(number)
            return
        # gVisor's execve exit point carries no errno (seen on the cluster: `{}` for a missing binary as for the
        # one that ran): a call that the exec itself (sentry/execve) does not follow on the same thread, before
        # the thread's next call or its end, failed. Python's and the shells' PATH searches make one per
        # directory.
        if self._exec_calls.pop(context.thread_id, False):
            self.segment.failed_execs += 1
        self._exec_calls[context.thread_id] = True

    # --- files

    def _note_denied(self, number: int) -> bool:
        if number in DENIED_ERRNOS:
            self.segment.counts["syscallsDenied"] += 1
            return True
        return False

    def _open(self, message: syscall_pb2.Open, context) -> None:
        if not self._in_run(context):
            return
        flags, number = message.flags, _errno(message)
        if len(message.pathname) + len(message.fd_path) + len(context.cwd) > CACHED_CHARS:
            self._open_first(message, context, flags, number)  # too long to remember: folded in full every time
            return
        key = (context.thread_group_id, context.parent_thread_group_id, message.pathname, message.fd,
               message.fd_path, context.cwd, flags, number)
        known = self._opens.get(key, _UNKNOWN)
        if isinstance(known, _Entry) and not known.gone:  # a repeat of an open of the run's own files: one row, counted
            known.count += not number
            known.failed += bool(number)
            return
        if known is None:  # a repeat of one only the runner's counters or outsideWorkdir's totals count
            segment = self.segment
            if self._side(context) == RUNNER:
                if not number:
                    segment.runner["filesWritten" if flags & O_ACCMODE in (O_WRONLY, O_RDWR)
                                   or flags & (O_CREAT | O_TRUNC) else "filesRead"] += 1
            else:
                segment.outside["writes" if flags & O_ACCMODE in (O_WRONLY, O_RDWR) or flags & (O_CREAT | O_TRUNC)
                                else "reads"] += 1
            return
        if isinstance(known, _Keyed):  # a repeat of an open of the run's own files past the tracked keys
            known.untracked += 1
            return
        if known is _SKIPPED:
            return
        outcome = self._open_first(message, context, flags, number)
        if number not in DENIED_ERRNOS:  # a denied open is folded in full every time (it is counted as denied)
            if len(self._opens) >= 256:
                self._opens.clear()
            self._opens[key] = outcome

    def _open_first(self, message: syscall_pb2.Open, context, flags: int, number: int) -> "_Entry | _Keyed | str | None":
        """Fold an open; what a repeat of it would come to (see _open)."""
        path = paths.capped(paths.resolve(message.pathname, message.fd_path, message.fd, context.cwd))
        writes = flags & O_ACCMODE in (O_WRONLY, O_RDWR) or flags & (O_CREAT | O_TRUNC)
        segment = self.segment
        if self._side(context) == RUNNER:
            if not number:
                segment.runner["filesWritten" if writes else "filesRead"] += 1
            return None
        denied = self._note_denied(number)
        if path == self.workdir and not writes and not number:
            return _SKIPPED  # the interpreter listing its script's directory for imports: every run does it
        if any(paths.is_under(path, own) for own in self.own_dirs):
            entry = (segment.written if writes else segment.read).get(path, reserved=denied)
            if entry is not None:
                entry.count += not number
                entry.failed += bool(number) and not denied
                entry.denied += denied
            return entry if entry is not None else (segment.written if writes else segment.read)
        segment.outside["writes" if writes else "reads"] += 1
        segment.outside["denied"] += denied
        if denied or not paths.is_routine(path):
            self._example(segment, path, DENIED if denied else FAILED if number else OPENED)
        return None

    def _example(self, segment: _Segment, path: str, priority: int) -> None:
        known = segment.examples.get(path)
        if known is not None:
            segment.examples[path] = min(known, priority)
            return
        # Charged to the whole budget, not the routine share: a path outside the run's own dirs that is not an
        # interpreter's routine read is what the examples are for (bounded by their own room).
        room = self.rooms["examples"]
        if room.fits(priority == DENIED) and (self.charge is None or self.charge(KEY_BYTES + len(path), True)):
            room.take()
        else:
            latest = segment.examples_latest
            if path not in latest and len(latest) >= LATEST:
                del latest[next(iter(latest))]
                segment.examples_untracked += 1  # only counted, in outsideWorkdir's totals and omitted
            latest[path] = min(priority, latest.get(path, priority))
            return
        segment.examples[path] = priority

    def _write(self, message: syscall_pb2.Write, context) -> None:
        """Bytes written, when the session traces writes (trace_config.py `write_bytes`)."""
        number = _errno(message)
        if number or not self._in_run(context) or self._side(context) == RUNNER:
            return
        if message.fd_path.startswith("/") and any(paths.is_under(message.fd_path, d) for d in self.own_dirs):
            entry = self.segment.written.get(paths.capped(message.fd_path))
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
        entry = self.segment.sockets.get(key)
        if entry is not None:
            entry.count += 1

    def _connect(self, message: syscall_pb2.Connect, context) -> None:
        if not self._in_run(context) or self._side(context) == RUNNER:
            return
        number = _errno(message)
        self._note_denied(number)
        address = sockaddr.parse(message.address)
        result = CONNECT_RESULTS.get(number, errno.errorcode.get(number, str(number)))
        entry = self.segment.connects.get((address.family, address.address, address.port, result))
        if entry is not None:
            entry.count += 1

    def _raw(self, message: syscall_pb2.Syscall, context) -> None:
        if not self._in_run(context) or self._side(context) == RUNNER:
            return
        self._note_denied(_errno(message))
        if message.sysno == OPENAT2:
            self.segment.counts["openat2"] += 1
        elif message.sysno in (SENDMSG, SENDMMSG) or (message.sysno == SENDTO and message.arg5):
            self.segment.counts["addressedSends"] += 1

    # --- output

    def summary(self, since_ns: int | None = None) -> dict:
        """The run's status.audit from since_ns on (default: the since_ns it was made with)."""
        if not self.started:
            return {"source": SOURCE, "complete": False,
                    "message": "no trace of this container reached the audit agent"}
        since = self.since_ns if since_ns is None else max(since_ns, self.since_ns)
        bounds = self.bounds
        # From the run's own start (the first segment a run started at or after since); without one, from the
        # first segment with a point at or after since: one the start falls in counts whole.
        first = next((i for i, segment in enumerate(self.segments) if segment.run_start and segment.start_ns >= since),
                     None) if since else None
        if first is None:
            first = next((i for i, segment in enumerate(self.segments) if segment.last_ns >= since),
                         len(self.segments))
        run = _added_up(self.segments[first:])
        program = self.table.program(since)
        omitted = {}

        def ends(items: list, limit: int) -> list:
            # The first and the latest: what came before a flood and what came after it.
            if len(items) <= limit:
                return items
            tail = limit // 5
            return items[:limit - tail] + items[len(items) - tail:]

        def bounded(name: str, items: list, limit: int, untracked: int = 0) -> list:
            if len(items) + untracked > limit:
                omitted[name] = len(items) + untracked - min(len(items), limit)
            return ends(items, limit)

        def files(keyed: _Keyed) -> list[dict]:
            # The work dir first (inputs and what the program made there), then the rest of the run's own dirs; a
            # denied one before both.
            ordered = sorted(keyed.items(),
                             key=lambda item: (not item[1].denied, not paths.is_under(item[0], self.workdir)))
            out = []
            for path, entry in ordered:
                row = {"path": paths.shown(path, self.workdir), "count": entry.count}
                row.update({k: v for k, v in (("failed", entry.failed), ("denied", entry.denied),
                                              ("bytes", entry.bytes)) if v})
                out.append(row)
            return out

        connects = [{"family": family, "address": paths.escape(address), "port": port, "result": result,
                     "count": entry.count}
                    for (family, address, port, result), entry in run.connects.items()]
        sockets = [{"family": family, "protocol": protocol, "result": result, "count": entry.count}
                   for (family, protocol, result), entry in run.sockets.items()]
        processes = []
        for process in program:
            row = {"argv": [paths.escape(arg, bounds.argv_chars) for arg in process.argv[:bounds.argv_items]]}
            if process.argv_count > len(row["argv"]):
                row["argvOmitted"] = process.argv_count - len(row["argv"])
            if process.from_memfd:
                row["fromMemfd"] = True
            if self.table.is_root(process) and process.prestarted:
                # The run's prestarted interpreter: its start was not the run's. Told by what it is (the runner's
                # side started it with the bootstrap), not by comparing its start with the run's: the operator's
                # clock and the Sentry's differ by more than a back-to-back session's gap.
                row["startedBeforeRun"] = True
            row.update(process.exit_fields())
            processes.append(row)
        # The first paths (a denied one first: stable, first seen first), then the latest past the room.
        examples = sorted(run.examples, key=lambda path: run.examples[path])
        examples += [path for path in sorted(run.examples_latest, key=lambda path: run.examples_latest[path])
                     if path not in run.examples]
        lost, lost_from = self.losses.since(since)
        evicted = self.table.evicted[PROGRAM]
        audit = {
            "source": SOURCE,
            # The runner's own end, or every program process's, was recorded: the run's points came before. And
            # none was lost on the way: a record that says complete is complete.
            "complete": (self.table.runner_exited or self.table.program_ended(since)) and not lost,
            "filesRead": bounded("filesRead", files(run.read), bounds.files, run.read.untracked),
            "filesWritten": bounded("filesWritten", files(run.written), bounds.files, run.written.untracked),
            "outsideWorkdir": {**run.outside, "examples": [paths.escape(p) for p in ends(examples, bounds.examples)]},
            "connectAttempts": bounded("connectAttempts", connects, bounds.connects, run.connects.untracked),
            "socketsOpened": bounded("socketsOpened", sockets, bounds.sockets, run.sockets.untracked),
            "processes": bounded("processes", processes, bounds.processes, evicted),
            "counts": {
                "processes": len(program) + evicted,
                "failedExecs": run.failed_execs,
                "connectAttempts": sum(e.count for _, e in run.connects.items()) + run.connects.untracked,
                **{k: v for k, v in run.counts.items() if k != "pointsUnknown"},
                "pointsLost": lost,
                "pointsUnknown": run.counts["pointsUnknown"],
            },
            # The helpers the runner forked (since the claim), not the one that became the program.
            "runner": {**run.runner, "processes": self.table.evicted[RUNNER] + sum(
                1 for p in self.table.processes.values()
                if p.side == RUNNER and p.tgid != self.table.runner_root and p.started_ns >= since)},
        }
        if lost:
            when = f"from {iso_time(lost_from)} on (the sandbox's clock)" if lost_from else "from the sandbox's start"
            audit["message"] = (f"{lost} trace points were lost on the way to the node's audit agent, {when}: what "
                                "the program did from then may be missing here")
        if len(examples) + run.examples_untracked > bounds.examples:
            omitted["outsideWorkdirExamples"] = len(examples) + run.examples_untracked - bounds.examples
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
