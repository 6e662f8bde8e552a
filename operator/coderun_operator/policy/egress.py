"""Egress a policy may not grant by accident (coderun/egress/ranges.py lists the ranges and why): a policy must say
so (spec.allowClusterEgress: true) to allow a CIDR that covers any of them.
"""
from __future__ import annotations

import ipaddress
import os
from typing import Iterable, Sequence

from coderun.egress.ranges import Network, protected_networks

PROTECTED = protected_networks(os.environ)


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
