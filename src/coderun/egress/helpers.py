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
import threading
import time
from typing import Callable, Collection, Mapping, Sequence

from . import rules
from .credential import CredentialRefused, Grant, verify
from .files import keys_in, revocations_in
from .ranges import Network, protected_networks
from .relay import with_relayed
from .run_logs import RunLogs, Usage
from .squid_helper import reply, serve

Resolve = Callable[[str, int, tuple[str, str]], Sequence[str]]  # (name, port, (policy, namespace)) -> addresses
LOOKUP_SECONDS = 3.0  # one name lookup's time before the request is refused (squid keeps the refusal 5 s)
LOOKUPS_PER_TENANT = 2  # lookups of one policy's runs in one namespace in flight at once, per helper process


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


def _over_budget(grant: Grant, usage: Callable[[str], Usage], admit: Callable[[str], int]) -> rules.Verdict | None:
    """The request counted as it is asked (squid asks this at the policy stage only, before the names: every
    request of the run's counts, allowed or refused, as its status counts them, budget or none: the count is what
    the run's log must reach when it ends), then the bytes as the log counted them (what a request moves is known
    when it ends)."""
    asked_before = admit(grant.uid)
    budget = grant.budget
    if budget is None:
        return None
    over = rules.decide_budget(grant.policy, usage(grant.uid).bytes, 0, budget.bytes, None)
    if over is None and budget.requests is not None:
        over = rules.decide_budget(grant.policy, 0, asked_before, None, budget.requests)
    return over


def answer_acl(words: Sequence[str], keys: Mapping[str, bytes], revoked: Collection[str], now: float,
               resolve: Resolve, protected: Sequence[tuple[str, Network]],
               usage: Callable[[str], Usage] = lambda uid: Usage(),
               admit: Callable[[str], int] = lambda uid: 0, pod: str | None = None) -> str:
    """external_acl_type: `<user> <token> <host> <port> <SNI> [<transaction>] <check>`, the check being the acl
    line's argument (the transaction id only on the budget check's: squid_config says why):
    `request` (http_access: may this run reach this name and port?), `budget` (has it spent what its credential
    allows? `usage(uid)` is what it moved so far through this pod, `admit(uid)` counts the request: both
    run_logs.py) or `sni` (ssl_bump step 2: does
    the TLS ClientHello name the CONNECT host?). OK lets the request on; ERR refuses it with a message that names
    the host and the policy (squid's error page shows it)."""
    if len(words) == 7 and words[6] == "budget":  # the budget check's key ends in the request's transaction id
        words = [*words[:5], words[6]]
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
        addresses = resolve(name, port, (grant.policy, grant.namespace))
    except LookupRefused as refused:
        return _answer(grant, rules.Verdict(False, rules.UNRESOLVED, f"egress to {name}:{port} refused: {refused}"))
    except OSError:
        addresses = ()
    return _answer(grant, rules.decide_addresses(grant.rules, grant.policy, name, port, by_name, addresses,
                                                     protected))


def _answer(grant: Grant, verdict: rules.Verdict) -> str:
    return reply(verdict.allowed, message=verdict.message, run=grant.run, uid=grant.uid, policy=grant.policy,
                 rule=verdict.rule, reason=None if verdict.allowed else verdict.reason,
                 via_cidr="yes" if verdict.via_cidr else None)


class LookupRefused(OSError):
    """A name lookup not made, or not waited for, to keep one tenant's slow names from holding every check."""


class BoundedLookups:
    """Name lookups with a bound on each one's time and on how many one tenant of a policy (its runs in one
    namespace) has in flight. getaddrinfo blocks and cannot be cut short: a name whose DNS server never answers
    would hold a helper worker for its whole timeout (and squid's checks of every tenant wait on 4 processes x 8
    workers). So each lookup runs in a thread of its own; a tenant's lookups count as in flight until they really
    end, and a tenant with `per_tenant` of them in flight waits for a slot. The wait for a slot and the lookup
    together last at most `seconds`, then the request is refused. A slow wildcard then costs its own tenant's
    requests, never another namespace's under the same policy, nor another policy's; names merely slow to
    resolve (a run fetching many new hosts at once) wait their turn instead of being refused."""

    def __init__(self, resolve: Callable[[str, int], Sequence[str]], seconds: float = LOOKUP_SECONDS,
                 per_tenant: int = LOOKUPS_PER_TENANT):
        self._resolve, self._seconds, self._per_tenant = resolve, seconds, per_tenant
        self._in_flight: dict[tuple[str, str], int] = {}
        self._slots = threading.Condition()

    def __call__(self, name: str, port: int, tenant: tuple[str, str]) -> Sequence[str]:
        deadline = time.monotonic() + self._seconds
        with self._slots:
            if not self._slots.wait_for(lambda: self._in_flight.get(tenant, 0) < self._per_tenant, self._seconds):
                policy, namespace = tenant
                raise LookupRefused(f"{self._per_tenant} name lookups of CodeRunPolicy {policy}'s runs in namespace "
                                    f"{namespace} were still waiting for DNS after {self._seconds:g} s; try again "
                                    "in a few seconds")
            self._in_flight[tenant] = self._in_flight.get(tenant, 0) + 1
        done, found = threading.Event(), {}

        def lookup() -> None:
            try:
                found["addresses"] = self._resolve(name, port)
            except OSError as e:
                found["error"] = e
            finally:
                with self._slots:
                    self._in_flight[tenant] -= 1
                    if not self._in_flight[tenant]:
                        del self._in_flight[tenant]
                    self._slots.notify_all()
                done.set()

        threading.Thread(target=lookup, name="coderun-egress-lookup", daemon=True).start()
        if not done.wait(max(0.0, deadline - time.monotonic())):
            raise LookupRefused(f"the name did not resolve within {self._seconds:g} s")
        if "error" in found:
            raise found["error"]
        return found["addresses"]


def resolver(hosts_file: str | None) -> Callable[[str, int], Sequence[str]]:
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
    resolve, protected = BoundedLookups(resolver(args.hosts_file)), protected_networks(os.environ)
    runs = RunLogs(args.runs) if args.runs else None
    usage = with_relayed(runs.usage, args.runs) if runs else (lambda uid: Usage())
    admit = runs.admit if runs else (lambda uid: 0)
    serve(lambda words: answer_acl(words, keys.current(), revocations.current(), time.time(), resolve,
                                   protected, usage, admit, args.pod), workers=args.workers)


if __name__ == "__main__":
    main(sys.argv[1:])
