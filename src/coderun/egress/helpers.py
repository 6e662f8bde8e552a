"""The programs squid starts in the proxy: `auth` (is this a run's valid token?) and `acl` (may this run reach
this name and port, and what does the name resolve to? does the TLS ClientHello name the CONNECT host?). Each
answers squid's lines (squid_helper.py); the decisions are rules.py's and credential.py's.

    coderun-egress-auth --keys DIR --revocations FILE
    coderun-egress-acl  --keys DIR --revocations FILE --hosts-file FILE

`acl` needs the cluster's ranges in its environment (CODERUN_POD_CIDRS, ...: ranges.py), as squid's own
`dst` check of the resolved address has them in squid.conf (squid_config.py renders both from one list).
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
import time
from typing import Callable, Collection, Mapping, Sequence

from . import rules
from .credential import CredentialRefused, Grant, verify
from .files import keys_in, revocations_in
from .ranges import Network, protected_networks
from .run_logs import RunLogs, Usage
from .squid_helper import reply, serve

Resolve = Callable[[str, int], Sequence[str]]


def answer_auth(words: Sequence[str], keys: Mapping[str, bytes], revoked: Collection[str], now: float,
                pod: str | None = None) -> str:
    """auth_param basic: `<user> <password>`; the password is the token, the user its run's uid. The answer carries
    no annotations: squid keeps an auth answer's with the user name and copies them into that user's later
    requests, so a refusal's would stick to the next good one (the acl helper annotates each request instead)."""
    if len(words) != 2:
        return reply(False)
    user, token = words
    try:
        verify(token, keys, now, revoked, user=user, pod=pod)
    except CredentialRefused:
        return reply(False)
    return reply(True)


def _over_budget(grant: Grant, usage: Callable[[str], Usage],
                 admit: Callable[[str, int], int]) -> rules.Verdict | None:
    """The bytes as the log counted them (what a request moves is known when it ends), then the request counted
    as it is asked (squid asks this at the policy stage only, before the names: every request of the run's
    counts, allowed or refused, as its status counts them)."""
    budget = grant.budget
    if budget is None:
        return None
    over = rules.decide_budget(grant.policy, usage(grant.uid).bytes, 0, budget.bytes, None)
    if over is None and budget.requests is not None:
        over = rules.decide_budget(grant.policy, 0, admit(grant.uid, budget.requests), None, budget.requests)
    return over


def answer_acl(words: Sequence[str], keys: Mapping[str, bytes], revoked: Collection[str], now: float,
               resolve: Resolve, protected: Sequence[tuple[str, Network]],
               usage: Callable[[str], Usage] = lambda uid: Usage(),
               admit: Callable[[str, int], int] = lambda uid, limit: 0, pod: str | None = None) -> str:
    """external_acl_type: `<user> <token> <host> <port> <SNI> <check>`, the check being the acl line's argument:
    `request` (http_access: may this run reach this name and port?), `budget` (has it spent what its credential
    allows? `usage(uid)` is what it moved so far through this pod, `admit(uid, limit)` counts the request: both
    run_logs.py) or `sni` (ssl_bump step 2: does
    the TLS ClientHello name the CONNECT host?). OK lets the request on; ERR refuses it with a message that names
    the host and the policy (squid's error page shows it)."""
    if len(words) != 6 or words[5] not in ("request", "budget", "sni"):
        return reply(False, message="the egress proxy could not read this request", reason="Malformed")
    user, token, host, port_text, sni, check = words
    if check == "sni":
        verdict = rules.decide_sni(host, sni)
        return reply(verdict.allowed, message=verdict.message, reason=None if verdict.allowed else verdict.reason)
    try:
        grant = verify(token, keys, now, revoked, user=user, pod=pod)
    except CredentialRefused as refused:
        return reply(False, message=str(refused), reason=refused.reason)
    if check == "budget":
        over = _over_budget(grant, usage, admit)
        return _answer(grant, over) if over else reply(True)  # an OK adds no notes: the request check's are logged
    port = int(port_text) if port_text.isdigit() and len(port_text) <= 5 else 0
    if not 1 <= port <= 65535:
        return _answer(grant, rules.Verdict(False, rules.NOT_ALLOWED, f"egress to {host}: no valid port"))
    by_name = rules.decide_name(grant.rules, grant.policy, host, port)
    if not by_name.allowed:
        return _answer(grant, by_name)
    name = rules.canonical_name(host)
    try:
        addresses = resolve(name, port)
    except OSError:
        addresses = ()
    return _answer(grant, rules.decide_addresses(grant.rules, grant.policy, name, port, by_name, addresses,
                                                     protected))


def _answer(grant: Grant, verdict: rules.Verdict) -> str:
    return reply(verdict.allowed, message=verdict.message, run=grant.run, uid=grant.uid, policy=grant.policy,
                 rule=verdict.rule, reason=None if verdict.allowed else verdict.reason,
                 via_cidr="yes" if verdict.via_cidr else None)


def resolver(hosts_file: str | None) -> Resolve:
    """Addresses as squid finds them: the hosts file squid reads (hosts_file), then DNS for the name as written,
    absolute (squid uses no search list, so neither may we: `mirror.pkgs` must not become a cluster Service)."""
    table = _read_hosts(hosts_file) if hosts_file else {}

    def resolve(name: str, port: int) -> Sequence[str]:
        if name in table:
            return table[name]
        found = socket.getaddrinfo(name + ".", port, type=socket.SOCK_STREAM)
        return list(dict.fromkeys(info[4][0] for info in found))

    return resolve


def _read_hosts(path: str) -> dict[str, list[str]]:
    table: dict[str, list[str]] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f.read(1024 * 1024).splitlines():
            words = line.split("#", 1)[0].split()
            try:
                address = str(ipaddress.ip_address(words[0])) if words else None
            except ValueError:
                continue
            for name in words[1:]:
                canonical = rules.canonical_name(name)
                if address and canonical:
                    table.setdefault(canonical, []).append(address)
    return table


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="coderun-egress")
    parser.add_argument("helper", choices=["auth", "acl"])
    parser.add_argument("--keys", help="directory with one file per signing key, named by key id")
    parser.add_argument("--revocations", help="the revocation list the operator publishes")
    parser.add_argument("--hosts-file", help="the hosts file squid reads (hosts_file in squid.conf)")
    parser.add_argument("--runs", help="the runs' logs and usage the log daemon writes (acl only: budgets)")
    parser.add_argument("--workers", type=int, default=8, help="requests answered at once (acl only)")
    parser.add_argument("--pod", help="this proxy pod's name: a credential naming another pod is refused")
    args = parser.parse_args(argv)
    if not args.keys or not args.revocations:
        parser.error("--keys and --revocations are required")
    # The revocations looked at on every check (a stat): the budget check, which squid asks on every request, then
    # refuses a revoked credential on its next request, not a second later.
    keys, revocations = keys_in(args.keys), revocations_in(args.revocations, interval=0.0)
    if args.helper == "auth":
        serve(lambda words: answer_auth(words, keys.current(), revocations.current(), time.time(), args.pod))
        return
    resolve, protected = resolver(args.hosts_file), protected_networks(os.environ)
    runs = RunLogs(args.runs) if args.runs else None
    usage = runs.usage if runs else (lambda uid: Usage())
    admit = runs.admit if runs else (lambda uid, limit: 0)
    serve(lambda words: answer_acl(words, keys.current(), revocations.current(), time.time(), resolve,
                                   protected, usage, admit, args.pod), workers=args.workers)


if __name__ == "__main__":
    main(sys.argv[1:])
