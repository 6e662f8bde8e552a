"""A run's status.audit and its record, from what the node's audit agent answered (docs/audit.md). Pure.

The agent's answer is data from outside the operator (a pod on the node, whatever ran there before): the
summary keeps only the fields the API declares, each of its type, every list and string bounded, and every
path, argument and address through the policy's redaction, as stdout is. The record (one trace point a line)
goes to a ConfigMap owned by the run, redacted the same way and cut at the ConfigMap's limit. Anything that
cannot be read is an Unavailable audit with a message, never an empty summary that reads as "nothing happened".
"""
from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any, Callable

from coderun.api.models import (MAX_AUDIT_ARG_CHARS, MAX_AUDIT_ARGV, MAX_AUDIT_CONNECTS, MAX_AUDIT_EXAMPLES,
                                MAX_AUDIT_FILES, MAX_AUDIT_MESSAGE_CHARS, MAX_AUDIT_PATH_CHARS, MAX_AUDIT_PROCESSES,
                                MAX_AUDIT_SOCKETS)
from coderun.api.text import one_line
from ..policy.redact import Redactor
from .budget import json_size
from .status import Outcome

SOURCE = "gvisor-trace"
UNAVAILABLE = "Unavailable"
# status.audit as a whole, JSON: the bounded lists make at most a few hundred KiB (50 processes of 16 arguments),
# more than a status should carry beside the streams; past this the longest lists are cut, their tails counted.
MAX_AUDIT_BYTES = 48 * 1024
# The record ConfigMap's data (of its 1 MiB): JSON lines, cut at a line, the lines left out counted.
MAX_RECORD_BYTES = 800 * 1024
MAX_COUNT = 2 ** 53
_WORD = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
_SIGNAL = re.compile(r"^(SIG[A-Z0-9+]{1,12}|[0-9]{1,3})$")
_LISTS = {"filesRead": MAX_AUDIT_FILES, "filesWritten": MAX_AUDIT_FILES, "connectAttempts": MAX_AUDIT_CONNECTS,
          "socketsOpened": MAX_AUDIT_SOCKETS, "processes": MAX_AUDIT_PROCESSES}
_COUNTS = ("processes", "failedExecs", "connectAttempts", "syscallsDenied", "openat2", "addressedSends",
           "pointsLost", "pointsUnknown")
_OMITTED = (*_LISTS, "outsideWorkdirExamples")


def unavailable(message: str) -> dict[str, Any]:
    """status.audit when nothing can be said of what the program touched, and why (what to check)."""
    return {"source": UNAVAILABLE, "message": one_line(message)[:MAX_AUDIT_MESSAGE_CHARS]}


def audit_status(summary: Any, redactor: Redactor) -> tuple[dict[str, Any], int]:
    """status.audit from the agent's summary (RunAudit.summary()'s shape), bounded and redacted; how many
    secrets went. A summary without the agent's counts (no trace of the container) is Unavailable."""
    if not isinstance(summary, dict) or summary.get("source") != SOURCE or not isinstance(summary.get("counts"), dict):
        why = summary.get("message") if isinstance(summary, dict) and isinstance(summary.get("message"), str) else None
        return unavailable(f"the audit agent's answer holds no summary of the run"
                           f"{': ' + why[:300] if why else ''}; check the agent's log on the run's node"), 0
    clean = _Cleaner(redactor)
    omitted = {k: _count(v) for k, v in _dict(summary.get("omitted")).items() if k in _OMITTED and _count(v)}

    def listed(name: str, row: Callable[[dict[str, Any]], dict[str, Any] | None]) -> list[dict[str, Any]]:
        items = _list(summary.get(name))
        rows = [r for r in (row(i) for i in items[:_LISTS[name]] if isinstance(i, dict)) if r is not None]
        if len(items) > _LISTS[name]:
            omitted[name] = omitted.get(name, 0) + len(items) - _LISTS[name]
        return rows

    outside = _dict(summary.get("outsideWorkdir"))
    examples = [e for e in _list(outside.get("examples")) if isinstance(e, str)]
    if len(examples) > MAX_AUDIT_EXAMPLES:
        omitted["outsideWorkdirExamples"] = omitted.get("outsideWorkdirExamples", 0) + len(examples) - MAX_AUDIT_EXAMPLES
    runner = _dict(summary.get("runner"))
    audit = {
        "source": SOURCE,
        "complete": summary.get("complete") is True,
        "filesRead": listed("filesRead", clean.file),
        "filesWritten": listed("filesWritten", clean.file),
        "outsideWorkdir": {**{k: _count(outside.get(k)) for k in ("reads", "writes", "denied")},
                           "examples": [clean.text(e, MAX_AUDIT_PATH_CHARS) for e in examples[:MAX_AUDIT_EXAMPLES]]},
        "connectAttempts": listed("connectAttempts", clean.connect),
        "socketsOpened": listed("socketsOpened", clean.socket),
        "processes": listed("processes", clean.process),
        "counts": {k: _count(summary["counts"].get(k)) for k in _COUNTS},
        "runner": {k: _count(runner.get(k)) for k in ("filesRead", "filesWritten", "processes")},
    }
    if isinstance(summary.get("message"), str) and summary["message"]:
        audit["message"] = clean.text(summary["message"], MAX_AUDIT_MESSAGE_CHARS)
    _fit(audit, omitted)
    if omitted:
        audit["omitted"] = omitted
    return audit, clean.redactions


def with_record(audit: dict[str, Any], config_map: str | None, cut: int) -> dict[str, Any]:
    """status.audit naming the record's ConfigMap (when it was stored) and what the record left out."""
    return {**audit, **({"recordConfigMap": config_map} if config_map else {}), **({"recordCut": cut} if cut else {})}


def record_text(record: Any, redactor: Redactor) -> tuple[str, int]:
    """The record ConfigMap's JSON lines: every string of every point redacted (a line that is not JSON is
    redacted as text), then the first lines that fit MAX_RECORD_BYTES; how many lines were left out."""
    if not isinstance(record, str):
        return "", 0
    lines, size, cut = [], 0, 0
    clean = _Cleaner(redactor)
    for raw in record.splitlines():
        if not raw.strip():
            continue
        if size > MAX_RECORD_BYTES:
            cut += 1
            continue
        try:
            line = json.dumps(clean.strings(json.loads(raw)), separators=(",", ":"), ensure_ascii=False)
        except ValueError:
            line = clean.redactor.redact(raw)[0]
        size += len(line.encode("utf-8", "surrogatepass")) + 1
        if size > MAX_RECORD_BYTES:
            cut += 1
            continue
        lines.append(line + "\n")
    return "".join(lines), cut


def with_audit(outcome: Outcome, audit: dict[str, Any], redactions: int = 0) -> Outcome:
    """The run's outcome with status.audit; secrets redacted from it counted with the others."""
    fields = {**outcome.fields, "audit": audit}
    if redactions:
        fields["redactions"] = (fields.get("redactions") or 0) + redactions
    return replace(outcome, fields=fields)


class _Cleaner:
    """Each string shown safely (controls escaped), redacted, then cut; the redactions counted."""

    def __init__(self, redactor: Redactor):
        self.redactor, self.redactions = redactor, 0

    def text(self, value: Any, limit: int) -> str:
        text, n = self.redactor.redact(one_line(value if isinstance(value, str) else str(value)))
        self.redactions += n
        return text if len(text) <= limit else text[:limit - 1] + "…"

    def strings(self, value: Any) -> Any:
        """A decoded JSON value with every string in it (keys apart) redacted."""
        if isinstance(value, str):
            text, n = self.redactor.redact(value)
            self.redactions += n
            return text
        if isinstance(value, list):
            return [self.strings(v) for v in value]
        if isinstance(value, dict):
            return {k: self.strings(v) for k, v in value.items()}
        return value

    def file(self, row: dict[str, Any]) -> dict[str, Any] | None:
        if not isinstance(row.get("path"), str):
            return None
        out = {"path": self.text(row["path"], MAX_AUDIT_PATH_CHARS), "count": _count(row.get("count"))}
        out.update({k: _count(row.get(k)) for k in ("failed", "denied", "bytes") if _count(row.get(k))})
        return out

    def connect(self, row: dict[str, Any]) -> dict[str, Any] | None:
        port = row.get("port")
        out = {"family": _word(row.get("family")), "address": self.text(row.get("address") or "", MAX_AUDIT_PATH_CHARS),
               "result": _word(row.get("result")), "count": _count(row.get("count"))}
        if isinstance(port, int) and not isinstance(port, bool) and 0 <= port <= 65535:
            out["port"] = port
        return out

    def socket(self, row: dict[str, Any]) -> dict[str, Any] | None:
        return {"family": _word(row.get("family")), "protocol": _word(row.get("protocol")),
                "result": _word(row.get("result")), "count": _count(row.get("count"))}

    def process(self, row: dict[str, Any]) -> dict[str, Any] | None:
        argv = _list(row.get("argv"))
        out: dict[str, Any] = {"argv": [self.text(a, MAX_AUDIT_ARG_CHARS) for a in argv[:MAX_AUDIT_ARGV]
                                        if isinstance(a, str)]}
        left_out = _count(row.get("argvOmitted")) + max(0, len(argv) - MAX_AUDIT_ARGV)
        if left_out:
            out["argvOmitted"] = left_out
        if row.get("fromMemfd") is True:
            out["fromMemfd"] = True
        if row.get("startedBeforeRun") is True:
            out["startedBeforeRun"] = True
        code = row.get("exitCode")
        if isinstance(code, int) and not isinstance(code, bool) and -256 < code < 256:
            out["exitCode"] = code
        if isinstance(row.get("signal"), str) and _SIGNAL.match(row["signal"]):
            out["signal"] = row["signal"]
        return out


def _fit(audit: dict[str, Any], omitted: dict[str, int]) -> None:
    """Cut the largest list in half, its tail counted in `omitted`, until status.audit fits MAX_AUDIT_BYTES."""
    while json_size(audit) > MAX_AUDIT_BYTES:
        name = max(_LISTS, key=lambda n: json_size(audit[n]))
        if not audit[name]:
            return
        keep = len(audit[name]) // 2
        omitted[name] = omitted.get(name, 0) + len(audit[name]) - keep
        audit[name] = audit[name][:keep]


def _dict(value: Any) -> dict[str, Any]:
    """The agent's object, or an empty one where it sent something else (its answer is read, never trusted)."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _count(value: Any) -> int:
    return min(value, MAX_COUNT) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _word(value: Any) -> str:
    return value if isinstance(value, str) and _WORD.match(value) else "other"
