"""A run's egress rules and the proxy's decisions on them: pure functions, no I/O (the helpers resolve names and
read files; the decision is made here).

A rule names a host (`api.github.com`, or `*.example.org`: exactly one label in front of example.org) or a
CIDR, and optionally ports (every port when empty). Through the proxy a run reaches a name a host rule allows
on that port; the name must not resolve into a protected range (ranges.py) unless a CIDR rule of the same run
covers that address and port. CIDR rules are also routes of their own (the run's NetworkPolicy), as before.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Sequence

from .ranges import Network

# A DNS name of two labels or more, lowercase, no trailing dot; the last label starts with a letter, which
# keeps IPv4 literals out (IPv6 ones have no place in it at all). A host rule may put `*.` in front of one.
NAME_PATTERN = r"([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]([a-z0-9-]{0,61}[a-z0-9])?"
HOST_PATTERN = rf"^(\*\.)?{NAME_PATTERN}$"
MAX_NAME_LENGTH = 253
_NAME = re.compile(rf"^{NAME_PATTERN}$")
_HOST = re.compile(HOST_PATTERN)


@dataclass(frozen=True)
class Rule:
    """One egress rule as the proxy applies it: exactly one of host and cidr; no ports means every port."""
    host: str | None = None
    cidr: str | None = None
    ports: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if (self.host is None) == (self.cidr is None):
            raise ValueError("a rule has exactly one of host and cidr")
        if self.host is not None and not valid_host_rule(self.host):
            raise ValueError(f"not a host rule: {self.host!r}")
        if self.cidr is not None:
            ipaddress.ip_network(self.cidr, strict=False)  # ValueError if it is not one
        if any(not (isinstance(p, int) and 1 <= p <= 65535) for p in self.ports):
            raise ValueError(f"ports must be 1-65535: {self.ports!r}")

    def allows_port(self, port: int) -> bool:
        return not self.ports or port in self.ports

    def label(self, index: int) -> str:
        """How logs and messages name it: its place in the policy's spec.egress and what it says."""
        ports = ",".join(map(str, self.ports)) if self.ports else "*"
        return f"egress[{index}] {self.host or self.cidr}:{ports}"


def valid_host_rule(host: str) -> bool:
    return len(host) <= MAX_NAME_LENGTH and bool(_HOST.match(host))


def canonical_name(raw: str) -> str | None:
    """The name a request asks for, as rules are written (lowercase, no trailing dot); None when it is not a
    DNS name (an IP literal, garbage): the proxy connects to names only."""
    name = raw.strip().lower()
    if name.endswith("."):
        name = name[:-1]
    if len(name) > MAX_NAME_LENGTH or not _NAME.match(name):
        return None
    return name


def host_matches(rule_host: str, name: str) -> bool:
    """`*.example.org` matches `a.example.org`, not `example.org` nor `a.b.example.org`; anything else exactly."""
    if rule_host.startswith("*."):
        head, dot, tail = name.partition(".")
        return bool(head) and dot == "." and tail == rule_host[2:]
    return name == rule_host


@dataclass(frozen=True)
class Verdict:
    """What the proxy answers one request. `reason` is a CamelCase word the log and the run's status carry;
    `message` says what happened and what to change, for the program (and the agent behind it) to act on."""
    allowed: bool
    reason: str
    message: str
    rule: str | None = None
    # Allowed although the name resolves into a protected range (a CIDR rule covers it): squid's own check of
    # the resolved address (`dst`) must then let it pass.
    via_cidr: bool = False


ALLOWED = "Allowed"
NOT_A_NAME = "NotAName"
NOT_ALLOWED = "NotAllowed"
UNRESOLVED = "Unresolved"
PROTECTED_ADDRESS = "ProtectedAddress"
SNI_MISMATCH = "SNIMismatch"
BUDGET_EXCEEDED = "BudgetExceeded"
MAX_LISTED = 8  # rules named in a refusal: enough to act on, bounded whatever the policy holds


def decide_name(rules: Sequence[Rule], policy: str, raw_host: str, port: int) -> Verdict:
    """The first step, before any lookup: does a host rule allow this name on this port?"""
    name = canonical_name(raw_host)
    if name is None:
        return Verdict(False, NOT_A_NAME, f"egress to {_shown(raw_host)}:{port} refused: the egress proxy connects "
                       f"to names only (CodeRunPolicy {policy} lists the names a run may reach)")
    for index, rule in enumerate(rules):
        if rule.host is not None and host_matches(rule.host, name) and rule.allows_port(port):
            return Verdict(True, ALLOWED, f"{name}:{port} allowed by CodeRunPolicy {policy}", rule.label(index))
    hosts = [f"{r.host}:{','.join(map(str, r.ports)) or '*'}" for r in rules if r.host is not None]
    listed = ", ".join(hosts[:MAX_LISTED]) + (f" and {len(hosts) - MAX_LISTED} more" if len(hosts) > MAX_LISTED else "")
    return Verdict(False, NOT_ALLOWED, f"egress to {name}:{port} is not allowed by CodeRunPolicy {policy}; it allows "
                   f"{listed or 'no names'}")


def decide_addresses(rules: Sequence[Rule], policy: str, name: str, port: int, allowed: Verdict,
                     addresses: Sequence[str], protected: Sequence[tuple[str, Network]]) -> Verdict:
    """The second step, on the addresses the name resolved to: every one inside a protected range must be covered
    by a CIDR rule of the run allowing the port, else the request is refused (DNS rebinding, a public name
    pointing at the API server, the metadata address)."""
    if not addresses:
        return Verdict(False, UNRESOLVED, f"egress to {name}:{port} refused: the name does not resolve")
    via_cidr = False
    for text in addresses:
        address = ipaddress.ip_address(text)
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1 on the wire
        inside = next(((what, net) for what, net in protected if address.version == net.version and address in net),
                      None)
        if inside is None:
            continue
        if not any(r.cidr is not None and r.allows_port(port) and _contains(r.cidr, address) for r in rules):
            what, net = inside
            return Verdict(False, PROTECTED_ADDRESS, f"egress to {name}:{port} refused: it resolves to {address}, "
                           f"inside {net} ({what}); CodeRunPolicy {policy} would need a CIDR rule covering it")
        via_cidr = True
    return Verdict(True, ALLOWED, allowed.message, allowed.rule, via_cidr)


def decide_budget(policy: str, spent_bytes: int, spent_requests: int, max_bytes: int | None,
                  max_requests: int | None) -> Verdict | None:
    """A run that has spent its egress budget is refused every further request (None: within budget). What a
    request moves is known when it ends, so the last request allowed may go over a byte budget by its own size;
    requests are counted as they are asked (helpers._over_budget)."""
    if max_requests is not None and spent_requests >= max_requests:
        return Verdict(False, BUDGET_EXCEEDED, f"egress refused: the run has made {spent_requests} requests, its "
                       f"budget under CodeRunPolicy {policy} (spec.egressBudget.requests: {max_requests})")
    if max_bytes is not None and spent_bytes >= max_bytes:
        return Verdict(False, BUDGET_EXCEEDED, f"egress refused: the run has moved {spent_bytes} bytes, its budget "
                       f"under CodeRunPolicy {policy} (spec.egressBudget.bytes: {max_bytes})")
    return None


def decide_sni(connect_host: str, sni: str) -> Verdict:
    """A TLS tunnel's ClientHello must name the host the CONNECT asked for (domain fronting sends an allowed name
    to the proxy and another inside TLS)."""
    asked, named = canonical_name(connect_host), canonical_name(sni)
    if asked is not None and asked == named:
        return Verdict(True, ALLOWED, f"TLS server name {asked} is the CONNECT host")
    return Verdict(False, SNI_MISMATCH, f"TLS server name {_shown(sni)} is not the CONNECT host "
                   f"{_shown(connect_host)}: the tunnel was closed")


def _contains(cidr: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    network = ipaddress.ip_network(cidr, strict=False)
    return network.version == address.version and address in network


def _shown(untrusted: str, limit: int = 80) -> str:
    """Text the client sent, as a message may quote it: printable ASCII, bounded."""
    cleaned = "".join(c if " " < c < "\x7f" else "?" for c in untrusted[:limit])
    return (cleaned or "(none)") + ("..." if len(untrusted) > limit else "")
