"""The tunnel relay: coderun's own hop in every CONNECT tunnel, so a run's byte budget and the revocation of its
credential bound the tunnel while its bytes flow, not only the run's next request.

Squid counts a tunnel's bytes only when the tunnel closes (its access-log line), and nothing squid offers cuts a
tunnel at a byte count (`reply_body_max_size` never applies to CONNECT, `delay_pools` are rates, external ACLs are
asked once per request). So the policy stage's parent peer is this relay on loopback, which hands each CONNECT on
to the TLS stage (squid_config.py) and relays its tunnel:

    program ──CONNECT──► policy stage ──CONNECT, login=PASS──► relay ──► TLS stage ──► origin

The relay reads the CONNECT's head (the run's credential rides along), verifies the credential as the helpers do,
and counts every tunnel byte after the TLS stage's answer, both ways, against the run. A run's spent bytes are a
sum (spent_bytes): what the log counted of its plain requests, plus its closed tunnels (the log's count of them or
the relay's, whichever is more: the log counts a tunnel only when it closes), plus the bytes on its tunnels still
open. The chunk that takes a run past its byte budget is the last one relayed: every tunnel of the run is then
cut, and a new one refused (403, BudgetExceeded). What the relay counted (closed and open tunnels) is written to
`runs/<uid>.relayed`, which the budget check (helpers.py) adds up with the log's count the same way, so the run's
next plain request is refused as well. A run whose credential is revoked (the admin endpoint tells the relay at
once, and the revocation list is looked at every WATCH_SECONDS) or expires has its tunnels closed: a kept socket
cannot carry one run's tunnel into the next run of a session.

Bounded for a hostile program: at most MAX_TUNNELS tunnels (MAX_TUNNELS_PER_NAMESPACE a namespace, whatever
its runs, and MAX_TUNNELS_PER_RUN a run), CHUNK_BYTES read at a
time and at most WRITE_BUFFER_BYTES waiting each way, a head within MAX_HEAD_BYTES and HEAD_SECONDS, a tunnel
idle both ways for IDLE_SECONDS closed, and per-run state for at most MAX_RUNS runs.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import os
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Collection, Mapping

from . import rules
from .credential import CredentialRefused, Grant, UID_PATTERN, verify
from .files import write_atomically
from .run_logs import Usage

MAX_TUNNELS = 512
MAX_TUNNELS_PER_NAMESPACE = MAX_TUNNELS // 4  # so one tenant's runs cannot hold every tunnel of the pod
MAX_TUNNELS_PER_RUN = 64  # squid's own cap on one client's connections (squid_config.MAX_CONNECTIONS_PER_CLIENT)
MAX_RUNS = 4096
CHUNK_BYTES = 16 * 1024
WRITE_BUFFER_BYTES = 32 * 1024
MAX_HEAD_BYTES = 72 * 1024  # squid's request_header_max_size is 64 KB
HEAD_SECONDS = 10.0
CONNECT_SECONDS = 10.0
IDLE_SECONDS = 300.0
CLOSE_SECONDS = 5.0  # for the last chunk of a cut tunnel to reach the program
WATCH_SECONDS = 0.2
USAGE_SECONDS = 0.25  # how stale the log's count of a run may be
RELAYED_SUFFIX = "relayed"
RELAY_REFUSED = "X-Coderun-Refused"


def relayed_counts(runs_dir: str, uid: str) -> tuple[int, int]:
    """What the relay counted a run's tunnels to have moved, (closed, still open); (0, 0): nothing, or not a uid."""
    if not UID_PATTERN.match(uid):
        return 0, 0
    try:
        with open(os.path.join(runs_dir, f"{uid}.{RELAYED_SUFFIX}"), "rb") as f:
            words = f.read(64).split()
    except OSError:
        return 0, 0
    if not 1 <= len(words) <= 2 or not all(w.isdigit() for w in words):
        return 0, 0
    return int(words[0]), int(words[1]) if len(words) == 2 else 0  # one count: written before open ones were apart


def relayed_bytes(runs_dir: str, uid: str) -> int:
    """Every tunnel byte the relay counted of a run, closed tunnels and open ones."""
    return sum(relayed_counts(runs_dir, uid))


def spent_bytes(logged: Usage, closed: int, open_: int) -> int:
    """A run's bytes, summed: its plain requests as the log counted them, its closed tunnels as the log or the relay
    counted them (the more of the two: the log counts a tunnel when it closes, and a moment later), and its open
    tunnels as the relay counts them (the log has none of those)."""
    return logged.bytes - logged.tunnel_bytes + max(logged.tunnel_bytes, closed) + open_


def with_relayed(usage: Callable[[str], Usage], runs_dir: str) -> Callable[[str], Usage]:
    """A run's usage as the log counted it, its bytes summed with what the relay counted (spent_bytes): the budget
    check's count."""
    def counted(uid: str) -> Usage:
        logged = usage(uid)
        missing = spent_bytes(logged, *relayed_counts(runs_dir, uid)) - logged.bytes
        if missing > 0:
            logged = replace(logged, bytes_received=logged.bytes_received + missing)
        return logged

    return counted


@dataclass
class RunSpend:
    """One run's tunnels at this relay and what they moved."""
    uid: str
    budget: int | None
    expires: int
    policy: str
    namespace: str
    closed: int = 0  # bytes relayed on the run's tunnels that have closed (here, or at a relay before a restart)
    logged: Usage = field(default_factory=Usage)  # the log's latest count, read at most every USAGE_SECONDS
    logged_at: float = float("-inf")
    written: tuple[int, int] = (-1, -1)
    tunnels: set = field(default_factory=set)

    @property
    def open(self) -> int:
        return sum(t.relayed for t in self.tunnels)

    @property
    def relayed(self) -> int:
        return self.closed + self.open

    @property
    def spent(self) -> int:
        return spent_bytes(self.logged, self.closed, self.open)

    @property
    def over(self) -> bool:
        return self.budget is not None and self.spent > self.budget


@dataclass(eq=False)
class Tunnel:
    """One connection squid made to the relay; `run` None for a request that is not a CONNECT (uncounted)."""
    run: RunSpend | None
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    active: float = field(default_factory=time.monotonic)  # when a byte last went through, either way
    relayed: int = 0  # its bytes counted against the run, both ways

    def close(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()


class Relay:
    def __init__(self, upstream: tuple[str, int], keys: Callable[[], Mapping[str, bytes]],
                 revoked: Callable[[], Collection[str]], runs_dir: str, pod: str | None = None,
                 usage: Callable[[str], Usage] = lambda uid: Usage(), clock: Callable[[], float] = time.time):
        self.upstream, self.keys, self.revoked, self.runs_dir, self.pod = upstream, keys, revoked, runs_dir, pod
        self.usage, self.clock = usage, clock
        self.runs: dict[str, RunSpend] = {}
        self.tunnels: set[Tunnel] = set()
        self.by_namespace: dict[str, int] = {}  # open tunnels
        self.loop: asyncio.AbstractEventLoop | None = None
        self._serving: asyncio.Task | None = None
        self.address: tuple[str, int] | None = None  # where it listens, once serving

    # -- the tunnels

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _bounded(writer)
        tunnel = Tunnel(None, writer)
        try:
            head, early = await asyncio.wait_for(_read_head(reader), HEAD_SECONDS)
            refused, tunnel.run = self._admit(head)
            if refused is not None:
                writer.write(refused)
                await asyncio.wait_for(writer.drain(), HEAD_SECONDS)
                return
            self._open(tunnel)
            up_reader, tunnel.upstream = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream, limit=CHUNK_BYTES), CONNECT_SECONDS)
            _bounded(tunnel.upstream)
            tunnel.upstream.write(head + early)
            # The TLS stage's answer (200, or its refusal) is squid's, not the run's traffic: relayed uncounted.
            answer, late = await asyncio.wait_for(_read_head(up_reader), HEAD_SECONDS)
            writer.write(answer)
            if late:
                await self._relay(late, writer, tunnel)
            await _both(self._pipe(reader, tunnel.upstream, tunnel), self._pipe(up_reader, writer, tunnel))
        except (OSError, EOFError, asyncio.TimeoutError, _Cut):
            pass
        finally:
            self._forget(tunnel)
            for side in (writer, tunnel.upstream):
                if side is not None:
                    side.transport.abort()

    def _admit(self, head: bytes) -> tuple[bytes | None, RunSpend | None]:
        """(the refusal to answer, None) or (None, the run the tunnel counts against). A request that is not a
        CONNECT (the readiness check's warm-up, the only other request squid sends its parent) is relayed as it is."""
        if len(self.tunnels) >= MAX_TUNNELS:
            return _refusal(503, "the egress proxy relays as many tunnels as it can: try again later"), None
        lines = head.decode("latin-1").split("\r\n")
        if not lines[0].startswith("CONNECT "):
            return None, None
        user, token = _credentials(lines[1:])
        try:
            grant = verify(token, self.keys(), self.clock(), self.revoked(), user=user, pod=self.pod)
        except CredentialRefused as refused:
            return _refusal(403, str(refused)), None
        if not UID_PATTERN.match(grant.uid):
            return _refusal(403, "the proxy credential's run uid is malformed"), None
        run = self._run(grant)
        self._read_log(run, force=True)
        if run.budget is not None and run.spent >= run.budget:
            return _refusal(403, self._budget_message(run)), None
        if len(run.tunnels) >= MAX_TUNNELS_PER_RUN:
            return _refusal(503, f"run {grant.run} has {MAX_TUNNELS_PER_RUN} tunnels open already"), None
        if self.by_namespace.get(run.namespace, 0) >= MAX_TUNNELS_PER_NAMESPACE:
            return _refusal(503, f"the runs of namespace {run.namespace} have {MAX_TUNNELS_PER_NAMESPACE} tunnels "
                                 "open already on this proxy pod: try again later"), None
        return None, run

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tunnel: Tunnel) -> None:
        while True:
            chunk = await reader.read(CHUNK_BYTES)
            if not chunk:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            await self._relay(chunk, writer, tunnel)

    async def _relay(self, chunk: bytes, writer: asyncio.StreamWriter, tunnel: Tunnel) -> None:
        """One chunk on, counted against the tunnel's run; the run's tunnels cut when it took the run past its
        budget (_Cut)."""
        writer.write(chunk)
        tunnel.active = time.monotonic()
        run = tunnel.run
        if run is not None:
            tunnel.relayed += len(chunk)
            self._read_log(run)
            if run.over:
                await self._cut(run, tunnel, writer)
                raise _Cut()
        await writer.drain()

    async def _cut(self, run: RunSpend, tunnel: Tunnel, last: asyncio.StreamWriter) -> None:
        """Every tunnel of a run past its budget closed: the others at once, this one once the chunk that took the
        run past is delivered (so what squid's log counts of it is over the budget too, as the run's status says)."""
        self._write_relayed(run)
        _say(f"run {run.uid}: {len(run.tunnels)} tunnel(s) cut, {run.spent} bytes past its budget of {run.budget}")
        for other in list(run.tunnels):
            if other is not tunnel:
                other.close()
        for side in (tunnel.client, tunnel.upstream):
            if side is not None and side is not last:
                side.transport.abort()
        last.close()  # what it holds is sent, then FIN
        try:
            await asyncio.wait_for(last.wait_closed(), CLOSE_SECONDS)
        except (OSError, asyncio.TimeoutError):
            pass

    # -- the runs

    def _run(self, grant: Grant) -> RunSpend:
        run = self.runs.get(grant.uid)
        if run is None:
            if len(self.runs) >= MAX_RUNS:
                self._evict()
            # A relay started again: the tunnels its predecessor counted have all closed.
            run = RunSpend(grant.uid, grant.budget.bytes if grant.budget else None, grant.expires, grant.policy,
                           grant.namespace, closed=relayed_bytes(self.runs_dir, grant.uid))
            self.runs[grant.uid] = run
        return run

    def _evict(self) -> None:
        """Forget the runs without an open tunnel, the longest expired first (their counts stay in their files)."""
        idle = sorted((r for r in self.runs.values() if not r.tunnels), key=lambda r: r.expires)
        for run in idle[:max(1, len(self.runs) // 4)]:
            del self.runs[run.uid]

    def _read_log(self, run: RunSpend, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - run.logged_at >= USAGE_SECONDS:
            run.logged, run.logged_at = self.usage(run.uid), now
            self._write_relayed(run)

    def _write_relayed(self, run: RunSpend) -> None:
        counts = (run.closed, run.open)
        if run.written == counts:
            return
        try:  # replaced whole (a rename): the two counts are read together
            write_atomically(os.path.join(self.runs_dir, f"{run.uid}.{RELAYED_SUFFIX}"), "%d %d" % counts)
            run.written = counts
        except OSError as e:
            _say(f"cannot write run {run.uid}'s count: {e}")

    def _budget_message(self, run: RunSpend) -> str:
        verdict = rules.decide_budget(run.policy, run.spent, 0, run.budget, None)
        return verdict.message if verdict else "egress refused: the run has spent its byte budget"

    def _open(self, tunnel: Tunnel) -> None:
        self.tunnels.add(tunnel)
        if tunnel.run is not None:
            tunnel.run.tunnels.add(tunnel)
            self.by_namespace[tunnel.run.namespace] = self.by_namespace.get(tunnel.run.namespace, 0) + 1

    def _forget(self, tunnel: Tunnel) -> None:
        self.tunnels.discard(tunnel)
        if tunnel.run is not None and tunnel in tunnel.run.tunnels:
            tunnel.run.tunnels.discard(tunnel)
            tunnel.run.closed += tunnel.relayed
            namespace = tunnel.run.namespace
            self.by_namespace[namespace] -= 1
            if not self.by_namespace[namespace]:
                del self.by_namespace[namespace]
            self._write_relayed(tunnel.run)

    def close_run(self, uid: str, why: str) -> None:
        """Close every tunnel of a run (its credential revoked or expired)."""
        run = self.runs.get(uid)
        if run is not None and run.tunnels:
            _say(f"run {uid}: {len(run.tunnels)} tunnel(s) closed: {why}")
            for tunnel in list(run.tunnels):
                tunnel.close()

    def revoke(self, uid: str) -> None:
        """From another thread (the admin endpoint's): close the run's tunnels now, not at the next look."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.close_run, uid, "its credential was revoked")

    async def watch(self) -> None:
        """Tunnels of revoked or expired credentials, and tunnels idle both ways, closed; every WATCH_SECONDS."""
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            self.sweep()

    def sweep(self) -> None:
        revoked, now, idle_since = self.revoked(), self.clock(), time.monotonic() - IDLE_SECONDS
        for run in [r for r in self.runs.values() if r.tunnels]:
            if run.uid in revoked:
                self.close_run(run.uid, "its credential was revoked")
            elif now >= run.expires:
                self.close_run(run.uid, "its credential expired")
        for tunnel in [t for t in self.tunnels if t.active < idle_since]:
            tunnel.close()

    async def serve(self, listen: tuple[str, int], started: threading.Event | None = None) -> None:
        self.loop, self._serving = asyncio.get_running_loop(), asyncio.current_task()
        server = await asyncio.start_server(self.handle, *listen, limit=CHUNK_BYTES, backlog=128)
        self.address = server.sockets[0].getsockname()[:2]
        if started is not None:
            started.set()
        async with server:
            await asyncio.gather(server.serve_forever(), self.watch())

    def start(self, listen: tuple[str, int]) -> threading.Thread:
        """Serve in a thread of its own (the admin process's), once listening."""
        started = threading.Event()

        def run() -> None:
            try:
                asyncio.run(self.serve(listen, started))
            except asyncio.CancelledError:
                pass  # stop()

        thread = threading.Thread(target=run, name="coderun-relay", daemon=True)
        thread.start()
        if not started.wait(10):
            raise RuntimeError(f"the tunnel relay did not start listening on {listen}")
        return thread


    def stop(self) -> None:
        """From another thread: stop serving, its tunnels closed (the thread start() returned then ends)."""
        if self.loop is not None and self._serving is not None:
            self.loop.call_soon_threadsafe(self._serving.cancel)


async def _both(*coroutines) -> None:
    """Run the two directions of a tunnel; when one raises (a cut, a reset), the other is cancelled and awaited,
    never left running with an exception nobody retrieves."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _bounded(writer: asyncio.StreamWriter) -> None:
    """What one side of a tunnel may hold: CHUNK_BYTES a read (asyncio's socket transport reads 256 KiB at a time,
    its `max_size`, before the stream's own limit pauses it) and WRITE_BUFFER_BYTES queued to send."""
    writer.transport.set_write_buffer_limits(WRITE_BUFFER_BYTES)
    if hasattr(writer.transport, "max_size"):
        writer.transport.max_size = CHUNK_BYTES


def _say(message: str) -> None:
    print(f"coderun-egress-relay: {message}", file=sys.stderr)


def _header(lines: list[str], name: str) -> str:
    prefix = name.lower() + ":"
    return next((line[len(prefix):].strip() for line in lines if line.lower().startswith(prefix)), "")


def _credentials(lines: list[str]) -> tuple[str, str]:
    value = _header(lines, "Proxy-Authorization")
    scheme, _, encoded = value.partition(" ")
    if scheme.lower() != "basic":
        return "", ""
    try:
        user, _, token = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return "", ""
    return user, token


async def _read_head(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """An HTTP head (through its blank line) and the bytes read past it, within MAX_HEAD_BYTES; EOFError if the
    peer closed first, OSError if the head is longer."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            raise OSError("an HTTP head beyond MAX_HEAD_BYTES")
        chunk = await reader.read(CHUNK_BYTES)
        if not chunk:
            raise EOFError("closed before the end of the HTTP head")
        data += chunk
    end = data.index(b"\r\n\r\n") + 4
    return data[:end], data[end:]


class _Cut(Exception):
    """A tunnel's run went past its budget: its tunnels are cut."""


def _refusal(status: int, message: str) -> bytes:
    phrase = {403: "Forbidden", 503: "Service Unavailable"}[status]
    text = message.replace("\r", " ").replace("\n", " ")[:1000]
    body = f"coderun egress proxy: request refused.\n{text}\n".encode()
    return (f"HTTP/1.1 {status} {phrase}\r\n{RELAY_REFUSED}: {text}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("latin-1", "replace") + body
