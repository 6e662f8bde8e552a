"""What reached the harness's stand-ins for the internet and a metadata service (e2e/cluster/standins.py).

No pod may reach a stand-in's ports (a pod's own positive control dials CONTROL_PORT only), so a hit there whose
peer is a pod address is a hole, whichever test runs beside. The control beside every such "nothing arrived": a
probe from the node to every stand-in listener does arrive, and is seen.
"""
from __future__ import annotations

import importlib.util
import ipaddress
import json
import re
import socket
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HITS = REPO / ".cluster" / "standin-hits.jsonl"


def _load_declaration():
    spec = importlib.util.spec_from_file_location("coderun_e2e_standins", REPO / "e2e/cluster/standins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_declared = _load_declaration()
INTERNET_V4: str = _declared.INTERNET_V4
METADATA_V4: str = _declared.METADATA_V4
INTERNET_V6: str = _declared.INTERNET_V6
METADATA_V6: str = _declared.METADATA_V6
ADDRESSES: tuple[str, ...] = _declared.ADDRESSES
TCP_PORTS: tuple[int, ...] = _declared.TCP_PORTS
UDP_PORTS: tuple[int, ...] = _declared.UDP_PORTS
CONTROL_PORT: int = _declared.CONTROL_PORT
INTERNET_NAME: str = _declared.INTERNET_NAME
METADATA_NAME: str = _declared.METADATA_NAME
lookup = _declared.lookup
POD_CIDR = ipaddress.ip_network(re.search(r"^POD_CIDR=(\S+)", (REPO / "e2e/cluster/cluster.sh").read_text(),
                                          re.M).group(1))


class StandinHits:
    """The hits appended since this object was made (the hits file only grows while the cluster is up)."""

    def __init__(self, path: Path = HITS):
        assert path.exists(), f"{path} is missing: the stand-ins are not running (e2e/cluster/cluster.sh up)"
        self.path = path
        self.offset = path.stat().st_size

    def since(self) -> list[dict]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            return [json.loads(line) for line in f.read().splitlines() if line.strip()]

    def from_pods(self, port: int | None = None) -> list[dict]:
        """Hits from pod addresses: on the stand-ins' own ports (holes), or on `port` (CONTROL_PORT)."""
        return [h for h in self.since() if ipaddress.ip_address(h["peer"].rsplit(":", 1)[0]) in POD_CIDR
                and (h["port"] == port if port else h["port"] != CONTROL_PORT)]

    def probe_from_node(self) -> list[dict]:
        """The control: connect (TCP) and send (UDP) from the node to every stand-in listener, and return the
        hits they made, each seen in the file (so the listeners and the record work, now)."""
        peers = set()
        for address in ADDRESSES:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            for port in TCP_PORTS:
                with socket.create_connection((address, port), timeout=3) as s:
                    peers.add((address, port, "tcp", s.getsockname()[1]))
                    s.sendall(b"control\n")
                    assert s.recv(100), f"no answer from the stand-in {address}:{port}"
            for port in UDP_PORTS:
                with socket.socket(family, socket.SOCK_DGRAM) as s:
                    s.settimeout(3)
                    s.sendto(b"control", (address, port))
                    assert s.recv(100) == b"control", f"no echo from the stand-in {address}:{port}/udp"
                    peers.add((address, port, "udp", s.getsockname()[1]))
        deadline = time.monotonic() + 10
        while True:
            seen = [h for h in self.since() if (h["address"], h["port"], h["proto"], int(h["peer"].rsplit(":", 1)[1]))
                    in peers]
            if len(seen) >= len(peers) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(seen) == len(peers), f"the stand-ins recorded {len(seen)} of the node's {len(peers)} probes"
        return seen

    def assert_no_pod_reached_them(self) -> int:
        """Control first, then the claim; returns how many control hits were seen."""
        control = self.probe_from_node()
        holes = self.from_pods()
        assert not holes, f"a pod reached a stand-in for the outside world: {holes[:20]}"
        return len(control)
