"""Each run's own records, kept by the proxy pod until the operator fetches them when the run ends (admin.py).

The log daemon (access_log.py) is the only writer of the records: a record the acl helper attributed to a run (its
`uid` note, set only once the run's credential verified) is added to `<uid>.jsonl`, and the run's usage (requests
and bytes, all of them, kept or not) is written to `<uid>.usage` beside it. The daemon adds a batch of records
(whatever squid handed it at once) and then writes each file the batch touched once (flush): a flood costs a write
per batch, not a rewrite per record, so the daemon keeps up with squid. The acl helper reads the usage to refuse a
run over its byte budget, and counts every request of the run as it is asked in `<uid>.admitted` (admit: exact,
whatever the log's lag), which is also what the admin server waits for the log to reach when a run ends
(wait_logged): a shortfall that does not close in time is stated, never hidden. A run's file is capped
(MAX_RUN_LOG_BYTES, MAX_RUN_RECORDS): past that, records are counted as dropped, never kept; files untouched for
RUN_LOG_TTL_SECONDS are swept (the operator has fetched them, or the run ended long ago).
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import TextIO

from .credential import UID_PATTERN
from .files import write_atomically

RUNS_SUBDIR = "runs"  # under the proxy's state directory
MAX_RUN_LOG_BYTES = 1024 * 1024
MAX_RUN_RECORDS = 10_000
RUN_LOG_TTL_SECONDS = 6 * 3600
SWEEP_EVERY_SECONDS = 60
UNREADABLE = 10 ** 18  # an admitted count that is not one: more than any budget
MAX_OPEN_RUN_FILES = 64  # the daemon keeps the runs' files open between batches, the most recent ones
WAIT_POLL_SECONDS = 0.02


@dataclass
class Usage:
    """What a run spent through this proxy pod, and what of its log this pod kept."""
    requests: int = 0
    bytes_sent: int = 0       # by the program
    bytes_received: int = 0   # by the program
    kept: int = 0
    kept_bytes: int = 0
    dropped: int = 0
    tunnel_bytes: int = 0     # of the above, what CONNECT tunnels moved (the relay counts these while they flow)

    @property
    def bytes(self) -> int:
        return self.bytes_sent + self.bytes_received


def runs_dir(state_dir: str) -> str:
    return os.path.join(state_dir, RUNS_SUBDIR)


class RunLogs:
    def __init__(self, directory: str, max_bytes: int = MAX_RUN_LOG_BYTES, max_records: int = MAX_RUN_RECORDS,
                 ttl_seconds: int = RUN_LOG_TTL_SECONDS):
        self.directory, self.max_bytes, self.max_records, self.ttl = directory, max_bytes, max_records, ttl_seconds
        self._usage: dict[str, Usage] = {}  # the writer's own copy, so adding never reads the file back
        self._pending: dict[str, list[str]] = {}  # records added since the last flush, by run
        self._files: dict[str, TextIO] = {}  # open run files, least recently written first
        self._swept = float("-inf")
        os.makedirs(directory, exist_ok=True)

    def _path(self, uid: str, suffix: str) -> str:
        if not UID_PATTERN.match(uid):
            raise ValueError(f"not a run uid: {uid[:80]!r}")
        return os.path.join(self.directory, f"{uid}.{suffix}")

    def append(self, uid: str, record: dict) -> None:
        """One record, written at once (add, then flush)."""
        self.add(uid, record)
        self.flush()

    def add(self, uid: str, record: dict, line: str | None = None) -> None:
        """The log daemon's side: count the record against the run, and keep it (`line`, its JSON line, when the
        caller has made it already) while the run's file has room; nothing is written until flush()."""
        usage = self._usage.get(uid) or self.usage(uid)
        usage.requests += 1
        usage.bytes_sent += record.get("bytes_sent") or 0
        usage.bytes_received += record.get("bytes_received") or 0
        if record.get("method") == "CONNECT":
            usage.tunnel_bytes += (record.get("bytes_sent") or 0) + (record.get("bytes_received") or 0)
        line = line or json.dumps(record, separators=(",", ":")) + "\n"
        size = len(line.encode())
        if usage.kept < self.max_records and usage.kept_bytes + size <= self.max_bytes:
            self._pending.setdefault(uid, []).append(line)
            usage.kept += 1
            usage.kept_bytes += size
        else:
            self._pending.setdefault(uid, [])
            usage.dropped += 1
        self._usage[uid] = usage

    def flush(self) -> None:
        """Write what add() gathered: each touched run's records in one write, then its usage (after the records,
        so a reader that sees a count finds the records it counts)."""
        pending, self._pending = self._pending, {}
        for uid, lines in pending.items():
            if lines:
                out = self._open(uid)
                out.write("".join(lines))
                out.flush()
            write_atomically(self._path(uid, "usage"), json.dumps(asdict(self._usage[uid])))
        self.sweep(time.time())

    def _open(self, uid: str):
        out = self._files.pop(uid, None)
        if out is None:
            out = open(self._path(uid, "jsonl"), "a", encoding="utf-8")
        self._files[uid] = out  # the most recent last
        while len(self._files) > MAX_OPEN_RUN_FILES:
            self._files.pop(next(iter(self._files))).close()
        return out

    def close(self) -> None:
        self.flush()
        for out in self._files.values():
            out.close()
        self._files.clear()

    def admit(self, uid: str) -> int:
        """The acl helper's count of the run's requests: how many were asked before this one, this one counted too.
        Under a lock every helper process shares, so requests racing each other are counted one by one: the log
        daemon's count comes a moment after a request ends, and a program firing requests back to back would get
        past a request budget checked against it. Every request of a run is counted (it is asked at the policy
        stage, before the names: helpers._over_budget), so the count is what the run's log must reach."""
        fd = os.open(self._path(uid, "admitted"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes
            text = os.read(fd, 32)
            if text and not text.isdigit():
                return UNREADABLE  # not a count this code wrote: over any budget, rather than starting it again
            admitted = int(text or b"0")
            # Written over in place, never emptied first: the count only grows, so its digits never get fewer, and
            # a write that fails (the state volume full) leaves the last count, not nothing.
            os.pwrite(fd, str(admitted + 1).encode(), 0)
            return admitted
        finally:
            os.close(fd)

    def admitted(self, uid: str) -> int:
        """The requests the acl helper counted for the run (admit); UNREADABLE for a file this code did not write."""
        try:
            with open(self._path(uid, "admitted"), "rb") as f:
                text = f.read(32)
        except FileNotFoundError:
            return 0
        return int(text) if text.isdigit() else (0 if not text else UNREADABLE)

    def wait_logged(self, uid: str, seconds: float) -> tuple[int, Usage]:
        """The admitted count and the usage once the log counts every admitted request, or when `seconds` have
        passed (the operator revoked the run's credential first, so the count stops growing): a run's record is
        read complete, or read knowing what it lacks."""
        deadline = time.monotonic() + seconds
        while True:
            admitted, usage = self.admitted(uid), self.usage(uid)
            if usage.requests >= admitted or time.monotonic() >= deadline:
                return admitted, usage
            time.sleep(WAIT_POLL_SECONDS)

    def usage(self, uid: str) -> Usage:
        """A run's usage as the daemon last wrote it (none yet: zero)."""
        try:
            with open(self._path(uid, "usage"), encoding="utf-8") as f:
                return Usage(**{k: int(v) for k, v in json.loads(f.read(4096)).items() if k in Usage.__annotations__})
        except (OSError, ValueError, TypeError):
            return Usage()

    def read(self, uid: str) -> tuple[bytes, Usage]:
        """The run's kept records (JSON lines) and its usage."""
        try:
            with open(self._path(uid, "jsonl"), "rb") as f:
                lines = f.read(self.max_bytes + 1)
        except FileNotFoundError:
            lines = b""
        return lines[:self.max_bytes], self.usage(uid)

    def sweep(self, now: float) -> None:
        """Forget runs whose files nobody wrote for the TTL; looked at once a minute at most."""
        if now - self._swept < SWEEP_EVERY_SECONDS:
            return
        self._swept = now
        with os.scandir(self.directory) as entries:
            for entry in entries:
                try:
                    if now - entry.stat().st_mtime > self.ttl:
                        os.unlink(entry.path)
                        uid = entry.name.rsplit(".", 1)[0]
                        self._usage.pop(uid, None)
                        if uid in self._files:
                            self._files.pop(uid).close()
                except OSError:
                    continue  # gone meanwhile

