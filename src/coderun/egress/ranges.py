"""The addresses nothing may reach by accident: the cluster's own pods, Services and nodes, loopback, link-local
and the cloud metadata address. The operator refuses a policy CIDR covering one unless the policy says so
(spec.allowClusterEgress); the egress proxy refuses a name that resolves into one unless a CIDR rule of the run
covers the address. One list, so the two can never disagree.

The cluster's ranges come from the environment (the chart's clusterNetwork values, given to the operator and
the proxy alike): CODERUN_POD_CIDRS, CODERUN_SERVICE_CIDRS, CODERUN_NODE_CIDRS (comma-separated). Without any of
them, every private range stands in for them (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7), which covers
the ranges of nearly every cluster.
"""
from __future__ import annotations

import ipaddress
from typing import Mapping

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

ALWAYS_PROTECTED = (("loopback", "127.0.0.0/8"), ("loopback", "::1/128"),
                    ("link-local (the cloud metadata address 169.254.169.254 is there)", "169.254.0.0/16"),
                    ("link-local", "fe80::/10"), ("the cloud metadata address", "fd00:ec2::254/128"),
                    ("this host (a connection to 0.0.0.0 reaches the connecting host itself)", "0.0.0.0/8"),
                    ("the unspecified address", "::/128"))
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
CLUSTER_RANGE_VARIABLES = (("pod", "CODERUN_POD_CIDRS"), ("Service", "CODERUN_SERVICE_CIDRS"),
                           ("node", "CODERUN_NODE_CIDRS"))


def protected_networks(env: Mapping[str, str]) -> tuple[tuple[str, Network], ...]:
    """(what it is, network) for every protected range."""
    configured = [(f"the cluster's {what} range", cidr.strip()) for what, variable in CLUSTER_RANGE_VARIABLES
                  for cidr in env.get(variable, "").split(",") if cidr.strip()]
    if not configured:
        configured = [("a private range (the cluster's ranges are not configured)", cidr)
                      for cidr in PRIVATE_RANGES]
    return tuple((what, ipaddress.ip_network(cidr, strict=False)) for what, cidr in [*ALWAYS_PROTECTED, *configured])
