"""A run's egress credential: who the run is, its egress rules and its deadline, signed by the operator with a
key it shares with the proxy (a Secret), so the proxy checks a request without calling anyone.

    v1.<key id>.<payload: base64url of compact JSON>.<HMAC-SHA256 of everything before it, base64url>

The program gets it as the password of its proxy URL (http://<run uid>:<token>@proxy:3128, in HTTP_PROXY and
HTTPS_PROXY); the user name must be the run's uid, so squid's credential cache keeps one entry per run. The rules
travel inside the token: one run's token can only ever open its own allowlist, and the proxy needs no access
to the API server. The token ends at the run's deadline (`exp`) or, if the run ends earlier, when the operator
revokes it at each proxy pod's admin endpoint (admin.py writes a line `<uid> <exp>` to the revocation list the
helpers read: render_revocations). It may also carry the run's egress budget (bytes, requests).
Several keys may be valid at once (rotation): the proxy accepts any key id it holds.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import Collection, Iterable, Mapping

from .rules import Rule
# KEY_ID_PATTERN and MIN_KEY_BYTES are read here too (files.py, the operator's proxy.py): the egress keys' rules.
from .signed import KEY_ID_PATTERN, MIN_KEY_BYTES, NOT_OURS, Unsealed, seal, unb64, unseal

VERSION = "v1"
# Squid refuses Basic credentials (user:password) over 8192 bytes; the user is the run's uid. A policy within
# EGRESS_BUDGET makes a token well under this (the API refuses a larger one); nothing longer is even decoded.
MAX_TOKEN_CHARS = 8000
# What a policy's egress rules may weigh together (egress_weight): each rule's host or cidr, 6 for each port,
# 8 more; about what the rules take in the token's JSON.
EGRESS_BUDGET = 4096
UID_PATTERN = re.compile(r"^[a-z0-9-]{1,64}$")
# Every token in RE2 and Python syntax alike: the operator redacts it from what a program prints (a program that
# prints its environment must not publish the credential in its status while the run's token still works).
TOKEN_PATTERN = r"\bv1\.[a-z0-9][a-z0-9-]{0,31}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{43}"


@dataclass(frozen=True)
class Budget:
    """What a run may spend through the proxy: bytes both ways and requests, all of them counted (allowed or not);
    None leaves that one unbounded."""
    bytes: int | None = None
    requests: int | None = None


@dataclass(frozen=True)
class Grant:
    """What a token says: the run, the policy that decided its egress, its rules, and when it stops working."""
    namespace: str
    name: str
    uid: str
    policy: str
    rules: tuple[Rule, ...]
    expires: int  # seconds since the epoch
    budget: Budget | None = None
    # The proxy pod the run is pinned to: only that pod honours the token, so a run's budget is counted in one
    # place even by a program that dials the other proxy pods (its NetworkPolicy opens them all). None: any pod.
    proxy_pod: str | None = None

    @property
    def run(self) -> str:
        return f"{self.namespace}/{self.name}"


class CredentialRefused(Exception):
    """The token does not open the proxy; `reason` is a CamelCase word, the message says why."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


BAD_CREDENTIAL, EXPIRED, REVOKED = "BadCredential", "CredentialExpired", "CredentialRevoked"
WRONG_PROXY = "WrongProxyPod"


def mint(key_id: str, key: bytes, grant: Grant) -> str:
    """The operator's side: the token for one run."""
    payload = {"ns": grant.namespace, "name": grant.name, "uid": grant.uid, "policy": grant.policy,
               "exp": grant.expires, "egress": [[r.host or r.cidr, list(r.ports)] for r in grant.rules]}
    if grant.budget is not None:
        payload["budget"] = [grant.budget.bytes, grant.budget.requests]
    if grant.proxy_pod is not None:
        payload["pod"] = grant.proxy_pod
    token = seal(VERSION, key_id, key, json.dumps(payload, separators=(',', ':')).encode())
    if len(token) > MAX_TOKEN_CHARS:
        raise ValueError(f"the token would be {len(token)} characters, above {MAX_TOKEN_CHARS}: the rules are "
                         f"over EGRESS_BUDGET")
    return token


def verify(token: str, keys: Mapping[str, bytes], now: float, revoked: Collection[str] = (),
           user: str | None = None, pod: str | None = None) -> Grant:
    """The proxy's side: the grant a token carries, or CredentialRefused. The signature is checked before any of
    the payload is parsed; `user`, when given (the proxy's auth helper), must be the run's uid; `pod`, the proxy
    pod asking, must be the one the token names, if it names one."""
    grant = read_grant(token, keys)
    if user is not None and user != grant.uid:
        raise CredentialRefused(BAD_CREDENTIAL, "the proxy user name is not the credential's run")
    if pod is not None and grant.proxy_pod is not None and pod != grant.proxy_pod:
        raise CredentialRefused(WRONG_PROXY, f"the proxy credential of run {grant.run} is for proxy pod "
                                f"{grant.proxy_pod}, not {pod}: a run's requests go to the proxy its HTTP_PROXY names")
    if now >= grant.expires:
        raise CredentialRefused(EXPIRED, f"the proxy credential of run {grant.run} expired at its deadline")
    if grant.uid in revoked:
        raise CredentialRefused(REVOKED, f"the proxy credential of run {grant.run} was revoked: the run has ended")
    return grant


def read_grant(token: str, keys: Mapping[str, bytes]) -> Grant:
    """The grant of a token signed by one of `keys`, whatever its deadline (verify checks that); the operator reads
    back the expiry it minted into a run's input this way."""
    if len(token) > MAX_TOKEN_CHARS:
        raise CredentialRefused(BAD_CREDENTIAL, "the proxy credential is too long")
    try:
        payload = unseal(token, VERSION, keys)
    except Unsealed as e:
        raise CredentialRefused(BAD_CREDENTIAL, "the proxy credential is not a coderun egress token"
                                if e.what == NOT_OURS else "the proxy credential's signature does not verify") from None
    try:
        return _grant(json.loads(unb64(payload)))
    except (ValueError, TypeError, KeyError) as e:  # signed, so only a broken operator gets here
        raise CredentialRefused(BAD_CREDENTIAL, f"the proxy credential's payload is malformed ({type(e).__name__})")


def admin_bearer(key: bytes) -> str:
    """The bearer token of the proxy's admin endpoint (admin.py), derived from a signing key: whoever holds the key
    (the operator) may revoke credentials and read the runs' logs, and nothing else needs a secret of its own."""
    return hmac.new(key, b"coderun-egress-admin", hashlib.sha256).hexdigest()


def egress_weight(target: str, ports: int) -> int:
    """One rule's share of EGRESS_BUDGET (the API's CEL rule computes the same: coderunpolicy.py)."""
    return len(target) + 6 * ports + 8


def proxy_url(proxy: str, token: str, uid: str) -> str:
    """HTTP_PROXY / HTTPS_PROXY for the run: `proxy` is host:port."""
    return f"http://{uid}:{token}@{proxy}"


def render_revocations(entries: Mapping[str, int], now: float) -> str:
    """The revocation list the operator publishes: `<uid> <exp>` a line, for runs that ended before their token
    expired; an entry past its expiry is dropped (the token is refused anyway), so the list stays small."""
    return "".join(f"{uid} {exp}\n" for uid, exp in sorted(entries.items()) if exp > now and UID_PATTERN.match(uid))


def read_revocations(lines: Iterable[str], now: float) -> dict[str, int]:
    """The revoked tokens still worth remembering, uid -> expiry; malformed lines are skipped, never fatal."""
    revoked = {}
    for line in lines:
        uid, _, exp = line.strip().partition(" ")
        if UID_PATTERN.match(uid) and exp.isdigit() and len(exp) < 12 and int(exp) > now:
            revoked[uid] = int(exp)
    return revoked


def parse_revocations(lines: Iterable[str], now: float) -> frozenset[str]:
    """The uids of the revoked tokens still worth remembering (what the helpers check)."""
    return frozenset(read_revocations(lines, now))


def _grant(payload: dict) -> Grant:
    rules = tuple(Rule(**{("cidr" if "/" in target else "host"): target}, ports=tuple(ports))
                  for target, ports in payload["egress"])
    fields = {k: payload[k] for k in ("ns", "name", "uid", "policy")}
    if not all(isinstance(v, str) for v in fields.values()) or not isinstance(payload["exp"], int):
        raise TypeError("fields")
    budget = None
    if "budget" in payload:
        spend, requests = payload["budget"]
        if not all(v is None or isinstance(v, int) for v in (spend, requests)):
            raise TypeError("budget")
        budget = Budget(spend, requests)
    pod = payload.get("pod")
    if not (pod is None or isinstance(pod, str)):
        raise TypeError("pod")
    return Grant(fields["ns"], fields["name"], fields["uid"], fields["policy"], rules, payload["exp"], budget, pod)
