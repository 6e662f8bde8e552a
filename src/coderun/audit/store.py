"""The agent's memory: each sandbox connection's raw packets, bounded, and the answer to "what did this container
do since then", computed from them when asked.

A packet is kept as it came, not decoded: a program can make a hundred thousand opens a second, and only the few
runs the operator asks about need decoding. Only `container/start` is decoded on receipt, to learn which
containers live on the connection (runsc sends the pause container's, then the run container's). Packets past a
connection's cap or the agent's are counted as lost for that connection; a container's start is always kept
(there are a handful per sandbox, and without it the run has no trace at all)."""

from __future__ import annotations

import itertools
import threading
import time
from array import array
from dataclasses import dataclass

from . import wire
from .record import Record
from .summary import RunAudit

MiB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    connection_bytes: int = 8 * MiB     # packet bytes kept per sandbox connection
    total_bytes: int = 256 * MiB        # packet bytes kept by the agent
    retention_s: float = 600.0          # a closed connection's packets are kept this long, for a late question
    connections: int = 4096             # connections kept; past it the oldest closed one goes first
    pace_s: float = 0.05                # a waiting question is evaluated again at most this often


class Connection:
    """One sandbox's trace connection: its packets back to back in one buffer (no per-packet object), the end
    offset of each, and what the store could not keep."""

    def __init__(self, number: int, lock: threading.Lock):
        self.number = number
        self.changed = threading.Condition(lock)  # the store's lock: a packet, a loss or the close wakes waiters
        self.containers: list[str] = []
        self.data = bytearray()
        self.ends = array("Q")
        self.lost = 0
        self.error: str | None = None
        self.closed_at: float | None = None
        self.oom_killed: bool | None = None  # the pod's memory cgroup, read at the close (None: not known)

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    def describe(self) -> str:
        ended = f"; ended by: {self.error}" if self.error else ""
        memory = {None: "", True: "; the kernel OOM-killed it", False: "; no OOM kill"}[self.oom_killed]
        return (f"containers {', '.join(self.containers) or 'none'}; {len(self.ends)} packets "
                f"({len(self.data)} bytes), {self.lost} lost{ended}{memory}")


class RunView:
    """One container's audit and record on one connection, fed the connection's packets in order, a batch at a
    time (a question that waits decodes each packet once)."""

    def __init__(self, container_id: str, since_ns: int):
        self.audit = RunAudit(container_id, since_ns=since_ns)
        self.record = Record(container_id, since_ns)
        self.fed = 0
        self.lost_counted = 0
        self.error: str | None = None

    def feed(self, packets: list[bytes]) -> None:
        for packet in packets:
            try:
                point = wire.decode_point(packet)
            except wire.WireError as error:
                # Nothing past a packet that does not parse can be trusted: the connection ends there.
                self.error = str(error)
                return
            self.audit.add(point)
            self.record.add(point.message)  # last: it clears the message's context and environment
            self.fed += 1

    def summary(self, lost: int) -> dict:
        self.audit.add_lost(lost - self.lost_counted)
        self.lost_counted = lost
        return self.audit.summary()

    def answer(self, summary: dict, closed: bool, error: str | None, oom_killed: bool | None = None) -> dict:
        connection = {"closed": closed}
        if error:
            connection["error"] = error
        if oom_killed is not None:
            connection["oomKilled"] = oom_killed
        return {"audit": summary, "record": self.record.text(), "recordCut": self.record.cut,
                "connection": connection}


APPEAR_WAIT_S = 0.2


class Store:
    def __init__(self, limits: Limits = Limits()):
        self.limits = limits
        self.lock = threading.Lock()
        self.appeared = threading.Condition(self.lock)  # a container's start arrived
        self.connections: dict[int, Connection] = {}    # in the order they opened
        self.by_container: dict[str, Connection] = {}
        self.total_bytes = 0
        self._numbers = itertools.count(1)

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
            connection = Connection(next(self._numbers), self.lock)
            self.connections[connection.number] = connection
            return connection

    def add(self, connection: Connection, packet: bytes | memoryview) -> None:
        """Keep one packet, reading only its header (WireError: the connection cannot be trusted further)."""
        _, message_type, _ = wire.read_header(packet)
        container = None
        if message_type == wire.MessageType.MESSAGE_CONTAINER_START:
            container = wire.decode_point(bytes(packet)).message.id
        size = len(packet)
        with self.lock:
            if connection.error:
                raise wire.WireError(connection.error)
            fits = (len(connection.data) + size <= self.limits.connection_bytes
                    and self.total_bytes + size <= self.limits.total_bytes)
            if fits or container is not None:
                connection.data += packet
                connection.ends.append(len(connection.data))
                self.total_bytes += size
            else:
                connection.lost += 1
            if container is not None:
                connection.containers.append(container)
                self.by_container[container] = connection
                self.appeared.notify_all()
            connection.changed.notify_all()

    def close(self, connection: Connection, error: str | None = None, oom_killed: bool | None = None) -> None:
        with self.lock:
            connection.error = connection.error or error
            connection.oom_killed = oom_killed
            connection.closed_at = time.monotonic()
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
        self.total_bytes -= len(connection.data)
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
        view = RunView(container_id, since_ns)
        for evaluation in itertools.count():
            evaluated = time.monotonic()
            packets, lost, closed, error = self._since(connection, view.fed)
            view.feed(packets)
            if view.error and not error:
                error = view.error
                self._fail(connection, error)
            summary = view.summary(lost)
            remaining = deadline - time.monotonic()
            if summary["complete"] or closed or error or remaining <= 0:
                return view.answer(summary, closed, error, connection.oom_killed if closed else None)
            with self.lock:
                connection.changed.wait_for(lambda: len(connection.ends) > view.fed or connection.closed,
                                            timeout=remaining)
            # A flood of points wakes this on every packet: evaluate again no more often than pace_s. Not after the
            # first look, though: the point it missed (the program's exit, still in the socket) is usually the next.
            pause = min(evaluated + self.limits.pace_s - time.monotonic(), deadline - time.monotonic())
            if pause > 0 and evaluation > 0:
                time.sleep(pause)

    def _since(self, connection: Connection, start: int) -> tuple[list[bytes], int, bool, str | None]:
        """The packets from index start on, copied under the lock, and the connection's state with them."""
        with self.lock:
            ends = connection.ends[start:]
            first = connection.ends[start - 1] if start else 0
            chunk = bytes(connection.data[first:ends[-1]]) if ends else b""
            lost, closed, error = connection.lost, connection.closed, connection.error
        offsets = [first, *ends]
        packets = [chunk[a - first:b - first] for a, b in zip(offsets, offsets[1:])]
        return packets, lost, closed, error

    def _fail(self, connection: Connection, error: str) -> None:
        with self.lock:
            connection.error = connection.error or error
            connection.changed.notify_all()
