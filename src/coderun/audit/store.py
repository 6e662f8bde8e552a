"""The agent's memory: each sandbox connection's points, folded into each container's bounded audit and record as
they arrive, and the answer to "what did this container do since then", read from the fold when asked.

A flood costs counts, not records (summary.py): nothing is kept raw for later decoding, so the program cannot
choose what fills a cap. What the fold keeps is charged to three budgets: the connection's, its tenant's (the
namespace of the sandbox's pod when the agent can tell it, else the connection alone) and the agent's, each sized
from the container's memory limit (`Limits.for_memory`). Routine keys and record lines may spend only part of each
budget (`1 - reserve_share`): the rest is for processes, connects, sockets and denied opens. When the agent's
budget or a tenant's share is short, closed connections go first (for a share, the tenant's own), oldest first; a
spent budget makes keys counted only and record lines cut, never a point lost from the summary. The points the summary misses are gVisor's drops (the sink's
counter), and a summary that misses any says `complete: false` and from when."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from . import wire
from .points import container_pb2, syscall_pb2
from .record import Record
from .summary import DENIED_ERRNOS, Losses, RunAudit

MiB = 1024 * 1024
# What a connection costs before any point: its objects, a container's fold and process table at their start.
CONNECTION_BYTES = 16 * 1024
# The agent's store takes this share of its container's memory limit: the rest is the interpreter, the threads, and
# the answers in flight (up to a couple of MiB each).
STORE_SHARE = 0.4
# Routine points: opens and writes (undenied); everything else is the reserve's.
ROUTINE_TYPES = (syscall_pb2.Open, syscall_pb2.Write)


@dataclass(frozen=True)
class Limits:
    connection_bytes: int = 4 * MiB     # what one sandbox connection's folds and records may hold
    total_bytes: int = 128 * MiB        # what all of them may hold
    namespace_share: float = 0.25       # of total_bytes, for the connections of one tenant (a namespace)
    reserve_share: float = 0.25         # of each budget, that only processes, connects, sockets, denied opens spend
    retention_s: float = 600.0          # a closed connection's fold is kept this long, for a late question
    connections: int = 4096             # connections kept; past it the oldest closed one goes first
    pace_s: float = 0.05                # a waiting question is evaluated again at most this often

    @classmethod
    def for_memory(cls, memory_bytes: int | None, **overrides) -> "Limits":
        """Caps sized from the agent's memory limit (None: the defaults): STORE_SHARE of it in all, 1/32 of that
        a connection (1 to 4 MiB), and no more connections than 64 KiB each would fit."""
        limits = cls()
        if memory_bytes:
            total = int(memory_bytes * STORE_SHARE)
            limits = replace(limits, total_bytes=total, connection_bytes=max(MiB, min(4 * MiB, total // 32)),
                             connections=max(16, min(4096, total // (64 * 1024))))
        return replace(limits, **overrides)

    def describe(self) -> str:
        return (f"{self.total_bytes / MiB:.0f} MiB in all, {self.connection_bytes / MiB:.1f} MiB a sandbox, "
                f"{self.namespace_share:.0%} of it a namespace, {self.reserve_share:.0%} of each held for processes, "
                f"connects, sockets and denied opens; {self.connections} sandboxes, closed ones kept "
                f"{self.retention_s:g} s")


def memory_limit(root: str | Path = "/sys/fs/cgroup") -> tuple[int | None, str]:
    """The container's memory limit from its cgroup (v2's memory.max, v1's memory/memory.limit_in_bytes), and where
    it was read; None when there is none (v2's "max", v1's page-rounded 2**63) or it cannot be read."""
    root = Path(root)
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max" or not text.isdigit() or int(text) >= 2 ** 60:
            return None, str(path)
        return int(text), str(path)
    return None, str(root)


class Fold:
    """One container's audit and record on a connection, fed as the points arrive."""

    def __init__(self, container_id: str, losses: Losses, charge):
        self.audit = RunAudit(container_id, losses=losses, charge=charge)
        self.record = Record(container_id, charge=charge)


class Connection:
    """One sandbox's trace connection: a fold per container, what it holds, and what it lost."""

    def __init__(self, number: int, tenant: str):
        self.number, self.tenant = number, tenant
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # a point, a loss or the close wakes waiters
        self.version = 0
        self.waiting = 0  # questions waiting on `changed`: only then is a point worth a notify
        self.containers: list[str] = []
        self.folds: dict[str, Fold] = {}
        self.losses = Losses()
        self.points = 0
        self.held = 0  # bytes charged to the budgets
        self.error: str | None = None
        self.closed_at: float | None = None
        self.oom_killed: bool | None = None  # the pod's memory cgroup, read at the close (None: not known)

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    def describe(self) -> str:
        ended = f"; ended by: {self.error}" if self.error else ""
        memory = {None: "", True: "; the kernel OOM-killed it", False: "; no OOM kill"}[self.oom_killed]
        return (f"containers {', '.join(self.containers) or 'none'}; {self.points} points, {self.held} bytes held, "
                f"{self.losses.total} lost{ended}{memory}")


APPEAR_WAIT_S = 0.2


class Store:
    def __init__(self, limits: Limits = Limits(), tenant_of=None):
        """tenant_of(container_id) -> str | None: the namespace of the pod a sandbox's first container belongs to
        (None: unknown, the connection is its own tenant)."""
        self.limits = limits
        self.tenant_of = tenant_of
        self.lock = threading.Lock()
        self.appeared = threading.Condition(self.lock)  # a container's start arrived
        self.connections: dict[int, Connection] = {}    # in the order they opened
        self.by_container: dict[str, Connection] = {}
        self.total_bytes = 0
        self.tenants: dict[str, int] = {}               # tenant -> bytes held
        self.started = time.time()
        self._numbers = itertools.count(1)

    # --- the budgets

    def charge(self, connection: Connection, size: int, reserved: bool) -> bool:
        """Hold size bytes for the connection if its budget, its tenant's and the agent's allow (routine: up to
        1 - reserve_share of each); the oldest closed connections make room: the tenant's own in its share, any in
        the agent's."""
        limits = self.limits
        share = 1.0 if reserved else 1.0 - limits.reserve_share
        with self.lock:
            if connection.held + size > limits.connection_bytes * share:
                return False
            tenant = connection.tenant
            if not self._room(lambda: self.tenants.get(tenant, 0) + size
                              <= limits.total_bytes * limits.namespace_share * share,
                              lambda c: c.tenant == tenant, connection):
                return False
            if not self._room(lambda: self.total_bytes + size <= limits.total_bytes * share, None, connection):
                return False
            self._hold(connection, size)
            return True

    def _room(self, fits, whose, connection: Connection) -> bool:
        """Drop the oldest closed connections (whose(c): those that count) until fits(); False if it never does."""
        while not fits():
            closed = [c for c in self.connections.values()
                      if c.closed and c is not connection and (whose is None or whose(c))]
            if not closed:
                return False
            self._drop(min(closed, key=lambda c: c.closed_at))
        return True

    def _hold(self, connection: Connection, size: int) -> None:
        connection.held += size
        self.total_bytes += size
        self.tenants[connection.tenant] = self.tenants.get(connection.tenant, 0) + size

    # --- the sink's side

    def open(self) -> Connection | None:
        """A new connection's record, or None when the store holds its cap of connections and none is closed."""
        with self.lock:
            self._expire(time.monotonic())
            if len(self.connections) >= self.limits.connections:
                closed = [c for c in self.connections.values() if c.closed]
                if not closed:
                    return None
                self._drop(min(closed, key=lambda c: c.closed_at))
            number = next(self._numbers)
            connection = Connection(number, f"connection {number}")
            self.connections[number] = connection
            self._hold(connection, CONNECTION_BYTES)
            return connection

    def add(self, connection: Connection, packet: bytes | memoryview) -> None:
        """Fold one packet (WireError: the connection cannot be trusted further)."""
        point = wire.decode_point(bytes(packet))
        message = point.message
        if isinstance(message, container_pb2.Start) and not connection.containers and self.tenant_of is not None:
            tenant = self.tenant_of(message.id)  # the pod's pause container: outside the locks (it reads files)
            if tenant:
                self._move(connection, tenant)
        with connection.lock:
            if connection.error:
                raise wire.WireError(connection.error)
            connection.points += 1
            if message is None:
                connection.losses.saw(point.dropped_count, 0)
                for fold in connection.folds.values():
                    fold.audit.add(point)  # counted as unknown
            else:
                if isinstance(message, container_pb2.Start) and message.id not in connection.folds:
                    self._start(connection, message.id)
                fold = connection.folds.get(message.context_data.container_id)
                if fold is None:
                    connection.losses.saw(point.dropped_count, message.context_data.time_ns)
                else:
                    fold.audit.add(point)
                    reserved = not isinstance(message, ROUTINE_TYPES) or message.exit.errorno in DENIED_ERRNOS
                    fold.record.add(message, reserved)  # last: it clears the message's context and environment
            connection.version += 1
            if connection.waiting:
                connection.changed.notify_all()

    def lose(self, connection: Connection, count: int) -> None:
        """Points the agent received but could not fold (a packet longer than it takes): lost from the latest
        point's time on, so the audits say so."""
        with connection.lock:
            connection.points += count
            connection.losses.add(count)
            connection.version += 1
            if connection.waiting:
                connection.changed.notify_all()

    def _start(self, connection: Connection, container_id: str) -> None:
        """A container's fold: always made (a handful a sandbox, and without it the run has no trace at all)."""
        connection.folds[container_id] = Fold(container_id, connection.losses,
                                              lambda size, reserved: self.charge(connection, size, reserved))
        connection.containers.append(container_id)
        with self.lock:
            self._hold(connection, CONNECTION_BYTES)
            self.by_container[container_id] = connection
            self.appeared.notify_all()

    def _move(self, connection: Connection, tenant: str) -> None:
        with self.lock:
            self.tenants[connection.tenant] -= connection.held
            if not self.tenants[connection.tenant]:
                del self.tenants[connection.tenant]
            connection.tenant = tenant
            self.tenants[tenant] = self.tenants.get(tenant, 0) + connection.held

    def close(self, connection: Connection, error: str | None = None, oom_killed: bool | None = None) -> None:
        with connection.lock:
            connection.error = connection.error or error
            connection.oom_killed = oom_killed
            connection.closed_at = time.monotonic()
            for fold in connection.folds.values():
                fold.audit.compact()
            connection.version += 1
            connection.changed.notify_all()

    # --- housekeeping

    def expire(self, now: float | None = None) -> None:
        with self.lock:
            self._expire(time.monotonic() if now is None else now)

    def _expire(self, now: float) -> None:
        for connection in [c for c in self.connections.values()
                           if c.closed and now - c.closed_at >= self.limits.retention_s]:
            self._drop(connection)

    def _drop(self, connection: Connection) -> None:
        del self.connections[connection.number]
        self.total_bytes -= connection.held
        self.tenants[connection.tenant] -= connection.held
        if not self.tenants[connection.tenant]:
            del self.tenants[connection.tenant]
        connection.held = 0
        for container in connection.containers:
            if self.by_container.get(container) is connection:
                del self.by_container[container]

    # --- the question

    def answer(self, container_id: str, since_ns: int, wait_s: float) -> dict | None:
        """The container's audit and record since since_ns, as soon as the audit is complete, its connection has
        ended, or wait_s is up; None when no connection has the container within APPEAR_WAIT_S."""
        deadline = time.monotonic() + wait_s
        with self.lock:
            self._expire(time.monotonic())
            # The start comes when the container starts, seconds before anyone asks: a short wait covers a point
            # still in the socket, and a sandbox that runs untraced is answered without the whole wait.
            connection = self.appeared.wait_for(lambda: self.by_container.get(container_id),
                                                timeout=min(wait_s, APPEAR_WAIT_S))
        if connection is None:
            return None
        for evaluation in itertools.count():
            evaluated = time.monotonic()
            with connection.lock:
                fold = connection.folds[container_id]
                summary = self._look(fold, since_ns)
                closed, error = connection.closed, connection.error
                remaining = deadline - time.monotonic()
                if summary["complete"] or closed or error or remaining <= 0:
                    return self._answer(fold, since_ns, summary, connection)
                seen = connection.version
                connection.waiting += 1
                try:
                    connection.changed.wait_for(lambda: connection.version != seen or connection.closed,
                                                timeout=remaining)
                finally:
                    connection.waiting -= 1
            # A flood of points wakes this on every packet: evaluate again no more often than pace_s. Not after the
            # first look, though: the point it missed (the program's exit, still in the socket) is usually the next.
            pause = min(evaluated + self.limits.pace_s - time.monotonic(), deadline - time.monotonic())
            if pause > 0 and evaluation > 0:
                time.sleep(pause)

    @staticmethod
    def _look(fold: Fold, since_ns: int) -> dict:
        return fold.audit.summary(since_ns)

    @staticmethod
    def _answer(fold: Fold, since_ns: int, summary: dict, connection: Connection) -> dict:
        state = {"closed": connection.closed}
        if connection.error:
            state["error"] = connection.error
        if connection.closed and connection.oom_killed is not None:
            state["oomKilled"] = connection.oom_killed
        return {"audit": summary, "record": fold.record.text(since_ns), "recordCut": fold.record.cut,
                "connection": state}
