"""A NetworkPolicy enforcer for the local cluster: watches pods, namespaces and NetworkPolicies and renders
them, whole, into one nftables table that it swaps atomically on every change.

Why our own: the reference enforcers (sigs.k8s.io/kube-network-policies, kube-router) cannot be fetched on
this machine (the Go module proxy answers 403 for them), and a default-deny test must mean something.
Semantics follow networking.k8s.io/v1: a pod is isolated for a direction when a policy selecting it lists
that direction; allowed traffic is the union of the rules of the policies selecting it; replies of allowed
connections pass. Two deliberate choices, both fail-closed, for sandboxes:
  - traffic from an isolated pod to the node (and so to a Service backed by a host-network API server) is
    egress like any other and needs a rule;
  - a pod IP the enforcer does not know yet may not start connections until it does (no start-up window).
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import subprocess
import threading
import time
from typing import Iterable

from kubernetes import client, config, watch

TABLE = "coderun-netpol"
log = logging.getLogger("netpol")


# ------------------------------------------------------------------------------------------ pure selection
def matches(selector: dict | None, labels: dict | None) -> bool:
    """metav1.LabelSelector semantics: an empty selector matches everything, a missing one nothing."""
    if selector is None:
        return False
    labels = labels or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def peer_ips(peer: dict, policy_ns: str, pods: Iterable[dict], namespaces: dict[str, dict]) -> list[str]:
    """IPs (or CIDRs) one NetworkPolicyPeer allows."""
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        net = ipaddress.ip_network(block["cidr"], strict=False)
        nets = [net]
        for excluded in block.get("except") or ():
            ex = ipaddress.ip_network(excluded, strict=False)
            nets = [part for n in nets for part in (n.address_exclude(ex) if ex.subnet_of(n) else [n])]
        return [str(n) for n in nets if n.version == 4]
    ns_selector, pod_selector = peer.get("namespaceSelector"), peer.get("podSelector")
    out = []
    for pod in pods:
        ns = pod["metadata"]["namespace"]
        if ns_selector is not None:
            if not matches(ns_selector, namespaces.get(ns, {}).get("labels")):
                continue
        elif ns != policy_ns:
            continue
        if pod_selector is not None and not matches(pod_selector, pod["metadata"].get("labels")):
            continue
        out.append(pod["ip"])
    return out


def port_matches(ports: list[dict] | None, target_pod: dict | None) -> list[str]:
    """nft match fragments for a rule's ports ([""] = any port). Named ports resolve on the target pod."""
    if not ports:
        return [""]
    out = []
    for p in ports:
        proto = (p.get("protocol") or "TCP").lower()
        port = p.get("port")
        if port is None:
            out.append(f"meta l4proto {proto}")
            continue
        if isinstance(port, str) and not port.isdigit():
            numbers = [cp["containerPort"] for cp in (target_pod or {}).get("ports", [])
                       if cp.get("name") == port and (cp.get("protocol") or "TCP").lower() == proto]
            out.extend(f"{proto} dport {n}" for n in numbers)
            continue
        end = p.get("endPort")
        out.append(f"{proto} dport {int(port)}-{int(end)}" if end else f"{proto} dport {int(port)}")
    return out


def render(pods: list[dict], namespaces: dict[str, dict], policies: list[dict], pod_cidr: str) -> str:
    """The whole nftables table for the current state: one chain per isolated pod and direction."""
    lines = [f"table inet {TABLE} {{"]
    known = sorted({p["ip"] for p in pods})
    lines.append("  set known_pods { type ipv4_addr; " + (f"elements = {{ {', '.join(known)} }}; " if known else "")
                 + "}")
    forward, input_ = [], []
    chains = []
    for i, pod in enumerate(pods):
        ns, labels = pod["metadata"]["namespace"], pod["metadata"].get("labels")
        selecting = [np for np in policies if np["metadata"]["namespace"] == ns
                     and matches(np["spec"].get("podSelector", {}), labels)]
        for direction, addr_peer, addr_pod, hooks in (("Ingress", "saddr", "daddr", (forward,)),
                                                      ("Egress", "daddr", "saddr", (forward, input_))):
            isolating = [np for np in selecting if direction in _policy_types(np["spec"])]
            if not isolating:
                continue
            chain = f"{direction.lower()}_{i}"
            body = []
            for np in isolating:
                for rule in np["spec"].get(direction.lower()) or ():
                    peers = rule.get("from" if direction == "Ingress" else "to")
                    if peers:
                        ips = sorted({ip for peer in peers for ip in peer_ips(peer, ns, pods, namespaces)})
                        if not ips:
                            continue
                        peer_match = f"ip {addr_peer} {{ {', '.join(ips)} }}"
                    else:
                        peer_match = ""
                    targets = [pod] if direction == "Ingress" else (
                        [p for p in pods if not peers or p["ip"] in ips] or [None])
                    for target in targets:
                        for port in port_matches(rule.get("ports"), target):
                            body.append("    " + " ".join(filter(None, (peer_match, port, "accept"))))
            body.append(f'    counter drop comment "{ns}/{pod["metadata"]["name"]} {direction.lower()}"')
            chains.append((chain, body))
            for hook in hooks:
                hook.append(f"    ip {addr_pod} {pod['ip']} jump {chain}")
    for chain, body in chains:
        lines += [f"  chain {chain} {{", *dict.fromkeys(body), "  }"]
    established = "    ct state established,related accept"
    unknown = f"    ip saddr {pod_cidr} ip saddr != @known_pods ct state new counter drop"
    lines += ["  chain forward {", "    type filter hook forward priority 0; policy accept;", established, unknown,
              *forward, "  }",
              "  chain input {", "    type filter hook input priority 0; policy accept;", established, unknown,
              *input_, "  }", "}"]
    return "\n".join(lines) + "\n"


def _policy_types(spec: dict) -> list[str]:
    if spec.get("policyTypes"):
        return spec["policyTypes"]
    return ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]


# ------------------------------------------------------------------------------------------ I/O
class State:
    def __init__(self):
        self.pods: dict[str, dict] = {}
        self.namespaces: dict[str, dict] = {}
        self.policies: dict[str, dict] = {}
        self.changed = threading.Event()
        self.lock = threading.Lock()


def _watch(state: State, kind: str, list_fn, store: dict, to_entry) -> None:
    api = client.ApiClient()
    while True:
        try:
            for event in watch.Watch().stream(list_fn, timeout_seconds=300, _request_timeout=330):
                obj = api.sanitize_for_serialization(event["object"])
                key = f'{obj["metadata"].get("namespace", "")}/{obj["metadata"]["name"]}'
                entry = None if event["type"] == "DELETED" else to_entry(obj)
                with state.lock:
                    if entry is None:
                        store.pop(key, None)
                    else:
                        store[key] = entry
                state.changed.set()
        except Exception as e:  # a dropped watch is normal: list and watch again
            log.warning("%s watch ended (%s); restarting", kind, e)
            time.sleep(1)


def _pod_entry(obj: dict) -> dict | None:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if spec.get("hostNetwork") or not status.get("podIP") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    ports = [p for c in spec.get("containers") or () for p in c.get("ports") or ()]
    return {"metadata": obj["metadata"], "ip": status["podIP"], "ports": ports}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--pod-cidr", default="10.88.0.0/16")
    parser.add_argument("--node", default="")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config.load_kube_config(args.kubeconfig)
    core, networking = client.CoreV1Api(), client.NetworkingV1Api()
    state = State()
    watches = [
        ("pods", core.list_pod_for_all_namespaces, state.pods, _pod_entry),
        ("namespaces", core.list_namespace, state.namespaces, lambda o: {"labels": o["metadata"].get("labels")}),
        ("networkpolicies", networking.list_network_policy_for_all_namespaces, state.policies, lambda o: o),
    ]
    for kind, fn, store, entry in watches:
        threading.Thread(target=_watch, args=(state, kind, fn, store, entry), daemon=True, name=kind).start()
    applied = None
    while True:
        state.changed.wait()
        state.changed.clear()
        with state.lock:
            pods = sorted((p for p in state.pods.values()), key=lambda p: (p["metadata"]["namespace"],
                                                                          p["metadata"]["name"]))
            namespaces = {k.strip("/"): v for k, v in state.namespaces.items()}
            policies = list(state.policies.values())
        ruleset = render(pods, namespaces, policies, args.pod_cidr)
        if ruleset == applied:
            continue
        # Adding then deleting the table inside one transaction replaces it atomically.
        script = f"table inet {TABLE}\ndelete table inet {TABLE}\n{ruleset}"
        result = subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True)
        if result.returncode != 0:
            log.error("nft refused the ruleset: %s\n%s", result.stderr.strip(), ruleset)
        else:
            applied = ruleset
            log.info("applied: %d pods, %d policies", len(pods), len(policies))


if __name__ == "__main__":
    main()
