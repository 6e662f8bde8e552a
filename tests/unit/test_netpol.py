"""The local cluster's NetworkPolicy enforcer (e2e/cluster/netpol.py), its pure parts: rendering for both
address families, ipBlocks, pod entries, and the list-then-watch that never keeps a deleted object."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "e2e" / "cluster" / "netpol.py"
_spec = importlib.util.spec_from_file_location("coderun_netpol", _PATH)
netpol = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(netpol)

CIDR = "10.88.0.0/16"


def pod(ns, name, ips, labels=None, created="2026-01-01T00:00:00Z", ports=()):
    return {"metadata": {"namespace": ns, "name": name, "labels": labels or {}, "creationTimestamp": created},
            "ips": list(ips), "ports": list(ports)}


def policy(ns, name, selector, types=("Ingress", "Egress"), ingress=None, egress=None):
    spec = {"podSelector": selector, "policyTypes": list(types)}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    return {"metadata": {"namespace": ns, "name": name}, "spec": spec}


def chain(ruleset: str, name: str) -> list[str]:
    body = re.search(rf"  chain {name} {{\n(.*?)\n  }}", ruleset, re.S)
    assert body, f"no chain {name} in\n{ruleset}"
    return [line.strip() for line in body.group(1).splitlines()]


DENY_ALL = policy("a", "deny", {"matchLabels": {"role": "sandbox"}})
SANDBOX = pod("a", "sandbox", ["10.88.0.5", "fd00:88::5"], {"role": "sandbox"})


# ------------------------------------------------------------------------------------------ render
def test_isolated_pod_is_jumped_to_its_chains_in_both_families_and_its_chains_drop_everything():
    rules = netpol.render([SANDBOX], {}, [DENY_ALL], CIDR)
    forward, input_ = chain(rules, "forward"), chain(rules, "input")
    for line in ("ip daddr 10.88.0.5 jump ingress_0", "ip6 daddr fd00:88::5 jump ingress_0",
                 "ip saddr 10.88.0.5 jump egress_0", "ip6 saddr fd00:88::5 jump egress_0"):
        assert line in forward
    assert "ip saddr 10.88.0.5 jump egress_0" in input_ and "ip6 saddr fd00:88::5 jump egress_0" in input_
    # no accept of any protocol (TCP, UDP, ICMP, ICMPv6 ...): the chain is a counted drop
    assert chain(rules, "ingress_0") == ['counter drop comment "a/sandbox ingress"']
    assert chain(rules, "egress_0") == ['counter drop comment "a/sandbox egress"']
    assert "set known_pods { type ipv4_addr; elements = { 10.88.0.5 }; }" in rules
    assert "set known_pods6 { type ipv6_addr; elements = { fd00:88::5 }; }" in rules


def test_unknown_ipv6_on_the_pod_bridge_is_dropped_before_anything_can_accept_it():
    rules = netpol.render([pod("a", "v4only", ["10.88.0.9"])], {}, [], CIDR, bridge="br-test")
    forward, input_ = chain(rules, "forward"), chain(rules, "input")
    drop_from = 'iifname "br-test" ip6 saddr != @known_pods6 counter drop'
    drop_to = 'oifname "br-test" ip6 daddr != @known_pods6 counter drop'
    established = "ct state established,related accept"
    assert forward.index(drop_from) < forward.index(established)
    assert forward.index(drop_to) < forward.index(established)
    assert input_.index(drop_from) < input_.index(established)
    assert "set known_pods6 { type ipv6_addr; }" in rules  # an IPv4-only cluster: every pod IPv6 is unknown
    # unknown IPv4 pod addresses may neither open nor receive connections
    assert f"ip saddr {CIDR} ip saddr != @known_pods ct state new counter drop" in forward
    assert f"ip daddr {CIDR} ip daddr != @known_pods ct state new counter drop" in forward
    assert f"ip saddr {CIDR} ip saddr != @known_pods ct state new counter drop" in input_


def test_allowed_peer_pods_are_matched_in_each_family():
    web = pod("a", "web", ["10.88.0.6", "fd00:88::6"], {"role": "web"})
    allow = policy("a", "web", {"matchLabels": {"role": "web"}}, types=["Ingress"],
                   ingress=[{"from": [{"podSelector": {"matchLabels": {"role": "sandbox"}}}],
                             "ports": [{"port": 8080}]}])
    rules = netpol.render([SANDBOX, web], {}, [allow], CIDR)
    assert chain(rules, "ingress_1") == ["ip saddr { 10.88.0.5 } tcp dport 8080 return",
                                         "ip6 saddr { fd00:88::5 } tcp dport 8080 return",
                                         'counter drop comment "a/web ingress"']


def test_ipv6_ip_blocks_are_honoured_with_their_excepts():
    egress = [{"to": [{"ipBlock": {"cidr": "2001:db8::/32", "except": ["2001:db8:1::/48", "10.0.0.0/8"]}},
                      {"ipBlock": {"cidr": "192.0.2.0/24"}}],
               "ports": [{"port": 53, "protocol": "UDP"}]}]
    rules = netpol.render([SANDBOX], {}, [policy("a", "dns", {"matchLabels": {"role": "sandbox"}}, egress=egress)],
                          CIDR)
    body = chain(rules, "egress_0")
    assert body[0] == "ip daddr { 192.0.2.0/24 } udp dport 53 return"
    v6 = re.match(r"ip6 daddr \{ (.*) \} udp dport 53 return", body[1]).group(1).split(", ")
    import ipaddress
    nets = [ipaddress.ip_network(n) for n in v6]
    allowed, excluded = ipaddress.ip_network("2001:db8::/32"), ipaddress.ip_network("2001:db8:1::/48")
    assert all(n.subnet_of(allowed) and not n.overlaps(excluded) for n in nets)
    assert sum(n.num_addresses for n in nets) == allowed.num_addresses - excluded.num_addresses


def test_ip_block_networks():
    assert netpol.ip_block_networks({"cidr": "fd00::/8"}) == ["fd00::/8"]
    assert netpol.ip_block_networks({"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}) == []
    assert netpol.ip_block_networks({"cidr": "10.1.0.0/16", "except": ["10.0.0.0/8"]}) == []
    assert netpol.ip_block_networks({"cidr": "10.0.0.0/31", "except": ["10.0.0.1/32", "fd00::/8"]}) == ["10.0.0.0/32"]


def test_overlapping_addresses_are_collapsed_for_nft_sets():
    assert netpol.family_matches("daddr", ["10.0.0.0/8", "10.88.0.5", "fd00::/8", "fd00::1"]) == \
        ["ip daddr { 10.0.0.0/8 }", "ip6 daddr { fd00::/8 }"]


def test_egress_to_a_named_port_names_the_target_pod_in_its_own_families():
    web = pod("a", "web", ["10.88.0.6", "fd00:88::6"], {"role": "web"},
              ports=[{"name": "http", "containerPort": 8080}])
    egress = [{"to": [{"podSelector": {"matchLabels": {"role": "web"}}}], "ports": [{"port": "http"}]}]
    rules = netpol.render([SANDBOX, web], {}, [policy("a", "p", {"matchLabels": {"role": "sandbox"}},
                                                      egress=egress)], CIDR)
    assert chain(rules, "egress_0")[:2] == ["ip daddr { 10.88.0.6 } tcp dport 8080 return",
                                            "ip6 daddr { fd00:88::6 } tcp dport 8080 return"]


def test_an_ip_claimed_by_two_pods_belongs_to_the_newest():
    old = pod("a", "old", ["10.88.0.7"], {"role": "open"}, created="2026-01-01T00:00:00Z")
    new = pod("a", "new", ["10.88.0.7"], {"role": "sandbox"}, created="2026-01-01T00:05:00Z")
    rules = netpol.render([old, new], {}, [DENY_ALL], CIDR)
    assert 'counter drop comment "a/new egress"' in rules and "a/old" not in rules
    assert "ip saddr 10.88.0.7 jump egress_0" in chain(rules, "forward")


@pytest.mark.skipif(not shutil.which("nft") or os.geteuid() != 0, reason="nft -c needs nft and root")
def test_nft_accepts_the_rendered_table():
    web = pod("b", "web", ["10.88.0.6", "fd00:88::6"], {"role": "web"}, ports=[{"name": "http", "containerPort": 80}])
    policies = [DENY_ALL, policy("b", "web", {}, ingress=[{"from": [{"namespaceSelector": {}}], "ports": [
        {"port": "http"}, {"port": 9000, "endPort": 9010}, {"protocol": "UDP"}]}],
        egress=[{"to": [{"ipBlock": {"cidr": "::/0", "except": ["fd00:88::/64"]}},
                        {"ipBlock": {"cidr": "0.0.0.0/0", "except": [CIDR]}}]}])]
    ruleset = netpol.render([SANDBOX, web], {"a": {}, "b": {}}, policies, CIDR).replace(
        netpol.TABLE, "coderun-netpol-unit-check")
    check = subprocess.run(["nft", "-c", "-f", "-"], input=ruleset, text=True, capture_output=True)
    assert check.returncode == 0, check.stderr


# ------------------------------------------------------------------------------------------ pod entries
def raw_pod(**over):
    obj = {"metadata": {"name": "p", "namespace": "a", "labels": {"x": "y"}, "creationTimestamp": "t"},
           "spec": {"restartPolicy": "Never", "containers": [{"name": "main"}]},
           "status": {"phase": "Running", "podIP": "10.88.0.5",
                      "podIPs": [{"ip": "10.88.0.5"}, {"ip": "fd00:88:0:0::5"}],
                      "containerStatuses": [{"name": "main", "state": {"running": {}}}]}}
    for path, value in over.items():
        section, key = path.split("__")
        obj[section][key] = value
    return obj


def test_pod_entry_keeps_every_pod_ip_normalised():
    assert netpol.pod_entry(raw_pod())["ips"] == ["10.88.0.5", "fd00:88::5"]
    assert netpol.pod_entry(raw_pod(status__podIPs=None))["ips"] == ["10.88.0.5"]


@pytest.mark.parametrize("change", [
    {"metadata__deletionTimestamp": "2026-01-01T00:00:00Z",
     "status__containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 0}}}],
     "spec__restartPolicy": "Always"},
    {"status__phase": "Succeeded"},
    {"status__phase": "Failed"},
    {"status__containerStatuses": [{"name": "main", "state": {"terminated": {"exitCode": 0}}}]},
    {"spec__hostNetwork": True},
    {"status__podIP": None, "status__podIPs": None},
], ids=["terminated", "succeeded", "failed", "containers-ended", "host-network", "no-ip"])
def test_pods_without_traffic_of_their_own_are_forgotten(change):
    assert netpol.pod_entry(raw_pod(**change)) is None


# ------------------------------------------------------------------------------------------ list and watch
class FakeResponse:
    def __init__(self, body):
        self.data = json.dumps(body).encode()


def listing(version, *names):
    return {"metadata": {"resourceVersion": version},
            "items": [raw_pod(metadata__name=n, status__podIPs=[{"ip": f"10.88.0.{i + 10}"}],
                              status__podIP=f"10.88.0.{i + 10}") for i, n in enumerate(names)]}


def test_relist_replaces_the_store_with_exactly_what_was_listed():
    state = netpol.State()
    state.pods["a/deleted-during-the-gap"] = {"stale": True}
    version = netpol.relist(state, state.pods, lambda **kw: FakeResponse(listing("42", "p1", "p2")), netpol.pod_entry)
    assert version == "42"
    assert sorted(state.pods) == ["a/p1", "a/p2"]
    assert state.changed.is_set()


def test_every_watch_restart_lists_again_and_a_deleted_pod_loses_its_rules():
    """The watch breaks (410 Gone) after p1 was deleted and the DELETED event was missed: the relist alone
    must drop it, and the table must no longer name its IP."""
    lists = iter([listing("10", "p0", "p1"), listing("20", "p0")])
    watched_from = []
    state = netpol.State(["pods"])

    def events(list_fn, version):
        watched_from.append(version)
        if version == "10":
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}
            yield {"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}
        else:
            state.done = True
            return
            yield

    netpol.run_watch(state, "pods", lambda **kw: FakeResponse(next(lists)), state.pods, netpol.pod_entry,
                     events=events, stop=lambda: getattr(state, "done", False))
    assert watched_from == ["10", "20"]
    assert sorted(state.pods) == ["a/p0"] and state.synced["pods"].is_set()
    rules = netpol.render(list(state.pods.values()), {}, [], CIDR)
    assert "10.88.0.10" in rules and "10.88.0.11" not in rules


def test_watch_events_are_applied_and_a_clean_end_resumes_from_the_last_version():
    lists = iter([listing("1", "p0")])
    watched_from = []
    state = netpol.State()

    def events(list_fn, version):
        watched_from.append(version)
        if version == "1":
            added = raw_pod(metadata__name="p9", status__podIP="10.88.0.99", status__podIPs=[{"ip": "10.88.0.99"}])
            added["metadata"]["resourceVersion"] = "2"
            deleted = raw_pod(metadata__name="p0")
            deleted["metadata"]["resourceVersion"] = "3"
            yield {"type": "ADDED", "object": added}
            yield {"type": "DELETED", "object": deleted}
        else:
            state.done = True
            return
            yield

    netpol.run_watch(state, "pods", lambda **kw: FakeResponse(next(lists)), state.pods, netpol.pod_entry,
                     events=events, stop=lambda: getattr(state, "done", False))
    assert watched_from == ["1", "3"]  # no second list: the watch simply went on
    assert list(state.pods) == ["a/p9"]


def test_a_terminating_pod_keeps_its_policy_until_its_containers_end():
    """Its grace period is when an operator hands its Lease over: cut off then, the handover waited 30 s."""
    state = netpol.State()
    netpol.apply_event(state, state.pods, {"type": "ADDED", "object": raw_pod(spec__restartPolicy="Always")},
                       netpol.pod_entry)
    terminating = raw_pod(spec__restartPolicy="Always", metadata__deletionTimestamp="2026-01-01T00:00:00Z")
    netpol.apply_event(state, state.pods, {"type": "MODIFIED", "object": terminating}, netpol.pod_entry)
    assert state.pods["a/p"]["ips"] == ["10.88.0.5", "fd00:88::5"]
    terminating["status"]["containerStatuses"] = [{"name": "main", "state": {"terminated": {"exitCode": 0}}}]
    netpol.apply_event(state, state.pods, {"type": "MODIFIED", "object": terminating}, netpol.pod_entry)
    assert state.pods == {}


def test_an_event_that_changes_nothing_the_rules_use_wakes_nobody():
    state = netpol.State()
    netpol.apply_event(state, state.pods, {"type": "ADDED", "object": raw_pod()}, netpol.pod_entry)
    assert state.changed.is_set()
    state.changed.clear()
    ready = raw_pod()
    ready["status"]["conditions"] = [{"type": "Ready", "status": "True"}]  # a status update of the same pod
    netpol.apply_event(state, state.pods, {"type": "MODIFIED", "object": ready}, netpol.pod_entry)
    assert not state.changed.is_set()
    netpol.apply_event(state, state.pods, {"type": "MODIFIED", "object": raw_pod(metadata__labels={"x": "z"})},
                       netpol.pod_entry)
    assert state.changed.is_set() and state.pods["a/p"]["metadata"]["labels"] == {"x": "z"}
    state.changed.clear()
    netpol.apply_event(state, state.pods, {"type": "DELETED", "object": raw_pod()}, netpol.pod_entry)
    assert state.changed.is_set() and state.pods == {}
    state.changed.clear()
    netpol.apply_event(state, state.pods, {"type": "DELETED", "object": raw_pod()}, netpol.pod_entry)
    assert not state.changed.is_set()  # gone already
