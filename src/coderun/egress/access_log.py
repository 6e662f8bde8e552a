"""One JSON line per request, per run: squid writes its access log through this daemon (logfile_daemon), which
turns squid's lines into records with the run, the destination, the verdict and the rule that decided it, the
bytes each way and the duration.

An HTTPS request passes both of squid's stages (squid_config.py) and so gets two lines: the policy stage's (the
tunnel as the run saw it: its address, bytes, duration, the rule) and, earlier, the TLS stage's decision on the
ClientHello (SNI; splice or terminate). Records pairs them by the policy stage's transaction id, which the TLS
stage received in a header, and writes one record; the TLS stage's own tunnel line is dropped.

squid_config.FIELDS is the one definition of the line: squid's logformat is rendered from it and parse() reads
the line back by it. Every field a client can influence is URL-encoded by squid (`%#`), so a field never holds
a space and the split is exact whatever the request said.

The daemon protocol (squid's log_file_daemon): `L<line>` to log, `R` rotate, `T` truncate, `O` reopen, `F`
flush, `r<n>` rotation count, `b<0|1>` buffering; the log's path is argv[1].
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from collections import OrderedDict
from datetime import datetime, timezone
from typing import BinaryIO, Iterator, Sequence
from urllib.parse import unquote

from .credential import BAD_CREDENTIAL, UID_PATTERN
from .rules import ALLOWED, SNI_MISMATCH
from .run_logs import RunLogs, runs_dir
from .squid_config import FIELDS, WARMUP_HOST

INTERNAL = ("stage", "xid", "pair", "hierarchy")  # for pairing lines; not part of a record
INTEGERS = {"duration_ms", "port", "status", "bytes_sent", "bytes_received", "xid"}
MAX_LINE = 64 * 1024
MAX_PROXY_LOG_BYTES = 32 * 1024 * 1024
READ_BYTES = 256 * 1024  # of squid's lines at most, per batch


def parse(line: str) -> dict | None:
    """Squid's line as named values, or None if the line is not one of ours."""
    values = line.rstrip("\n").split(" ")
    if len(values) != len(FIELDS):
        return None
    out: dict = {}
    for (key, _), value in zip(FIELDS, values):
        text = None if value in ("-", "") else unquote(value, errors="replace") if "%" in value else value
        if key in INTEGERS:
            out[key] = int(text) if text is not None and text.isdigit() and len(text) < 16 else None
        else:
            out[key] = text
    return out


class Records:
    """Squid's lines in, one record per request out (feed returns it, or None while a line waits for its pair or
    is not a request of a run's)."""

    def __init__(self, max_waiting: int = 10000):
        self._decisions: OrderedDict[str, dict] = OrderedDict()  # TLS stage decisions by policy-stage xid
        self._max_waiting = max_waiting

    def feed(self, line: dict | None) -> dict | None:
        if line is None or line["method"] is None or line["host"] == WARMUP_HOST:
            return None  # a probe connection, a warm-up, garbage
        if line["stage"] == "tls":
            if line["squid_status"] == "NONE_NONE" and line["tls"] in ("splice", "terminate") and line["pair"]:
                self._decisions[line["pair"]] = line
                while len(self._decisions) > self._max_waiting:
                    self._decisions.popitem(last=False)
            return None  # its tunnel line: the policy stage's line has the same tunnel, as the run saw it
        if "PARENT" in (line["hierarchy"] or ""):  # a CONNECT the TLS stage decided
            decision = self._decisions.pop(str(line["xid"]), None)
            if decision is not None:
                # The TLS stage connected, not this one: `server` here would be the TLS stage itself.
                line = {**line, "sni": decision["sni"], "tls": decision["tls"], "server": None}
                if decision["tls"] == "terminate":
                    line.update(reason=decision["reason"] or SNI_MISMATCH, message=decision["message"])
        return _record(line)


def _record(line: dict) -> dict:
    out = {k: v for k, v in line.items() if k not in INTERNAL}
    try:
        out["time"] = datetime.fromtimestamp(float(line["time"] or ""), timezone.utc).isoformat(
            timespec="milliseconds")
    except ValueError:
        out["time"] = None
    if out["method"] == "CONNECT" or not out["path"]:
        out["path"] = None
    else:
        out["path"] = out["path"].split("?", 1)[0]  # a query may carry secrets; the path says where
    out["verdict"], out["reason"] = _verdict(out)
    if out["verdict"] == "allowed":
        out["message"] = None  # the rule says it; a message is there to say what to change
    return out


def _verdict(entry: dict) -> tuple[str, str | None]:
    """Allowed or denied, and why: the helpers' reason when one refused; squid's status when squid did (407: no
    valid credential), a TLS tunnel closed at its handshake (the SNI check)."""
    reason = entry["reason"]
    if entry["tls"] == "terminate":
        return "denied", reason or SNI_MISMATCH
    if reason and reason != ALLOWED:
        return "denied", reason
    if entry["status"] == 407:
        return "denied", BAD_CREDENTIAL
    if (entry["squid_status"] or "").startswith("TCP_DENIED"):
        return "denied", "Denied"
    return "allowed", ALLOWED


class ProxyLog:
    """The pod's own log of every request (runs' and unattributed ones alike, e.g. a bad credential's), kept in
    two files of at most `max_bytes`: the emptyDir it lives in must not fill up however long the pod runs."""

    def __init__(self, path: str, max_bytes: int = MAX_PROXY_LOG_BYTES):
        self.path, self.max_bytes = path, max_bytes
        self._out = open(path, "a", encoding="utf-8")

    def write(self, text: str) -> None:
        """Whole lines, in one write (a batch's); flush() makes them visible."""
        if self._out.tell() + len(text) > self.max_bytes:
            self._out.close()
            os.replace(self.path, f"{self.path}.1")
            self._out = open(self.path, "a", encoding="utf-8")
        self._out.write(text)

    def flush(self) -> None:
        self._out.flush()

    def reopen(self) -> None:
        self._out.close()
        self._out = open(self.path, "a", encoding="utf-8")

    def close(self) -> None:
        self._out.close()


def batches(source: BinaryIO, chunk: int = READ_BYTES) -> Iterator[list[bytes]]:
    """Squid's lines as they come, in batches: every whole line one read brought (a flood arrives in large reads,
    a quiet proxy's line alone). A line longer than MAX_LINE is skipped (no line of ours is that long), so what is
    held in memory is bounded by `chunk` and MAX_LINE."""
    rest, skipping = b"", False
    while True:
        data = source.read1(chunk)  # what is there (one read of the pipe), waiting only when nothing is
        if not data:
            return
        lines = (rest + data).split(b"\n")
        rest = lines.pop()
        if skipping and lines:
            lines.pop(0)  # the end of the overlong line
            skipping = False
        if len(rest) > MAX_LINE:
            rest, skipping = b"", True
        lines = [line for line in lines if len(line) <= MAX_LINE]
        if lines:
            yield lines


def serve(log_path: str, stdin: BinaryIO | None = None) -> None:
    """Squid's logfile daemon: a JSON record per `L` line to the proxy's log and, for a run's request, to that run's
    own (run_logs.py: beside the log, under runs/). Each batch of lines squid handed over is written (and flushed:
    the logs are read while runs are going on) once it is read, every file once a batch: the daemon must keep up
    with squid, which drops the lines it cannot hand over (its queue to the daemon is bounded), and what a run's
    file counts is what the operator waits for at the run's end. R/T/O only reopen the proxy's log: it rotates
    itself."""
    source = stdin or sys.stdin.buffer
    records = Records()
    out = ProxyLog(log_path)
    runs = RunLogs(runs_dir(os.path.dirname(os.path.abspath(log_path))))
    try:
        for lines in batches(source):
            written = []
            for raw in lines:
                command, text = raw[:1], raw[1:].decode("utf-8", errors="replace")
                if command == b"L":
                    try:
                        entry = records.feed(parse(text))
                        if entry is not None:
                            line = json.dumps(entry, separators=(",", ":")) + "\n"
                            written.append(line)
                            if entry["uid"] and UID_PATTERN.match(entry["uid"]):
                                runs.add(entry["uid"], entry, line)
                    except Exception:  # noqa: BLE001 - squid stops when its log daemon dies: skip the line instead
                        traceback.print_exc(limit=4, file=sys.stderr)
                elif command in (b"R", b"O", b"T"):
                    out.write("".join(written))
                    written = []
                    out.reopen()
            out.write("".join(written))
            out.flush()
            runs.flush()
    finally:
        runs.close()
        out.close()


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit("usage: coderun-egress-log LOGFILE  (started by squid as its logfile_daemon)")
    serve(args[0])


if __name__ == "__main__":
    main()
