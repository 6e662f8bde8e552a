"""An isolated sandbox reaches nothing, over IPv4 or IPv6, by TCP, UDP or ICMP; the enforcer forgets deleted
pods; a fork bomb meets the pod PID limit. Every "blocked" has a control showing the same probe gets through
where nothing blocks it, so no assertion can pass because the probe itself is broken.

These tests run on the cluster's node (the local harness): they read nftables, sysctls and pod cgroups, and
listen on the node themselves to see whether anything from a sandbox arrives.
"""
from __future__ import annotations

import ast
import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from conftest import NAMESPACE_LABELS, wait_for
from framework.standins import CONTROL_PORT, METADATA_V4, METADATA_V6

PYTHON_IMAGE = "coderun.local/sandbox-python:v2"
NETPOL_TABLE = "coderun-netpol"
L2_TABLE = "coderun-l2"
POD_BRIDGE = "cni-coderun0"
POD_PIDS_LIMIT = 1024  # e2e/cluster/cluster.sh, kubelet.yaml
REACHED = {"open", "refused", "reply"}  # a refusal is an answer too: the packet got there

pytestmark = pytest.mark.skipif(not Path(f"/sys/class/net/{POD_BRIDGE}").exists() or os.geteuid() != 0,
                                reason="needs the local harness's node (root, its pod bridge)")

# The probe: Python standard library only, as unprivileged code would write it (ping through SOCK_DGRAM ICMP
# sockets, no raw sockets). TARGETS maps a name to (kind, host, port); every probe runs in parallel with a 3 s
# timeout. It first proves to itself that TCP, UDP and ICMP work in both families over loopback.
PROBE = textwrap.dedent(r'''
    import json, socket, struct, threading, time
    IFINDEX = socket.if_nametoindex("eth0")

    def address(host, port):
        if ":" in host:
            scope = IFINDEX if host.lower().startswith(("fe80", "ff02")) else 0
            return socket.AF_INET6, (host, port, 0, scope)
        return socket.AF_INET, (host, port)

    def outcome(e):
        if isinstance(e, ConnectionRefusedError):
            return "refused"
        if isinstance(e, (socket.timeout, TimeoutError)):
            return "timeout"
        return f"{type(e).__name__}:{getattr(e, 'errno', '')}"

    def tcp(host, port):
        family, addr = address(host, port)
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(3)
        try:
            s.connect(addr)
            return "open"
        except Exception as e:
            return outcome(e)
        finally:
            s.close()

    def udp(host, port):
        family, addr = address(host, port)
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.settimeout(3)
        try:
            s.connect(addr)
            # on port 53 a DNS query the cluster's DNS answers itself (kubernetes.default.svc.cluster.local A),
            # elsewhere any bytes
            s.send(bytes.fromhex("1234010000010000000000000a6b756265726e657465730764656661756c740373766307636c7573746572056c6f63616c0000010001") if port == 53 else b"probe")
            s.recv(100)
            return "reply"
        except Exception as e:
            return outcome(e)
        finally:
            s.close()

    def checksum(data):
        s = sum(struct.unpack(f"!{len(data) // 2}H", data))
        s = (s >> 16) + (s & 0xFFFF)
        return ~(s + (s >> 16)) & 0xFFFF

    def ping(host, _port=0):
        family, addr = address(host, 0)
        proto = socket.IPPROTO_ICMPV6 if family == socket.AF_INET6 else socket.IPPROTO_ICMP
        try:
            s = socket.socket(family, socket.SOCK_DGRAM, proto)
        except Exception as e:
            return "no-socket:" + outcome(e)
        try:
            if family == socket.AF_INET6:
                packet = struct.pack("!BBHHH", 128, 0, 0, 0, 1) + b"coderun!"
                if host.lower().startswith("ff"):
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, IFINDEX)
            else:
                packet = struct.pack("!BBHHH", 8, 0, 0, 0, 1) + b"coderun!"
                packet = packet[:2] + struct.pack("!H", checksum(packet)) + packet[4:]
            s.sendto(packet, addr)
            repliers, deadline = set(), time.monotonic() + 3
            while time.monotonic() < deadline:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    data, sender = s.recvfrom(200)
                except (socket.timeout, TimeoutError):
                    break
                if data and data[0] in (0, 129):  # echo reply, ICMP or ICMPv6
                    repliers.add(sender[0])
                    if not host.lower().startswith("ff"):
                        break
            return ("reply " + " ".join(sorted(repliers))) if repliers else "timeout"
        except Exception as e:
            return outcome(e)
        finally:
            s.close()

    def serve_loopback():
        """TCP and UDP echo on 127.0.0.1 and ::1, for the probe's own control."""
        ports = {}
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            t = socket.socket(family, socket.SOCK_STREAM)
            t.bind((host, 0))
            t.listen()
            u = socket.socket(family, socket.SOCK_DGRAM)
            u.bind((host, 0))
            def echo(u=u):
                while True:
                    data, sender = u.recvfrom(100)
                    u.sendto(data, sender)
            threading.Thread(target=echo, daemon=True).start()
            threading.Thread(target=lambda t=t: [t.accept()[0].close() for _ in iter(int, 1)], daemon=True).start()
            ports[host] = (t.getsockname()[1], u.getsockname()[1])
        return ports

    KINDS = {"tcp": tcp, "udp": udp, "ping": ping}
    results = {}

    def run_all(targets, suffix=""):
        threads = [threading.Thread(target=lambda k=k, v=v: results.__setitem__(k + suffix, KINDS[v[0]](*v[1:])))
                   for k, v in targets.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    loopback = serve_loopback()
    targets = dict(TARGETS)
    for host, (tcp_port, udp_port) in loopback.items():
        family = "lo6" if ":" in host else "lo4"
        targets[f"{family}_tcp"] = ("tcp", host, tcp_port)
        targets[f"{family}_udp"] = ("udp", host, udp_port)
        targets[f"{family}_ping"] = ("ping", host, 0)
    for _ in range(int(WAIT_FOR_SELF_SECONDS * 5)):  # the control only: until the enforcer knows this pod
        if tcp(*TARGETS["v4_same_ns_tcp"][1:]) == "open":
            break
        time.sleep(0.2)
    run_all(targets)
    # A second round, after the first one's 3 s timeouts: by then the enforcer (sub-second) surely knows this
    # pod, so a block in this round is its policy's doing, not the rule for pod IPs it does not know yet.
    run_all({k: v for k, v in targets.items() if not k.startswith("lo")}, "@2")
    # Whatever answered the all-nodes multicast ping would be the next thing an attacker tries.
    found = {}
    for i, host in enumerate(sorted({h for k, v in results.items() if k.startswith("discover")
                                     and v.startswith("reply ") for h in v.split()[1:]})):
        found[f"found{i}_{host}_6443"] = ("tcp", host, 6443)
        found[f"found{i}_{host}_10250"] = ("tcp", host, 10250)
    run_all(found)
    inet6 = [line.split() for line in open("/proc/net/if_inet6").read().splitlines()]
    results["own_ipv6"] = sorted(f"{fields[5]}:{fields[0]}" for fields in inet6 if fields[5] != "lo")
    print(json.dumps(results, sort_keys=True))
''')

LISTENER = textwrap.dedent(r'''
    import socket, threading
    def udp():
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", 5353))
        while True:
            data, sender = s.recvfrom(100)
            s.sendto(data, sender)
    threading.Thread(target=udp, daemon=True).start()
    t = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    t.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    t.bind(("::", 8080))
    t.listen()
    print("own_ipv6", [l.split()[0] for l in open("/proc/net/if_inet6") if l.split()[5] != "lo"], flush=True)
    while True:
        c, _ = t.accept()
        c.sendall(b"HTTP/1.0 200 OK\r\n\r\nsecret\n")
        c.close()
''')


# ------------------------------------------------------------------------------------------ node helpers
def nft(*args: str) -> str:
    return subprocess.run(["nft", *args], capture_output=True, text=True, check=True).stdout


def names_ip(table_text: str, ip: str) -> bool:
    return re.search(rf"(?<![\w.:]){re.escape(ip)}(?![\w.:/])", table_text) is not None


def node_ipv6_addresses() -> list[str]:
    """Every IPv6 address the node has, but loopback (the pod bridge has none any more)."""
    out = subprocess.run(["ip", "-6", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines() if line.split()[1] != "lo"]


class NodeListener:
    """TCP and UDP (echo) sockets on the node, IPv4 on the node's address (so replies leave from the address
    that was asked) and IPv6 on all addresses, recording who got through."""

    def __init__(self, node_ip: str):
        self.peers: set[str] = set()
        self.sockets = {}
        for family, host in ((socket.AF_INET, node_ip), (socket.AF_INET6, "::")):
            for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
                s = socket.socket(family, kind)
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.bind((host, 0))
                self.sockets[(family, kind)] = s
                if kind == socket.SOCK_STREAM:
                    s.listen()
                threading.Thread(target=self._accept if kind == socket.SOCK_STREAM else self._echo, args=(s,),
                                 daemon=True).start()

    def port(self, family: int, kind: int) -> int:
        return self.sockets[(family, kind)].getsockname()[1]

    def _accept(self, s):
        while True:
            try:
                conn, sender = s.accept()
            except OSError:
                return
            self.peers.add(sender[0])
            conn.close()

    def _echo(self, s):
        while True:
            try:
                data, sender = s.recvfrom(100)
            except OSError:
                return
            self.peers.add(sender[0])
            s.sendto(data, sender)

    def close(self):
        for s in self.sockets.values():
            s.close()


# ------------------------------------------------------------------------------------------ cluster helpers
def create_namespace(cluster, name: str) -> None:
    cluster.core.create_namespace({"metadata": {"name": name, "labels": NAMESPACE_LABELS}})


def deny_all(cluster, namespace: str) -> None:
    cluster.networking.create_namespaced_network_policy(namespace, {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny-all"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}})


def enforcer_knows(cluster, namespace: str, name: str) -> str:
    """The pod's IP once it runs and the enforcer has rendered it (before that it may not talk at all)."""
    def known():
        pod = cluster.core.read_namespaced_pod(name, namespace)
        ip = pod.status.pod_ip
        return pod.status.phase == "Running" and ip and names_ip(nft("list", "set", "inet", NETPOL_TABLE,
                                                                          "known_pods"), ip) and ip
    return wait_for(known, 90, f"{namespace}/{name} running and known to the enforcer")


def listener_ipv6(cluster, namespace: str, name: str) -> list[str]:
    def line():
        return next((l for l in cluster.logs(namespace, name).splitlines() if l.startswith("own_ipv6")), None)
    raw = ast.literal_eval(wait_for(line, 30, f"{name} to report its addresses").split(" ", 1)[1])
    return [str(ipaddress.IPv6Address(int(h, 16))) for h in raw]


def probe_targets(node_ip: str, node_v6: list[str], listener: NodeListener, same: tuple[str, list[str]],
                  other: tuple[str, list[str]]) -> dict:
    targets = {
        "v4_node_apiserver": ("tcp", node_ip, 6443), "v4_node_kubelet": ("tcp", node_ip, 10250),
        "v4_service_kubernetes": ("tcp", "10.96.0.1", 443), "v4_metadata": ("tcp", METADATA_V4, 80),
        "v4_node_listener_tcp": ("tcp", node_ip, listener.port(socket.AF_INET, socket.SOCK_STREAM)),
        "v4_node_listener_udp": ("udp", node_ip, listener.port(socket.AF_INET, socket.SOCK_DGRAM)),
        "v4_node_udp_53": ("udp", node_ip, 53), "v4_node_ping": ("ping", node_ip),
        "v4_gateway_ping": ("ping", "10.88.0.1"),
        "v4_same_ns_tcp": ("tcp", same[0], 8080), "v4_same_ns_udp": ("udp", same[0], 5353),
        "v4_same_ns_ping": ("ping", same[0]),
        "v4_other_ns_denied_tcp": ("tcp", other[0], 8080), "v4_other_ns_denied_udp": ("udp", other[0], 5353),
        "v4_other_ns_denied_ping": ("ping", other[0]),
        "v6_discover_all_nodes": ("ping", "ff02::1"), "v6_metadata": ("tcp", METADATA_V6, 80),
        "v4_metadata_control_port": ("tcp", METADATA_V4, CONTROL_PORT),
    }
    for i, address in enumerate(node_v6):
        targets.update({f"v6_node{i}_apiserver": ("tcp", address, 6443),
                        f"v6_node{i}_kubelet": ("tcp", address, 10250),
                        f"v6_node{i}_listener_tcp": ("tcp", address, listener.port(socket.AF_INET6,
                                                                                     socket.SOCK_STREAM)),
                        f"v6_node{i}_listener_udp": ("udp", address, listener.port(socket.AF_INET6,
                                                                                   socket.SOCK_DGRAM)),
                        f"v6_node{i}_ping": ("ping", address)})
    for label, (_, addresses) in (("same_ns", same), ("other_ns_denied", other)):
        for i, address in enumerate(addresses):
            targets.update({f"v6_{label}{i}_tcp": ("tcp", address, 8080),
                            f"v6_{label}{i}_udp": ("udp", address, 5353), f"v6_{label}{i}_ping": ("ping", address)})
    return targets


def probe_code(targets: dict, wait_for_self: float = 0) -> str:
    return f"TARGETS = {json.dumps(targets)}\nWAIT_FOR_SELF_SECONDS = {wait_for_self}\n" + PROBE


def loopback_works(report: dict) -> None:
    """The probe's own control: TCP, UDP and ICMP echo work in both families where nothing blocks them."""
    for family in ("lo4", "lo6"):
        assert report[f"{family}_tcp"] == "open", report
        assert report[f"{family}_udp"] == "reply", report
        assert report[f"{family}_ping"].startswith("reply"), report


# ------------------------------------------------------------------------------------------ the tests
def test_isolated_sandbox_reaches_nothing_over_ipv4_or_ipv6(operator, namespace, standin_hits):
    cluster = operator
    other = f"{namespace}-other"
    create_namespace(cluster, other)
    listener = NodeListener(cluster.node_ip())
    try:
        deny_all(cluster, other)
        for ns in (namespace, other):
            cluster.create_pod(ns, "listener", ["python3", "-c", LISTENER], image=PYTHON_IMAGE,
                               labels={"role": "listener"})
        same = (enforcer_knows(cluster, namespace, "listener"), listener_ipv6(cluster, namespace, "listener"))
        denied = (enforcer_knows(cluster, other, "listener"), listener_ipv6(cluster, other, "listener"))
        node_ip = cluster.node_ip()
        targets = probe_targets(node_ip, node_ipv6_addresses(), listener, same, denied)

        # The isolated sandbox: a CodeRun, so the operator's own pod and NetworkPolicies apply.
        run = cluster.create_run(namespace, {"language": "python", "code": probe_code(targets),
                                             "limits": {"timeoutSeconds": 40, "cpu": "500m"}})
        # The control: the same probe in a gVisor pod that no NetworkPolicy selects, but for the metadata stand-in's
        # own ports (no pod may reach those: a test beside counts a hit there as a hole) which its control port,
        # the same address, stands for.
        control_targets = {k: v for k, v in targets.items() if k not in ("v4_metadata", "v6_metadata")}
        cluster.create_pod(namespace, "control", ["python3", "-c", probe_code(control_targets, wait_for_self=20)],
                           image=PYTHON_IMAGE, labels={"role": "control"})
        status = cluster.wait_run(namespace, run, timeout=120)["status"]
        assert status["phase"] == "Succeeded", (status.get("reason"), status.get("message"), status.get("stderr"))
        isolated = json.loads(status["stdout"])
        assert cluster.wait_pod_done(namespace, "control", timeout=120) == "Succeeded", cluster.logs(namespace,
                                                                                                    "control")
        control = json.loads(cluster.logs(namespace, "control").strip().splitlines()[-1])
        control_ip = cluster.pod_ip(namespace, "control")
    finally:
        listener.close()
        cluster.core.delete_namespace(other, propagation_policy="Background")

    print("isolated sandbox:", json.dumps(isolated, sort_keys=True), "\ncontrol pod:", json.dumps(control, sort_keys=True),
          "\nnode listener saw:", sorted(listener.peers))
    # The probe works in both pods, in both families.
    loopback_works(isolated)
    loopback_works(control)

    # Positive control, IPv4: the same probes, in both rounds, from a pod no policy selects get through.
    must_reach = ["v4_node_apiserver", "v4_node_kubelet", "v4_service_kubernetes", "v4_node_listener_tcp",
                  "v4_node_listener_udp", "v4_node_udp_53", "v4_same_ns_tcp", "v4_same_ns_udp", "v4_node_ping",
                  "v4_gateway_ping", "v4_same_ns_ping", "v4_metadata_control_port"]
    missed = {n: control[n + r] for n in must_reach for r in ("", "@2") if not reached(control[n + r])}
    assert missed == {}, (missed, control)
    # ... while the other namespace's deny-all keeps even the control out.
    assert not any(reached(control[n + r]) for n in ("v4_other_ns_denied_tcp", "v4_other_ns_denied_udp",
                                                     "v4_other_ns_denied_ping") for r in ("", "@2")), control

    # IPv6 has no path on the pod network at all (cluster.sh, netpol.py): no pod has an IPv6 address but
    # loopback, and nothing answers, not even a pod no policy selects.
    for report, who in ((isolated, "sandbox"), (control, "control")):
        assert report["own_ipv6"] == [], (who, report["own_ipv6"])
    assert not same[1] and not denied[1], (same, denied)
    v6_reached = {n: r for n, r in control.items() if n.startswith(("v6_", "found")) and reached(r)}
    assert v6_reached == {}, v6_reached

    # The isolated sandbox: nothing, in either family, by any protocol, in either round.
    assert all(name in isolated and f"{name}@2" in isolated for name in targets), "every target was probed"
    got_through = {n: r for n, r in isolated.items() if not n.startswith(("lo4", "lo6", "own_")) and reached(r)}
    assert got_through == {}, got_through
    # What the node's own listener saw: the control pod, and nobody else.
    assert control_ip in listener.peers and listener.peers <= {control_ip}, listener.peers
    # And what the metadata stand-in saw: the control pod on its control port, no pod on its own ports.
    assert {h["peer"].rsplit(":", 1)[0] for h in standin_hits.from_pods(CONTROL_PORT)} == {control_ip}, \
        standin_hits.since()
    standin_hits.assert_no_pod_reached_them()


def reached(result) -> bool:
    return isinstance(result, str) and (result in REACHED or result.startswith("reply"))


def _netns_python(netns: str, code: str, *args: str, timeout: float = 15) -> str:
    result = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", code, *args],
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _l2_drops() -> int:
    table = json.loads(nft("-j", "list", "table", "bridge", L2_TABLE))
    return sum(e["counter"]["packets"] for item in table["nftables"] if "rule" in item
               for e in item["rule"]["expr"] if "counter" in e)


def test_ipv6_has_no_path_on_the_pod_bridge_even_for_a_port_that_has_addresses():
    """Below the pods' own lack of IPv6: two network namespaces plugged into the pod bridge like pods, with
    IPv6 addresses that CNI would never give them, and IPv4 addresses outside the pod CIDR (so the enforcer's
    IPv4 rules leave them alone). IPv4 and ARP pass between them; IPv6, unicast or multicast, does not,
    and the node has no IPv6 on the bridge to answer."""
    assert Path(f"/proc/sys/net/ipv6/conf/{POD_BRIDGE}/disable_ipv6").read_text().strip() == "1"
    bridge_v6 = subprocess.run(["ip", "-6", "addr", "show", "dev", POD_BRIDGE], capture_output=True,
                               text=True).stdout
    assert "inet6" not in bridge_v6, bridge_v6
    assert f"iifname \"{POD_BRIDGE}\" ip6 saddr != @known_pods6" in nft("list", "table", "inet", NETPOL_TABLE)

    tag = uuid.uuid4().hex[:6]
    spaces = [f"crv6-{tag}-{side}" for side in "ab"]
    ports = [f"veth{tag}{side}" for side in "ab"]  # pod ports are veth*: the bridge table's match
    try:
        for i, (netns, port) in enumerate(zip(spaces, ports), start=1):
            for cmd in (f"ip netns add {netns}", f"ip link add {port} type veth peer name eth0 netns {netns}",
                        f"ip link set {port} master {POD_BRIDGE} up",
                        f"ip netns exec {netns} sysctl -qw net.ipv6.conf.eth0.accept_dad=0",
                        f"ip -n {netns} addr add 192.168.251.{i}/24 dev eth0",
                        f"ip -n {netns} addr add fd99:88::{i}/64 dev eth0 nodad",
                        f"ip -n {netns} link set eth0 up", f"ip -n {netns} link set lo up"):
                subprocess.run(cmd.split(), check=True, capture_output=True)
        server = subprocess.Popen(["ip", "netns", "exec", spaces[1], sys.executable, "-c", textwrap.dedent("""
            import socket
            s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            s.bind(("::", 7))
            print("ready", flush=True)
            while True:
                data, sender = s.recvfrom(100)
                s.sendto(data, sender)
        """)], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "ready"
            # The link-local address appears once the veth has carrier (the kernel's link watch may lag).
            find_link_local = ("print(next((l.split()[0] for l in open('/proc/net/if_inet6') "
                               "if l.split()[5] == 'eth0' and l.startswith('fe80')), ''))")
            link_local = wait_for(lambda: _netns_python(spaces[1], find_link_local), 15, "a link-local address")
            link_local = str(ipaddress.IPv6Address(int(link_local, 16)))
            client = textwrap.dedent(f"""
                import json, socket, struct, sys
                idx = socket.if_nametoindex("eth0")
                def udp(family, addr):
                    s = socket.socket(family, socket.SOCK_DGRAM); s.settimeout(2)
                    try:
                        s.connect(addr); s.send(b"x"); s.recv(10); return "reply"
                    except Exception as e:
                        return type(e).__name__
                def all_nodes():
                    s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6); s.settimeout(2)
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, idx)
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_LOOP, 0)
                    s.sendto(struct.pack("!BBHHH", 128, 0, 0, 0x77, 1), ("ff02::1", 0, 0, idx))
                    got = set()
                    try:
                        while True:
                            data, sender = s.recvfrom(100)
                            if data[0] == 129: got.add(sender[0])
                    except Exception:
                        return sorted(got)
                if sys.argv[1] == "v4":
                    print(udp(socket.AF_INET, ("192.168.251.2", 7)))
                else:
                    print(json.dumps({{
                        "v6_global": udp(socket.AF_INET6, ("fd99:88::2", 7, 0, 0)),
                        "v6_link_local": udp(socket.AF_INET6, ("{link_local}", 7, 0, idx)),
                        "v6_all_nodes": all_nodes()}}))
            """)
            # The control first: the bridge forwards these ports' IPv4 (and ARP) once their links are up.
            wait_for(lambda: _netns_python(spaces[0], client, "v4") == "reply", 20, "IPv4 between the two ports")
            drops_before = _l2_drops()
            result = json.loads(_netns_python(spaces[0], client, "v6"))
        finally:
            server.kill()
            server.wait()
    finally:
        for netns, port in zip(spaces, ports):
            subprocess.run(["ip", "link", "del", port], capture_output=True)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
    assert result["v6_global"] != "reply" and result["v6_link_local"] != "reply", result
    assert result["v6_all_nodes"] == [], result
    assert _l2_drops() > drops_before, "the bridge table dropped the IPv6 frames"


def test_a_terminating_pod_keeps_its_rules_until_its_containers_end(cluster, namespace):
    """An allowed client's IP is in the server's rules. Deleted, the client still runs through its grace period
    (it ignores SIGTERM), as an operator handing its Lease over does, and keeps its rules, as Calico and Cilium
    keep an endpoint until its sandbox is gone; once its containers have ended its IP is gone from the table
    (and a newer pod given the same IP meanwhile wins it: test_netpol)."""
    allow = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "server"},
             "spec": {"podSelector": {"matchLabels": {"role": "server"}}, "policyTypes": ["Ingress"],
                      "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]}}
    cluster.networking.create_namespaced_network_policy(namespace, allow)
    sleeper = ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"]
    cluster.create_pod(namespace, "server", sleeper, runtime_class=None, labels={"role": "server"})
    cluster.create_pod(namespace, "client", sleeper, runtime_class=None, labels={"role": "client"})
    client_ip = enforcer_knows(cluster, namespace, "client")
    enforcer_knows(cluster, namespace, "server")

    def server_rules():
        return nft("list", "table", "inet", NETPOL_TABLE)
    wait_for(lambda: re.search(rf"ip saddr (\{{ )?{re.escape(client_ip)}( \}})? return", server_rules()), 30,
             "the server's ingress rule to name the client")

    cluster.core.delete_namespaced_pod("client", namespace)
    # The enforcer reads pod events in order: once it knows a pod created after the deletion, it has seen it.
    cluster.create_pod(namespace, "marker", sleeper, runtime_class=None, labels={"role": "marker"})
    enforcer_knows(cluster, namespace, "marker")
    assert cluster.core.read_namespaced_pod("client", namespace).metadata.deletion_timestamp is not None
    assert names_ip(server_rules(), client_ip), "a terminating pod lost its rules while it still runs"

    cluster.core.delete_namespaced_pod("client", namespace, grace_period_seconds=0)
    wait_for(lambda: not names_ip(server_rules(), client_ip), 30, f"the table to forget {client_ip}")


BOMB = textwrap.dedent("""
    import os, time
    forked, error = 0, None
    deadline = time.monotonic() + 60
    while forked < 3000 and time.monotonic() < deadline:  # a cap, so a missing limit fails, not the node
        try:
            if os.fork() == 0:
                time.sleep(120)
                os._exit(0)
            forked += 1
        except OSError as e:
            error = e
            break
    print("forked", forked, "then", repr(error), flush=True)
    time.sleep(120)
""")


def _pod_pids_cgroup(uid: str) -> Path | None:
    return next(Path("/sys/fs/cgroup/pids/kubepods").rglob(f"pod{uid}"), None)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def test_fork_bomb_is_stopped_by_the_pod_pid_limit_and_the_node_stays_healthy(cluster, namespace):
    kubepods = Path("/sys/fs/cgroup/pids/kubepods")
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert int(kubepods.joinpath("pids.max").read_text()) < pid_max, "node PIDs are reserved from pods"

    cluster.create_pod(namespace, "bomb", ["python3", "-c", BOMB], image=PYTHON_IMAGE)
    uid = cluster.core.read_namespaced_pod("bomb", namespace).metadata.uid
    cgroup = wait_for(lambda: _pod_pids_cgroup(uid), 60, "the bomb's pod cgroup")
    assert _read(cgroup / "pids.max").strip() == str(POD_PIDS_LIMIT)

    highest, limit_hits = 0, 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        current, peak, events = (_read(cgroup / f) for f in ("pids.current", "pids.peak", "pids.events"))
        if current is None:  # the cgroup is gone: the pod's sandbox ended
            break
        highest = max(highest, int(current), int(peak) if peak else 0)
        limit_hits = max(limit_hits, int(events.split()[1]) if events else 0)
        if limit_hits and cluster.pod_phase(namespace, "bomb") in ("Succeeded", "Failed"):
            break
        time.sleep(0.1)
    print(f"bomb: highest {highest} tasks, pids.max {POD_PIDS_LIMIT}, limit hit {limit_hits} times")
    assert limit_hits > 0, f"the bomb never met the limit (highest {highest} tasks)"
    assert highest <= POD_PIDS_LIMIT, highest
    # Then the bomb's fork fails, or (as measured with gVisor's systrap platform) its whole sandbox exits.
    phase = cluster.wait_pod_done(namespace, "bomb", timeout=150)
    print("bomb pod:", phase, cluster.core.read_namespaced_pod("bomb", namespace).status.container_statuses[0].state)
    cluster.core.delete_namespaced_pod("bomb", namespace, grace_period_seconds=0)

    # The node is healthy: kubelet answers, the node is Ready, a new gVisor pod runs.
    subprocess.run(["curl", "-fsS", "http://127.0.0.1:10248/healthz"], check=True, capture_output=True)
    node = cluster.core.list_node().items[0]
    assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    cluster.create_pod(namespace, "after", ["sh", "-c", "echo alive"])
    assert cluster.wait_pod_done(namespace, "after") == "Succeeded" and "alive" in cluster.logs(namespace, "after")
    assert phase in ("Succeeded", "Failed")
