"""Egress a policy may not grant by accident: the cluster's own pods, Services and nodes, loopback, link-local
and the cloud metadata address. A sandbox that can reach them can reach the operator, the API server and the
kubelet; a policy must say so (spec.allowClusterEgress: true) to allow a CIDR that covers any of them.

The cluster's ranges come from the operator's configuration (the chart's clusterNetwork values):
CODERUN_POD_CIDRS, CODERUN_SERVICE_CIDRS, CODERUN_NODE_CIDRS (comma-separated). Without any of them, every
private range stands in for them (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7), which covers the ranges of
nearly every cluster.
"""
from __future__ import annotations

import ipaddress
import os
from typing import Iterable, Mapping, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

ALWAYS_PROTECTED = (("loopback", "127.0.0.0/8"), ("loopback", "::1/128"), ("link-local (the cloud metadata address 169.254.169.254 is there)", "169.254.0.0/16"),
                    ("link-local", "fe80::/10"), ("the cloud metadata address", "fd00:ec2::254/128"))
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
CLUSTER_RANGE_VARIABLES = (("pod", "CODERUN_POD_CIDRS"), ("Service", "CODERUN_SERVICE_CIDRS"),
                           ("node", "CODERUN_NODE_CIDRS"))


def protected_networks(env: Mapping[str, str]) -> tuple[tuple[str, Network], ...]:
    """(what it is, network) for every range a policy needs allowClusterEgress to cover."""
    configured = [(f"the cluster's {what} range", cidr.strip()) for what, variable in CLUSTER_RANGE_VARIABLES
                  for cidr in env.get(variable, "").split(",") if cidr.strip()]
    if not configured:
        configured = [("a private range (the operator is not configured with the cluster's ranges)", cidr)
                      for cidr in PRIVATE_RANGES]
    return tuple((what, ipaddress.ip_network(cidr, strict=False)) for what, cidr in [*ALWAYS_PROTECTED, *configured])


PROTECTED = protected_networks(os.environ)


def cluster_egress_refusal(cidrs: Iterable[str], allowed: bool,
                           protected: Sequence[tuple[str, Network]] = PROTECTED) -> str | None:
    """The message refusing the first egress CIDR that overlaps a protected range, unless the policy allows it."""
    if allowed:
        return None
    for index, cidr in enumerate(cidrs):
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
