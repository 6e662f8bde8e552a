"""The status must fit etcd, whatever the program printed and however large the caller made the spec. Pure.

etcd refuses an object over its request limit (1.5 MiB by default); the API server answers 413 or 422 and a
controller that retries the same status is stuck forever. So the status is sized against what is left of the
object after the spec, trimmed by its JSON-escaped size (a control character costs six bytes, not one), and
when the API server still refuses a write, `smaller_statuses` gives ever smaller ones down to a minimal status
that always fits: the run still ends, with a message saying what was dropped.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Iterator, Mapping

ETCD_OBJECT_LIMIT_BYTES = 1536 * 1024
# Metadata the API server adds (managedFields, resourceVersion) and labels we add later.
OBJECT_HEADROOM_BYTES = 64 * 1024
STATUS_BUDGET_BYTES = 900 * 1024
MIN_STATUS_BUDGET_BYTES = 16 * 1024
REDUCED_STREAM_BYTES = 4096
_STREAMS = ("stdout", "stderr")


def json_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def status_budget(run: Mapping[str, Any]) -> int:
    """Bytes the status may take: the default budget, or less when the spec already fills the object."""
    rest = json_size({k: v for k, v in run.items() if k != "status"})
    room = ETCD_OBJECT_LIMIT_BYTES - OBJECT_HEADROOM_BYTES - rest
    return max(MIN_STATUS_BUDGET_BYTES, min(STATUS_BUDGET_BYTES, room))


def escaped_prefix(text: str, max_bytes: int) -> str:
    """The longest head of text whose JSON-escaped form takes at most max_bytes."""
    if json_size(text) <= max_bytes:
        return text
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if json_size(text[:middle]) <= max_bytes:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def fit(status: dict[str, Any], budget: int) -> dict[str, Any]:
    """Trim stdout and stderr (marking them truncated), each in proportion to its escaped size, until the
    status fits; then the lists that can grow with the program's doing."""
    excess = json_size(status) - budget
    if excess <= 0:
        return status
    status = copy.deepcopy(status)
    sizes = {f: json_size(status.get(f) or "") for f in _STREAMS}
    total = sum(sizes.values())
    for field in _STREAMS:
        if sizes[field] <= 2:
            continue
        share = excess * sizes[field] // total + 64
        status[field] = escaped_prefix(status[field], max(0, sizes[field] - share))
        status[f"{field}Truncated"] = True
    if json_size(status) > budget:
        _cut_streams(status, REDUCED_STREAM_BYTES)
        _cut_lists(status, 8)
    return status


def _cut_streams(status: dict[str, Any], max_bytes: int) -> None:
    for field in _STREAMS:
        if status.get(field) and json_size(status[field]) > max_bytes:
            status[field] = escaped_prefix(status[field], max_bytes)
            status[f"{field}Truncated"] = True


def _cut_lists(status: dict[str, Any], keep: int) -> None:
    if status.get("validation"):
        errors = status["validation"].get("errors") or []
        status["validation"] = {**status["validation"], "errors": [e[:300] for e in errors[:keep]]}
    if status.get("artifactsSkipped"):
        status["artifactsSkipped"] = status["artifactsSkipped"][:keep]
    if status.get("error"):
        status["error"] = {**status["error"], "message": status["error"].get("message", "")[:1024]}
    if status.get("audit"):  # its lists as the bound leaves them; what goes is counted in its omitted
        audit = status["audit"] = dict(status["audit"])
        omitted = dict(audit.get("omitted") or {})
        for name in ("filesRead", "filesWritten", "connectAttempts", "socketsOpened", "processes"):
            if len(audit.get(name) or ()) > keep:
                omitted[name] = omitted.get(name, 0) + len(audit[name]) - keep
                audit[name] = audit[name][:keep]
        if omitted:
            audit["omitted"] = omitted
    for condition in status.get("conditions") or ():
        condition["message"] = condition.get("message", "")[:512]


# Fields a minimal status keeps: enough to know how the run ended and why.
_MINIMAL = ("phase", "reason", "message", "exitCode", "signal", "completionTime", "observedGeneration",
            "conditions", "codeHash", "image", "policy", "policyRule", "podName", "startTime")


def smaller_statuses(status: dict[str, Any], budget: int, refusals: list[str]) -> Iterator[dict[str, Any]]:
    """The status to write, then smaller ones to try if the API server refuses each in turn. The caller
    appends each refusal to `refusals` (read lazily) so the minimal status can say why it is minimal."""
    yield fit(status, budget)
    reduced = fit(status, min(budget, 64 * 1024))
    _cut_streams(reduced, REDUCED_STREAM_BYTES)
    _cut_lists(reduced, 3)
    yield reduced
    minimal = {k: copy.deepcopy(status[k]) for k in _MINIMAL if k in status}
    note = f" (the full result was refused by the API server and dropped: {(refusals or ['?'])[-1][:300]})"
    minimal["message"] = (str(status.get("message") or ""))[:1024] + note
    _cut_lists(minimal, 0)
    # Every other field is cleared, so nothing half-written from an earlier write survives the merge patch.
    yield {**{k: None for k in status if k not in minimal}, **minimal}
