"""A run's requests through the egress proxy, as its status and its log keep them. Pure.

When a run ends, the operator asks every ready proxy pod for the run's records and what it counted (proxy.py);
`summarise` turns the answers into status.network, `log_text` into what the run's log ConfigMap keeps, and
`with_network` says what they change about how the run ended: a spent budget ends it EgressBudgetExceeded, a
refused request adds a line to the message (an agent reads the message first).

Records come from the proxy, but their hosts and reasons from what a program sent: shown printable and bounded.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

from coderun.api.models import MAX_NETWORK_HOSTS, EgressBudget
from coderun.api.reasons import Phase, Reason
from coderun.egress.rules import BUDGET_EXCEEDED
from .status import Outcome

MAX_LOG_BYTES = 512 * 1024  # of the log ConfigMap's 1 MiB: JSON lines, cut at a record
MAX_HOST_CHARS = 253
MAX_LISTED_REFUSALS = 3
_REASON = re.compile(r"^[A-Z][A-Za-z]{0,63}$")
# The program's own ends that a spent budget explains better (a refused request makes most programs fail).
_OVERRIDDEN_BY_BUDGET = {Reason.COMPLETED, Reason.NON_ZERO_EXIT}


@dataclass(frozen=True)
class PodAnswer:
    """What one proxy pod said of one run: the records it kept and what it logged (kept or not), and the requests
    its acl helper admitted, counted as they were asked: a log short of them lost records."""
    records: tuple[dict[str, Any], ...] = ()
    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    dropped: int = 0
    admitted: int = 0

    @property
    def logged_all(self) -> bool:
        return self.requests >= self.admitted


def merged(answers: Sequence[PodAnswer]) -> list[dict[str, Any]]:
    """Every pod's records in the order they happened."""
    return sorted((r for a in answers for r in a.records if isinstance(r, dict)), key=lambda r: str(r.get("time")))


def summarise(answers: Sequence[PodAnswer], complete: bool, log_config_map: str | None = None,
              log_truncated: bool = False, proxy_pod: str | None = None) -> dict[str, Any]:
    """status.network: the counts are the pods' own (they count what they could not keep), the destinations
    come from the records they kept; the proxy pod the run was pinned to stays named. `admitted` is what the pods'
    acl helpers counted as the requests were asked, beside `requests`, what their logs counted: complete is false
    when a log fell short of it (records lost before the log daemon wrote them), whatever `complete` says."""
    hosts: dict[tuple[str, int | None], dict[str, Any]] = {}
    allowed = denied = 0
    for record in merged(answers):
        entry = hosts.setdefault(_destination(record), {"allowed": 0, "denied": 0, "reason": None,
                                                          "bytesSent": 0, "bytesReceived": 0})
        if record.get("verdict") == "allowed":
            entry["allowed"] += 1
            allowed += 1
        else:
            entry["denied"] += 1
            denied += 1
            entry["reason"] = _reason(record.get("reason"))
        entry["bytesSent"] += _count(record.get("bytes_sent"))
        entry["bytesReceived"] += _count(record.get("bytes_received"))
    ranked = sorted(hosts.items(), key=lambda kv: (-kv[1]["denied"], -(kv[1]["allowed"] + kv[1]["denied"]), kv[0][0]))
    dropped = sum(a.dropped for a in answers)
    summary = {
        "requests": max(sum(a.requests for a in answers), allowed + denied), "allowed": allowed, "denied": denied,
        "bytesSent": max(sum(a.bytes_sent for a in answers), sum(e["bytesSent"] for e in hosts.values())),
        "bytesReceived": max(sum(a.bytes_received for a in answers), sum(e["bytesReceived"] for e in hosts.values())),
        "hosts": [{"host": host, "port": port, **{k: v for k, v in entry.items() if v is not None}}
                  for (host, port), entry in ranked[:MAX_NETWORK_HOSTS]] or None,
        "hostsOmitted": max(0, len(ranked) - MAX_NETWORK_HOSTS) or None,
        "admitted": sum(a.admitted for a in answers) or None,
        "dropped": dropped or None, "complete": complete and all(a.logged_all for a in answers),
        "logConfigMap": log_config_map,
        "logTruncated": log_truncated or None, "proxyPod": proxy_pod,
    }
    return {k: v for k, v in summary.items() if v is not None}


def log_text(records: Sequence[dict[str, Any]]) -> tuple[str, bool]:
    """The log ConfigMap's JSON lines, the first records that fit MAX_LOG_BYTES; whether any were left out."""
    lines: list[str] = []
    size = 0
    for record in records:
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n"
        size += len(line.encode("utf-8", "surrogatepass"))
        if size > MAX_LOG_BYTES:
            return "".join(lines), True
        lines.append(line)
    return "".join(lines), False


def budget_message(network: dict[str, Any], budget: EgressBudget | None, policy: str) -> str | None:
    """Why the run spent its egress budget, or None: a request the proxy refused for it, or counts beyond it
    (bytes count when a request ends, so the last one allowed may go over a byte budget)."""
    if budget is None:
        return None
    refused = any(h.get("reason") == BUDGET_EXCEEDED for h in network.get("hosts") or ())
    if budget.requests is not None and (network["requests"] > budget.requests or refused):
        spent = f"{network['requests']} requests, its budget being {budget.requests} (spec.egressBudget.requests)"
    elif budget.bytes is not None and (network["bytesSent"] + network["bytesReceived"] > budget.bytes or refused):
        spent = (f"{network['bytesSent'] + network['bytesReceived']} bytes, its budget being {budget.bytes} "
                 "(spec.egressBudget.bytes)")
    else:
        return None
    return (f"the program spent its egress budget under CodeRunPolicy {policy}: {spent}; the egress proxy refused "
            "its further requests. Fetch less, or ask the policy's owners for a larger budget")


def refusal_line(network: dict[str, Any]) -> str | None:
    """One line for the run's message when the proxy refused something: how many, and the first destinations."""
    if not network.get("denied"):
        return None
    refused = [h for h in network.get("hosts") or () if h.get("denied")]
    listed = ", ".join(f"{h['host']}:{h.get('port', '?')} ({h.get('reason') or 'Denied'})"
                       for h in refused[:MAX_LISTED_REFUSALS])
    more = f" and {len(refused) - MAX_LISTED_REFUSALS} more" if len(refused) > MAX_LISTED_REFUSALS else ""
    return (f"the egress proxy refused {network['denied']} request{'s' if network['denied'] != 1 else ''}"
            f"{': ' + listed + more if listed else ''}; see status.network")


def with_network(outcome: Outcome, network: dict[str, Any], budget: EgressBudget | None, policy: str) -> Outcome:
    """The run's outcome with status.network, ended EgressBudgetExceeded when the program spent its budget, and
    a refusal named in the message."""
    fields = {**outcome.fields, "network": network}
    spent = budget_message(network, budget, policy)
    if spent and outcome.reason in _OVERRIDDEN_BY_BUDGET:
        return replace(outcome, phase=Phase.FAILED, reason=Reason.EGRESS_BUDGET_EXCEEDED, message=spent, fields=fields)
    extra = spent or refusal_line(network)
    return replace(outcome, message=f"{outcome.message}; {extra}" if extra else outcome.message, fields=fields)


def _destination(record: dict[str, Any]) -> tuple[str, int | None]:
    host = "".join(c if " " < c < "\x7f" else "?" for c in str(record.get("host") or "(none)")[:MAX_HOST_CHARS])
    port = record.get("port")
    return host, port if isinstance(port, int) and 0 < port < 65536 else None


def _reason(value: Any) -> str:
    return value if isinstance(value, str) and _REASON.match(value) else "Denied"


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value > 0 else 0
