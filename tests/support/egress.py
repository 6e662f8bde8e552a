"""What the egress tests share: a run's rules and a fetch through the proxy as a run's program makes it (the egress
tier, tests/egress), and the head of an HTTP answer read off a raw socket (the tier and the relay's unit tests)."""
from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request

from coderun.egress.rules import Rule


def read_head(sock: socket.socket) -> bytes:
    """What arrives up to the end of an HTTP head (a blank line), or up to the end of the stream if it ends first."""
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(65536)
        if not chunk:
            break
        head += chunk
    return head


def rules(origin, *, cidr=True, hosts=("allowed.test", "*.wild.test")):
    """A run's rules: the names on the origin's two ports, and (as a policy must, for 127.0.0.1 is loopback) the
    origin's address as a CIDR rule."""
    allowed = tuple(Rule(host=h, ports=(origin.plain_port, origin.tls_port)) for h in hosts)
    return allowed + ((Rule(cidr="127.0.0.1/32", ports=(origin.plain_port, origin.tls_port)),) if cidr else ())


def fetch(proxy_url: str, url: str, origin) -> tuple[int, bytes, dict]:
    """GET through the proxy as a Python program of a run would (urllib honours the same proxy URL)."""
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"http": proxy_url, "https": proxy_url}),
        urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=origin.ca)))
    try:
        with opener.open(url, timeout=15) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read(), dict(refused.headers)
