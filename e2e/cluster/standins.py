"""Stand-ins for "the internet" and "a metadata service", bound on this machine's loopback.

A containment test that dials a public address sends a packet off the machine when it fails, and passes
vacuously when that address happens to be unreachable. Here the harness owns the addresses instead: at `up`
they are added to `lo` (this kernel has no dummy links; /32s and /128s on loopback work) and answered by this
program, which appends every connection or datagram it sees to a JSON-lines file. A test then asserts that
nothing from a sandbox arrived (a hole is detected, not assumed) and, as its control, that a probe from the
node did. `down` removes the addresses; `verify-down` fails while any is left.

One list: cluster.sh, the cluster DNS zone (`zone`), the e2e tests and tests/unit/test_e2e_addresses.py all
read the addresses and names from here.

    standins.py serve HITS_FILE | ready | on-lo | remove | check | zone | zone-name | lookup SERVER NAME [A|AAAA]
"""
from __future__ import annotations

import ipaddress
import json
import random
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time

# TEST-NET-2 for "the internet", the link-local metadata address clouds use, and their IPv6 counterparts
# (the documentation prefix and AWS's IMDS address).
INTERNET_V4 = "198.51.100.1"
METADATA_V4 = "169.254.169.254"
INTERNET_V6 = "2001:db8::1"
METADATA_V6 = "fd00:ec2::254"
ADDRESSES = (INTERNET_V4, METADATA_V4, INTERNET_V6, METADATA_V6)
TCP_PORTS = (80, 443)
UDP_PORTS = (53, 443)
# The one port a pod may reach on purpose: a positive control from a pod no policy selects dials it, so that a
# hit on the ports above, from any pod, is a hole whichever test is running beside.
CONTROL_PORT = 8181
# The only names outside the cluster the cluster DNS answers; everything else outside the cluster is NXDOMAIN.
ZONE = "coderun.test"
INTERNET_NAME = f"example.{ZONE}"
METADATA_NAME = f"metadata.{ZONE}"
NAMES = {INTERNET_NAME: (INTERNET_V4, INTERNET_V6), METADATA_NAME: (METADATA_V4, METADATA_V6)}
REPLY = b"standin\n"


def _prefix(address: str) -> str:
    return f"{address}/{ipaddress.ip_address(address).max_prefixlen}"


def on_loopback() -> list[str]:
    """The stand-in addresses `lo` carries now."""
    out = subprocess.run(["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True,
                         check=True).stdout
    present = {line.split()[3] for line in out.splitlines() if len(line.split()) > 3}
    return [a for a in ADDRESSES if _prefix(a) in present]


def add_addresses() -> None:
    for address in ADDRESSES:
        # `replace` and not `add`: a second `up` (or a restart of this program) finds them already there.
        subprocess.run(["ip", "addr", "replace", _prefix(address), "dev", "lo"], check=True)


def remove_addresses() -> None:
    for address in on_loopback():
        subprocess.run(["ip", "addr", "del", _prefix(address), "dev", "lo"], check=True)


class _Hits:
    """Appends one JSON line per hit; a test reads the file from the offset it took when it started."""

    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()

    def record(self, server: socketserver.BaseServer, proto: str, peer: tuple) -> None:
        address, port = server.server_address[:2]
        line = json.dumps({"address": address, "port": port, "proto": proto, "peer": f"{peer[0]}:{peer[1]}",
                           "time": time.time()})
        with self.lock, open(self.path, "a") as f:
            f.write(line + "\n")


class _TCP(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.server.hits.record(self.server, "tcp", self.client_address)  # type: ignore[attr-defined]
        self.request.settimeout(2)
        try:
            first = self.request.recv(4096)
        except OSError:
            first = b""
        # An HTTP client gets an HTTP answer, anything else (TLS included) one line: either way it connected.
        if first.split(b" ", 1)[0] in (b"GET", b"HEAD", b"POST", b"PUT", b"CONNECT"):
            self.request.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(REPLY), REPLY))
        else:
            self.request.sendall(REPLY)


class _UDP(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        data, sock = self.request
        self.server.hits.record(self.server, "udp", self.client_address)  # type: ignore[attr-defined]
        sock.sendto(data or REPLY, self.client_address)


def _server(kind: type, address: str, port: int, handler: type, hits: _Hits) -> socketserver.BaseServer:
    cls = type("StandIn", (socketserver.ThreadingMixIn, kind), {
        "address_family": socket.AF_INET6 if ":" in address else socket.AF_INET, "daemon_threads": True,
        "allow_reuse_address": True})
    server = cls((address, port), handler)
    server.hits = hits  # type: ignore[attr-defined]
    return server


def serve(hits_path: str) -> None:
    add_addresses()
    hits = _Hits(hits_path)
    servers = [_server(socketserver.TCPServer, a, p, _TCP, hits) for a in ADDRESSES
               for p in (*TCP_PORTS, CONTROL_PORT)]
    servers += [_server(socketserver.UDPServer, a, p, _UDP, hits) for a in ADDRESSES for p in UDP_PORTS]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    print(f"stand-ins listening on {', '.join(ADDRESSES)} tcp {TCP_PORTS} and {CONTROL_PORT}, udp {UDP_PORTS}; "
          f"hits in {hits_path}",
          flush=True)
    for t in threads:
        t.join()


def zone() -> str:
    """The cluster DNS's zone file for ZONE (CoreDNS's file plugin): the stand-ins' names and nothing else."""
    lines = [f"$ORIGIN {ZONE}.", f"@ 5 IN SOA ns.{ZONE}. hostmaster.{ZONE}. 1 60 60 60 5", f"@ 5 IN NS ns.{ZONE}.",
             f"ns 5 IN A {INTERNET_V4}"]
    for name, (v4, v6) in NAMES.items():
        label = name[:-len(ZONE) - 1]
        lines += [f"{label} 5 IN A {v4}", f"{label} 5 IN AAAA {v6}"]
    return "\n".join(lines) + "\n"


RCODES = {0: "NOERROR", 2: "SERVFAIL", 3: "NXDOMAIN", 5: "REFUSED"}


def lookup(server: str, name: str, rtype: str = "A", port: int = 53) -> tuple[str, list[str]]:
    """One DNS question over UDP (no resolver library on the node): (rcode, addresses answered)."""
    qtype = {"A": 1, "AAAA": 28}[rtype]
    ident = random.randrange(1 << 16)
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"
    query = struct.pack(">HHHHHH", ident, 0x0100, 1, 0, 0, 0) + question + struct.pack(">HH", qtype, 1)
    with socket.socket(socket.AF_INET6 if ":" in server else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(3)
        s.sendto(query, (server, port))
        reply = s.recv(4096)
    rid, flags, _, count = struct.unpack(">HHHH", reply[:8])
    assert rid == ident, "a reply to another question"
    offset = 12 + len(question) + 4
    addresses = []
    for _ in range(count):
        while reply[offset] and reply[offset] < 0xC0:  # the owner name: labels, or a pointer
            offset += reply[offset] + 1
        offset += 2 if reply[offset] >= 0xC0 else 1
        kind, _, _, length = struct.unpack(">HHIH", reply[offset:offset + 10])
        data = reply[offset + 10:offset + 10 + length]
        if kind in (1, 28):
            addresses.append(str(ipaddress.ip_address(data)))
        offset += 10 + length
    return RCODES.get(flags & 0xF, str(flags & 0xF)), addresses


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else ""
    if command == "serve" and len(argv) == 3:
        serve(argv[2])
    elif command == "remove":
        remove_addresses()
    elif command == "ready":
        for address in ADDRESSES:
            for port in TCP_PORTS:
                socket.create_connection((address, port), timeout=1).close()
    elif command == "on-lo":
        print(" ".join(on_loopback()) or "none")
    elif command == "check":
        left = on_loopback()
        if left:
            print(f"stand-in addresses left on lo: {' '.join(left)}", file=sys.stderr)
        return 1 if left else 0
    elif command == "zone":
        sys.stdout.write(zone())
    elif command == "zone-name":
        print(ZONE)
    elif command == "lookup" and len(argv) in (4, 5):
        rcode, addresses = lookup(argv[2], argv[3], *argv[4:])
        print(rcode, *addresses)
    else:
        print(__doc__.rsplit("\n\n", 1)[-1], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
