"""A run's way to the egress proxy: its credential in the program's environment, and the one route its
NetworkPolicy opens (to the proxy's pods, on the proxy port). Pure: the proxy's address and the signing key come
in an `EgressAccess` (proxy.py reads them from the Service and the Secret).

The program has no DNS, so the proxy is dialled at its Service's address. Python (urllib, requests, pip) reads
HTTP_PROXY/HTTPS_PROXY with the credential in them; Node's fetch and https ignore them before Node 24
(NODE_USE_ENV_PROXY is set for a runtime that honours it; docs/egress.md says what Node 18 needs).
"""
from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any, Mapping

from coderun.api.models import EgressRule
from coderun.egress.credential import Budget, CredentialRefused, Grant, mint, proxy_url, read_grant
from ..policy import Decision, Policy

# The program's own loopback stays direct (a server it starts for itself).
NO_PROXY = "localhost,127.0.0.1,::1"
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")


@dataclass(frozen=True)
class ProxyRoute:
    """Where the proxy's pods are, for a run's NetworkPolicy: their namespace, labels and the proxy port."""
    namespace: str
    pod_labels: tuple[tuple[str, str], ...]
    port: int


@dataclass(frozen=True)
class EgressAccess:
    """What a run needs of the proxy: its address as the program dials it, the key that signs credentials."""
    address: str  # host:port of the Service
    key_id: str
    key: bytes
    route: ProxyRoute


def uses_proxy(egress: tuple[EgressRule, ...] | list[EgressRule]) -> bool:
    """A policy with host rules routes its runs through the proxy (cidr rules alone are routes of their own)."""
    return any(rule.host is not None for rule in egress)


def service_address(cluster_ip: str, port: int) -> str:
    return f"[{cluster_ip}]:{port}" if ipaddress.ip_address(cluster_ip).version == 6 else f"{cluster_ip}:{port}"


def credential_expiry(decision: Decision, margin_seconds: int, now: float) -> int:
    """When the run's credential stops working if nobody revokes it: the latest its pod can still be running
    (its start deadline, the program's timeout, the pod's margin beyond it)."""
    return int(now) + decision.policy.start_deadline_seconds + decision.limits.timeout_seconds + margin_seconds


def grant(run: Mapping[str, Any], policy: Policy, expires: int) -> Grant:
    meta, budget = run["metadata"], policy.egress_budget
    return Grant(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], policy=policy.name,
                 rules=tuple(rule.as_rule() for rule in policy.egress), expires=expires,
                 budget=Budget(budget.bytes, budget.requests) if budget else None)


def run_environment(access: EgressAccess, run: Mapping[str, Any], policy: Policy, expires: int) -> dict[str, str]:
    """The program's proxy settings, its credential inside them."""
    url = proxy_url(access.address, mint(access.key_id, access.key, grant(run, policy, expires)), run["metadata"]["uid"])
    return {**{name: url for name in PROXY_VARIABLES}, "NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY,
            "NODE_USE_ENV_PROXY": "1"}


def minted_expiry(access: EgressAccess, run: Mapping[str, Any], input_configmap: Mapping[str, Any]) -> int | None:
    """The expiry of the credential in a run input this operator made earlier (it signed it, for this run), so a
    start retried after a crash mints the same credential and finds its own input again; None for anything else."""
    try:
        env = json.loads((input_configmap.get("data") or {}).get("run.json") or "{}").get("env") or {}
        token = str(env.get("HTTPS_PROXY") or "").rpartition("@")[0].partition("://")[2].partition(":")[2]
        found = read_grant(token, {access.key_id: access.key})
    except (ValueError, AttributeError, CredentialRefused):
        return None
    return found.expires if found.uid == run["metadata"]["uid"] else None


def proxy_egress_rule(route: ProxyRoute) -> dict[str, Any]:
    """The NetworkPolicy egress rule to the proxy's pods, whichever namespace it runs in."""
    return {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": route.namespace}},
                    "podSelector": {"matchLabels": dict(route.pod_labels)}}],
            "ports": [{"protocol": "TCP", "port": route.port}]}
