"""Egress a policy may not grant by accident (coderun/egress/ranges.py lists the ranges and why): a policy must say
so (spec.allowClusterEgress: true) to allow a CIDR that covers any of them. And egress by name, which needs the
egress proxy: without one configured (the chart's egressProxy.enabled), a host rule is refused.
"""
from __future__ import annotations

import ipaddress
import os
from typing import Iterable, Sequence

from coderun.egress.ranges import Network, protected_networks

PROTECTED = protected_networks(os.environ)
# <namespace>/<Service> of the egress proxy, set by the chart (proxy.py reads the rest of its settings).
PROXY_VARIABLE = "CODERUN_EGRESS_PROXY"
PROXY_ENABLED = bool(os.environ.get(PROXY_VARIABLE))


def host_rule_refusal(hosts: Iterable[str | None], proxy_enabled: bool = PROXY_ENABLED) -> str | None:
    """The message refusing the first host rule when no egress proxy is configured. `hosts` follows spec.egress
    index for index (None for a cidr rule)."""
    if proxy_enabled:
        return None
    index = next((i for i, host in enumerate(hosts) if host is not None), None)
    if index is None:
        return None
    return (f"spec.egress[{index}].host: egress by name goes through the egress proxy, which is off in this "
            "installation (the chart's egressProxy.enabled); list the addresses as cidr rules, or turn the proxy on")


def cluster_egress_refusal(cidrs: Iterable[str | None], allowed: bool,
                           protected: Sequence[tuple[str, Network]] = PROTECTED) -> str | None:
    """The message refusing the first egress CIDR that overlaps a protected range, unless the policy allows it.
    `cidrs` follows spec.egress index for index (None for a host rule), so the message names the right one."""
    if allowed:
        return None
    for index, cidr in enumerate(cidrs):
        if cidr is None:
            continue
        try:
            network = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            continue  # the schema refuses a malformed CIDR with its own message
        for what, range_ in protected:
            if network.version == range_.version and network.overlaps(range_):
                return (f"spec.egress[{index}].cidr: {cidr} covers {range_} ({what}): a sandbox could reach the "
                        "operator, the API server and other tenants' pods there; narrow the CIDR to the addresses "
                        "runs need, or set spec.allowClusterEgress: true if they may reach the cluster itself")
    return None
