"""A NetworkPolicy enforcer for the local cluster: watches pods, namespaces and NetworkPolicies and renders
them, whole, into one nftables table that it swaps atomically on every change.

Why our own: the reference enforcers (sigs.k8s.io/kube-network-policies, kube-router) cannot be fetched on
this machine (the Go module proxy answers 403 for them), and a default-deny test must mean something.
Semantics follow networking.k8s.io/v1: a pod is isolated for a direction when a policy selecting it lists
that direction; allowed traffic is the union of the rules of the policies selecting it; replies of allowed
connections pass. Both address families are rendered (a pod's status.podIPs, ipBlocks of either family); an
isolated pod's chain ends in a drop, so everything not allowed (TCP, UDP, ICMP, ICMPv6, any protocol) is
dropped. Deliberate choices, all fail-closed, for sandboxes:
  - traffic from an isolated pod to the node (and so to a Service backed by a host-network API server) is
    egress like any other and needs a rule;
  - a pod IPv4 address the enforcer does not know yet may neither start nor receive new connections;
  - IPv6 from or to the pod bridge with a pod address the enforcer does not know (this cluster's pods have
    no IPv6 addresses in the API, so: every link-local one) is dropped outright, established or not;
  - the stores are rebuilt from a full list on every (re)start of a watch, and nothing is applied before
    all three have been listed once, so a restart never opens what was closed;
  - a terminating or finished pod is forgotten at once; when two pods claim one IP the newest owns it.
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import subprocess
import threading
import time
from typing import Callable, Iterable

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


def ip_block_networks(block: dict) -> list[str]:
    """An ipBlock (IPv4 or IPv6) as CIDRs: cidr minus its excepts (excepts of the other family are ignored)."""
    net = ipaddress.ip_network(block["cidr"], strict=False)
    nets = [net]
    for excluded in block.get("except") or ():
        ex = ipaddress.ip_network(excluded, strict=False)
        if ex.version != net.version:
            continue
        nets = [part for n in nets for part in (n.address_exclude(ex) if ex.subnet_of(n) else
                                                 [] if n.subnet_of(ex) else [n])]
    return [str(n) for n in nets]


def peer_ips(peer: dict, policy_ns: str, pods: Iterable[dict], namespaces: dict[str, dict]) -> list[str]:
    """Addresses (or CIDRs), of both families, one NetworkPolicyPeer allows."""
    if "ipBlock" in peer:
        return ip_block_networks(peer["ipBlock"])
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
        out.extend(pod["ips"])
    return out


def family_matches(field: str, addrs: Iterable[str]) -> list[str]:
    """nft address matches for a mixed list of addresses/CIDRs: one `ip` and/or one `ip6` fragment.
    Networks are collapsed first: nft refuses overlapping intervals in one set."""
    nets = [ipaddress.ip_network(a, strict=False) for a in addrs]
    out = []
    for version, keyword in ((4, "ip"), (6, "ip6")):
        same = list(ipaddress.collapse_addresses(n for n in nets if n.version == version))
        if same:
            items = [str(n.network_address) if n.prefixlen == n.max_prefixlen else str(n) for n in same]
            out.append(f"{keyword} {field} {{ {', '.join(items)} }}")
    return out


def _contained(ip: str, addrs: Iterable[str]) -> bool:
    address = ipaddress.ip_address(ip)
    return any(address in ipaddress.ip_network(a, strict=False) for a in addrs
               if ipaddress.ip_network(a, strict=False).version == address.version)


def _is_named(port: dict) -> bool:
    value = port.get("port")
    return isinstance(value, str) and not value.isdigit()


def port_matches(ports: list[dict], target_pod: dict | None) -> list[str]:
    """nft match fragments for a non-empty list of ports. Named ports resolve on the target pod."""
    out = []
    for p in ports:
        proto = (p.get("protocol") or "TCP").lower()
        port = p.get("port")
        if port is None:
            out.append(f"meta l4proto {proto}")
            continue
        if _is_named(p):
            numbers = [cp["containerPort"] for cp in (target_pod or {}).get("ports", [])
                       if cp.get("name") == port and (cp.get("protocol") or "TCP").lower() == proto]
            out.extend(f"{proto} dport {n}" for n in numbers)
            continue
        end = p.get("endPort")
        out.append(f"{proto} dport {int(port)}-{int(end)}" if end else f"{proto} dport {int(port)}")
    return out


def own_ips(pods: list[dict]) -> list[dict]:
    """Each IP belongs to one pod only, the newest that claims it (a stale entry never lends its rules to
    the pod that reuses its address); pods left without an IP are dropped."""
    owner: dict[str, int] = {}
    for index, pod in sorted(enumerate(pods), key=lambda ip: (ip[1]["metadata"].get("creationTimestamp") or "",
                                                              ip[0])):
        for ip in pod["ips"]:
            owner[ip] = index
    out = []
    for index, pod in enumerate(pods):
        ips = [ip for ip in pod["ips"] if owner[ip] == index]
        if ips:
            out.append({**pod, "ips": ips})
    return out


def _rule_lines(pod: dict, direction: str, rule: dict, ns: str, pods: list[dict], namespaces: dict) -> list[str]:
    field = "saddr" if direction == "Ingress" else "daddr"
    peers = rule.get("from" if direction == "Ingress" else "to")
    if peers:
        addrs = sorted({ip for peer in peers for ip in peer_ips(peer, ns, pods, namespaces)})
        if not addrs:
            return []
        addr_matches = family_matches(field, addrs)
    else:
        addrs, addr_matches = None, [""]
    ports = rule.get("ports") or []
    plain, named = [p for p in ports if not _is_named(p)], [p for p in ports if _is_named(p)]
    out = []
    port_frags = port_matches(plain, None) if plain else ([""] if not ports else [])
    # `return`, not `accept`: an accept would end the forward hook, so a destination's ingress allowing the
    # packet would skip its source's egress chain; NetworkPolicy wants both sides to allow it
    out += [" ".join(filter(None, (a, p, "return"))) for a in addr_matches for p in port_frags]
    if named and direction == "Ingress":
        out += [" ".join(filter(None, (a, p, "return"))) for a in addr_matches for p in port_matches(named, pod)]
    elif named:  # egress to a named port: the number is the target pod's, so the rule names that pod
        for target in pods:
            ips = [ip for ip in target["ips"] if addrs is None or _contained(ip, addrs)]
            if ips:
                out += [f"{a} {p} return" for a in family_matches(field, ips) for p in port_matches(named, target)]
    return out


def render(pods: list[dict], namespaces: dict[str, dict], policies: list[dict], pod_cidr: str,
           bridge: str = "cni-coderun0") -> str:
    """The whole nftables table for the current state: one chain per isolated pod and direction, both
    address families."""
    pods = own_ips(pods)
    lines = [f"table inet {TABLE} {{"]
    for name, kind, version in (("known_pods", "ipv4_addr", 4), ("known_pods6", "ipv6_addr", 6)):
        known = sorted({ip for p in pods for ip in p["ips"] if ipaddress.ip_address(ip).version == version},
                       key=ipaddress.ip_address)
        lines.append(f"  set {name} {{ type {kind}; " + (f"elements = {{ {', '.join(known)} }}; " if known else "")
                     + "}")
    forward, input_ = [], []
    chains = []
    for i, pod in enumerate(pods):
        ns, labels = pod["metadata"]["namespace"], pod["metadata"].get("labels")
        selecting = [np for np in policies if np["metadata"]["namespace"] == ns
                     and matches(np["spec"].get("podSelector", {}), labels)]
        for direction, addr_pod, hooks in (("Ingress", "daddr", (forward,)), ("Egress", "saddr", (forward, input_))):
            isolating = [np for np in selecting if direction in _policy_types(np["spec"])]
            if not isolating:
                continue
            chain = f"{direction.lower()}_{i}"
            body = []
            for np in isolating:
                for rule in np["spec"].get(direction.lower()) or ():
                    body += ["    " + line for line in _rule_lines(pod, direction, rule, ns, pods, namespaces)]
            body.append(f'    counter drop comment "{ns}/{pod["metadata"]["name"]} {direction.lower()}"')
            chains.append((chain, body))
            for ip in pod["ips"]:
                family = "ip" if ipaddress.ip_address(ip).version == 4 else "ip6"
                for hook in hooks:
                    hook.append(f"    {family} {addr_pod} {ip} jump {chain}")
    for chain, body in chains:
        lines += [f"  chain {chain} {{", *dict.fromkeys(body), "  }"]
    # IPv6 on the pod bridge with an address no pod has in the API: dropped before anything can accept it.
    unknown6_from = f'    iifname "{bridge}" ip6 saddr != @known_pods6 counter drop'
    unknown6_to = f'    oifname "{bridge}" ip6 daddr != @known_pods6 counter drop'
    established = "    ct state established,related accept"
    unknown_from = f"    ip saddr {pod_cidr} ip saddr != @known_pods ct state new counter drop"
    unknown_to = f"    ip daddr {pod_cidr} ip daddr != @known_pods ct state new counter drop"
    lines += ["  chain forward {", "    type filter hook forward priority 0; policy accept;", unknown6_from,
              unknown6_to, established, unknown_from, unknown_to, *forward, "  }",
              "  chain input {", "    type filter hook input priority 0; policy accept;", unknown6_from,
              established, unknown_from, *input_, "  }", "}"]
    return "\n".join(lines) + "\n"


def _policy_types(spec: dict) -> list[str]:
    if spec.get("policyTypes"):
        return spec["policyTypes"]
    return ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]


def pod_entry(obj: dict) -> dict | None:
    """What the enforcer keeps of a pod; None for a pod that has no traffic of its own to police: host
    network, no IP yet, or finished. A terminating pod still runs through its grace period (an operator hands
    its Lease over then, over the network) and keeps its policy until its containers have ended, as Calico and
    Cilium keep an endpoint until its sandbox is gone; should its IP go to a newer pod, the newer one wins."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    if spec.get("hostNetwork") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    statuses = status.get("containerStatuses") or []
    ended = statuses and all((s.get("state") or {}).get("terminated") for s in statuses)
    if ended and (spec.get("restartPolicy") == "Never" or meta.get("deletionTimestamp")):
        return None  # every container ended and none restarts: finished, though the phase lags ~1 s
    ips = [p["ip"] for p in status.get("podIPs") or () if p.get("ip")] or \
        ([status["podIP"]] if status.get("podIP") else [])
    if not ips:
        return None
    ports = [p for c in spec.get("containers") or () for p in c.get("ports") or ()]
    keep = {k: meta.get(k) for k in ("name", "namespace", "labels", "creationTimestamp")}
    return {"metadata": keep, "ips": [str(ipaddress.ip_address(ip)) for ip in ips], "ports": ports}


def namespace_entry(obj: dict) -> dict:
    return {"labels": obj["metadata"].get("labels")}


def policy_entry(obj: dict) -> dict:
    return {"metadata": {k: obj["metadata"].get(k) for k in ("name", "namespace")}, "spec": obj.get("spec") or {}}


# ------------------------------------------------------------------------------------------ state and watches
def object_key(obj: dict) -> str:
    return f'{obj["metadata"].get("namespace") or ""}/{obj["metadata"]["name"]}'


class State:
    def __init__(self, kinds: Iterable[str] = ()):
        self.pods: dict[str, dict] = {}
        self.namespaces: dict[str, dict] = {}
        self.policies: dict[str, dict] = {}
        self.changed = threading.Event()
        self.lock = threading.Lock()
        self.synced = {kind: threading.Event() for kind in kinds}


def replace_store(state: State, store: dict, objects: Iterable[dict], to_entry: Callable[[dict], dict | None]) -> None:
    """The store becomes exactly the listed objects: anything deleted while no watch ran is gone."""
    fresh = {}
    for obj in objects:
        entry = to_entry(obj)
        if entry is not None:
            fresh[object_key(obj)] = entry
    with state.lock:
        store.clear()
        store.update(fresh)
    state.changed.set()


def apply_event(state: State, store: dict, event: dict, to_entry: Callable[[dict], dict | None]) -> None:
    """Most of a pod's events change nothing the rules use (its containers' states, its conditions): those wake
    nobody, so the ruleset is rendered once per change that matters, not once per event."""
    obj = event["object"]
    key = object_key(obj)
    entry = None if event["type"] == "DELETED" else to_entry(obj)
    with state.lock:
        if store.get(key) == entry:
            return
        if entry is None:
            store.pop(key, None)
        else:
            store[key] = entry
    state.changed.set()


def relist(state: State, store: dict, list_fn: Callable, to_entry: Callable) -> str:
    """A full list (as plain JSON) replacing the store; returns the list's resourceVersion to watch from."""
    response = list_fn(_preload_content=False, _request_timeout=60)
    try:
        body = json.loads(response.data)
    finally:
        getattr(response, "release_conn", lambda: None)()
    replace_store(state, store, body.get("items") or (), to_entry)
    return body["metadata"]["resourceVersion"]


class Gone(Exception):
    """The watch's resourceVersion is too old (410): only a new list can tell what happened meanwhile."""


def watch_events(list_fn: Callable, resource_version: str, timeout: int = 300) -> Iterable[dict]:
    """Raw watch events from resource_version on (bookmarks included), until the server ends the watch."""
    from kubernetes.watch.watch import iter_resp_lines
    response = list_fn(watch=True, resource_version=resource_version, allow_watch_bookmarks=True,
                       timeout_seconds=timeout, _preload_content=False, _request_timeout=timeout + 30)
    try:
        for line in iter_resp_lines(response):
            if line and line.strip():
                yield json.loads(line)
    finally:
        response.close()
        response.release_conn()


def run_watch(state: State, kind: str, list_fn: Callable, store: dict, to_entry: Callable,
              events: Callable = watch_events, stop: Callable[[], bool] = lambda: False) -> None:
    """List, then watch from the list's resourceVersion; a clean end of the watch resumes from the last
    version seen; an error or 410 Gone lists again, which replaces the store."""
    version = None
    while not stop():
        try:
            if version is None:
                version = relist(state, store, list_fn, to_entry)
                state.synced.setdefault(kind, threading.Event()).set()
            for event in events(list_fn, version):
                if event["type"] == "ERROR":
                    status = event.get("object") or {}
                    if status.get("code") == 410:
                        raise Gone(status.get("message", ""))
                    raise RuntimeError(f"watch error: {status}")
                version = event["object"]["metadata"].get("resourceVersion") or version
                if event["type"] != "BOOKMARK":
                    apply_event(state, store, event, to_entry)
        except Gone as e:
            log.info("%s watch expired (%s); listing again", kind, e)
            version = None
        except Exception as e:  # a dropped watch is normal: list again, then watch
            status = getattr(e, "status", None)
            log.warning("%s watch ended (%s); listing again", kind, e if status is None else f"HTTP {status}")
            version = None
            time.sleep(1)


# ------------------------------------------------------------------------------------------ main
def apply_ruleset(ruleset: str) -> subprocess.CompletedProcess:
    # Adding then deleting the table inside one transaction replaces it atomically.
    script = f"table inet {TABLE}\ndelete table inet {TABLE}\n{ruleset}"
    return subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True)


def main() -> None:
    from kubernetes import client, config
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--pod-cidr", default="10.88.0.0/16")
    parser.add_argument("--bridge", default="cni-coderun0", help="the pod bridge (its IPv6 is policed by address)")
    parser.add_argument("--node", default="")
    parser.add_argument("--print", action="store_true", help="print the ruleset for the current state and exit")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config.load_kube_config(args.kubeconfig)
    core, networking = client.CoreV1Api(), client.NetworkingV1Api()
    watches = [
        ("pods", core.list_pod_for_all_namespaces, "pods", pod_entry),
        ("namespaces", core.list_namespace, "namespaces", namespace_entry),
        ("networkpolicies", networking.list_network_policy_for_all_namespaces, "policies", policy_entry),
    ]
    state = State(kind for kind, *_ in watches)
    for kind, fn, store, entry in watches:
        threading.Thread(target=run_watch, args=(state, kind, fn, getattr(state, store), entry), daemon=True,
                         name=kind).start()
    # Nothing is rendered before every kind was listed once: pods without their policies would be open.
    for kind, event in state.synced.items():
        while not event.wait(5):
            log.info("waiting for the first list of %s", kind)
    applied = None
    while True:
        # A failed apply is retried on the next change or after 10 s, whichever comes first.
        state.changed.wait(None if applied is not None else 10)
        state.changed.clear()
        with state.lock:
            pods = sorted(state.pods.values(), key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
            namespaces = {k.strip("/"): v for k, v in state.namespaces.items()}
            policies = list(state.policies.values())
        ruleset = render(pods, namespaces, policies, args.pod_cidr, args.bridge)
        if args.print:
            print(ruleset, end="")
            return
        if ruleset == applied:
            continue
        result = apply_ruleset(ruleset)
        if result.returncode != 0:
            log.error("nft refused the ruleset: %s\n%s", result.stderr.strip(), ruleset)
            applied = None
        else:
            applied = ruleset
            log.info("applied: %d pods, %d policies", len(pods), len(policies))


if __name__ == "__main__":
    main()
