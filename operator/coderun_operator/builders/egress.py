"""A run's way to the egress proxy: its credential in the program's environment, and the one route its
NetworkPolicy opens (to the proxy's pods, on the proxy port). Pure: the route and the signing key come in an
`EgressAccess` (proxy.py reads them from the Service and the Secret), and `pinned` picks the run's one proxy pod.

The program has no DNS, so the proxy is dialled at an address: the pod's own, never the Service's, so that one
pod sees all of a run's requests and counts its budget (docs/egress.md, "Budgets"). Python (urllib, requests, pip) reads
HTTP_PROXY/HTTPS_PROXY with the credential in them; Node's fetch and https ignore them before Node 24
(NODE_USE_ENV_PROXY is set for a Node runtime, which honours it from 24; docs/egress.md says what Node 18 needs). Only
for Node: it is a start-up variable (runner prestart.py), so set for Python it would make every egress run of a warm
pod or a session start cold, and every keepState run refused.
"""
from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from coderun.api.models import EgressRule, Runtime
from coderun.egress.credential import Budget, CredentialRefused, Grant, mint, proxy_url, read_grant
from ..policy import Decision, Policy
from .names import laid_run_json

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
    """What a run needs of the proxy: the key that signs credentials, the route to its pods and, once the run is
    pinned (`pinned`), the one pod it dials."""
    key_id: str
    key: bytes
    route: ProxyRoute
    pod: str | None = None  # the proxy pod's name (None: not known, a start retried after a crash kept its input's)
    address: str | None = None  # host:port of that pod's proxy port, as the program dials it


def uses_proxy(egress: Sequence[EgressRule]) -> bool:
    """A policy with host rules routes its runs through the proxy (cidr rules alone are routes of their own)."""
    return any(rule.host is not None for rule in egress)


def socket_address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"


def is_ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or ())


def pinned(access: EgressAccess, pods: Iterable[Mapping[str, Any]], uid: str) -> EgressAccess | None:
    """The run's one proxy pod (`pinned_pod`), or None when none is ready."""
    chosen = pinned_pod(pods, uid)
    if chosen is None:
        return None
    name, ip = chosen
    return replace(access, pod=name, address=socket_address(ip, access.route.port))


def pinned_pod(pods: Iterable[Mapping[str, Any]], uid: str) -> tuple[str, str] | None:
    """A run's one pod (name, address) among the ready ones (not being deleted, with an address) of a service the
    sandbox dials by address (the egress proxy, the data service), or None when there is none. Rendezvous
    hashing: the pod whose sha256(run uid, pod name) is highest. It needs no state (every operator replica, and a
    retried start, picks the same pod for the same ready pods), spreads runs evenly, and a pod coming or going
    moves only the runs it wins or held, never one pinned to another pod."""
    ready = [(pod["metadata"]["name"], pod["status"]["podIP"]) for pod in pods
             if is_ready(pod) and not pod["metadata"].get("deletionTimestamp") and pod["status"].get("podIP")]
    if not ready:
        return None
    return max(ready, key=lambda pod: (hashlib.sha256(f"{uid}/{pod[0]}".encode()).digest(), pod[0]))


def credential_expiry(decision: Decision, margin_seconds: int, now: float) -> int:
    """When the run's credential stops working if nobody revokes it: the latest its pod can still be running
    (its start deadline, the program's timeout, the pod's margin beyond it)."""
    return int(now) + decision.policy.start_deadline_seconds + decision.limits.timeout_seconds + margin_seconds


def grant(run: Mapping[str, Any], policy: Policy, expires: int, proxy_pod: str | None = None) -> Grant:
    meta, budget = run["metadata"], policy.egress_budget
    return Grant(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], policy=policy.name,
                 rules=tuple(rule.as_rule() for rule in policy.egress), expires=expires,
                 budget=Budget(budget.bytes, budget.requests) if budget else None, proxy_pod=proxy_pod)


def run_environment(access: EgressAccess, run: Mapping[str, Any], policy: Policy, runtime: Runtime,
                    expires: int) -> dict[str, str]:
    """The program's proxy settings, its credential inside them, naming the pod it is pinned to; Node's switch
    to honour them only where the runtime's command is Node."""
    if access.address is None:
        raise ValueError("a run's proxy settings name its pinned proxy pod (builders.egress.pinned)")
    token = mint(access.key_id, access.key, grant(run, policy, expires, access.pod))
    url = proxy_url(access.address, token, run["metadata"]["uid"])
    node = {"NODE_USE_ENV_PROXY": "1"} if runs_node(runtime) else {}
    return {**{name: url for name in PROXY_VARIABLES}, "NO_PROXY": NO_PROXY, "no_proxy": NO_PROXY, **node}


def runs_node(runtime: Runtime) -> bool:
    """Whether the runtime's program is Node (its command's executable: node, nodejs, /usr/bin/node, ...)."""
    return runtime.command[0].rpartition("/")[2] in ("node", "nodejs")


def minted(access: EgressAccess, run: Mapping[str, Any], input_configmap: Mapping[str, Any]) -> tuple[int, EgressAccess] | None:
    """The credential's expiry and the access in a run input this operator made earlier (it signed the
    credential, for this run), so a start retried after a crash mints the same credential for the same proxy pod and
    finds its own input again; None for anything else. The pod is the one the credential names (an older
    credential names none: then it is kept when it is still the one `access` is pinned to, else not known; that
    pod may have gone, and the run's requests then fail closed)."""
    try:
        env = laid_run_json(input_configmap).get("env") or {}
        userinfo, _, address = str(env.get("HTTPS_PROXY") or "").rpartition("@")
        found = read_grant(userinfo.partition("://")[2].partition(":")[2], {access.key_id: access.key})
    except (ValueError, AttributeError, CredentialRefused):
        return None
    if found.uid != run["metadata"]["uid"] or not address:
        return None
    # the pod its credential names (and so the only one that honours it), else the one `access` is pinned to
    pod = found.proxy_pod or (access.pod if address == access.address else None)
    return found.expires, replace(access, pod=pod, address=address)


def proxy_egress_rule(route: ProxyRoute) -> dict[str, Any]:
    """The NetworkPolicy egress rule to the proxy's pods, whichever namespace it runs in."""
    return {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": route.namespace}},
                    "podSelector": {"matchLabels": dict(route.pod_labels)}}],
            "ports": [{"protocol": "TCP", "port": route.port}]}
