"""Each run's own records, kept by the proxy pod until the operator fetches them when the run ends (admin.py).

The log daemon (access_log.py) is the only writer: a record the acl helper attributed to a run (its `uid` note,
set only once the run's credential verified) is appended to `<uid>.jsonl`, and the run's usage (requests and
bytes, all of them, kept or not) is rewritten to `<uid>.usage` beside it. The acl helper reads the usage to refuse
a run over its byte budget, and counts the run's requests as it is asked them in `<uid>.admitted` (admit: a
request budget is held exactly, whatever the log's lag); the admin server reads the records and the usage. A
run's file is capped (MAX_RUN_LOG_BYTES, MAX_RUN_RECORDS): past that, records are counted as dropped, never kept;
files untouched for RUN_LOG_TTL_SECONDS are swept (the
operator has fetched them, or the run ended long ago).
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass

from .credential import UID_PATTERN
from .files import write_atomically

RUNS_SUBDIR = "runs"  # under the proxy's state directory
MAX_RUN_LOG_BYTES = 1024 * 1024
MAX_RUN_RECORDS = 10_000
RUN_LOG_TTL_SECONDS = 6 * 3600
SWEEP_EVERY_SECONDS = 60


@dataclass
class Usage:
    """What a run spent through this proxy pod, and what of its log this pod kept."""
    requests: int = 0
    bytes_sent: int = 0       # by the program
    bytes_received: int = 0   # by the program
    kept: int = 0
    kept_bytes: int = 0
    dropped: int = 0

    @property
    def bytes(self) -> int:
        return self.bytes_sent + self.bytes_received


def runs_dir(state_dir: str) -> str:
    return os.path.join(state_dir, RUNS_SUBDIR)


class RunLogs:
    def __init__(self, directory: str, max_bytes: int = MAX_RUN_LOG_BYTES, max_records: int = MAX_RUN_RECORDS,
                 ttl_seconds: int = RUN_LOG_TTL_SECONDS):
        self.directory, self.max_bytes, self.max_records, self.ttl = directory, max_bytes, max_records, ttl_seconds
        self._usage: dict[str, Usage] = {}  # the writer's own copy, so appending never reads the file back
        self._swept = float("-inf")
        os.makedirs(directory, exist_ok=True)

    def _path(self, uid: str, suffix: str) -> str:
        if not UID_PATTERN.match(uid):
            raise ValueError(f"not a run uid: {uid[:80]!r}")
        return os.path.join(self.directory, f"{uid}.{suffix}")

    def append(self, uid: str, record: dict) -> None:
        """The log daemon's side: count the record against the run, and keep it while the run's file has room."""
        usage = self._usage.get(uid) or self.usage(uid)
        usage.requests += 1
        usage.bytes_sent += record.get("bytes_sent") or 0
        usage.bytes_received += record.get("bytes_received") or 0
        line = json.dumps(record, separators=(",", ":")) + "\n"
        if usage.kept < self.max_records and usage.kept_bytes + len(line.encode()) <= self.max_bytes:
            with open(self._path(uid, "jsonl"), "a", encoding="utf-8") as out:
                out.write(line)
            usage.kept += 1
            usage.kept_bytes += len(line.encode())
        else:
            usage.dropped += 1
        self._usage[uid] = usage
        write_atomically(self._path(uid, "usage"), json.dumps(asdict(usage)))
        self.sweep(time.time())

    def admit(self, uid: str, limit: int) -> int:
        """The acl helper's side of a request budget: how many of the run's requests were admitted before this one,
        counting this one too when that is under `limit`. Under a lock every helper process shares, so requests
        racing each other are counted one by one: the log daemon's count comes a moment after a request ends, and a
        program firing requests back to back would get past a budget checked against it."""
        fd = os.open(self._path(uid, "admitted"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes
            text = os.read(fd, 32)
            if text and not text.isdigit():
                return limit  # not a count this code wrote: refuse rather than start the budget again
            admitted = int(text or b"0")
            if admitted < limit:
                # Written over in place, never emptied first: the count only grows, so its digits never get fewer,
                # and a write that fails (the state volume full) leaves the last count, not nothing.
                os.pwrite(fd, str(admitted + 1).encode(), 0)
            return admitted
        finally:
            os.close(fd)

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
                        self._usage.pop(entry.name.rsplit(".", 1)[0], None)
                except OSError:
                    continue  # gone meanwhile

