"""A run's tunnels as the relay between squid's stages bounds them (coderun/egress/relay.py): cut when the run's byte
budget is spent, while the bytes flow, and closed when its credential is revoked; each beside a positive control."""
from __future__ import annotations

import base64
import http.client
import select
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

from coderun.egress.credential import Budget
from coderun.egress.relay import CHUNK_BYTES
from coderun.egress.rules import Rule

MEGABYTES_2 = 2_000_000


def rules(origin) -> tuple[Rule, ...]:
    """allowed.test on the origin's two ports, and its loopback address as a policy must allow it."""
    ports = (origin.plain_port, origin.tls_port)
    return Rule(host="allowed.test", ports=ports), Rule(cidr="127.0.0.1/32", ports=ports)


def plain_get(proxy_url: str, url: str) -> tuple[int, dict]:
    """A plain http:// GET through the proxy: its status and headers."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
    try:
        with opener.open(url, timeout=15) as answer:
            return answer.status, dict(answer.headers)
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers)


def tunnel(proxy_url: str, origin, host: str = "allowed.test") -> http.client.HTTPSConnection:
    """One CONNECT tunnel to the origin's TLS port, kept alive for every request sent on it (http.client)."""
    parts = urllib.parse.urlsplit(proxy_url)
    credentials = base64.b64encode(f"{parts.username}:{urllib.parse.unquote(parts.password)}".encode()).decode()
    conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=15,
                                       context=ssl.create_default_context(cafile=origin.ca))
    conn.set_tunnel(host, origin.tls_port, headers={"Proxy-Authorization": f"Basic {credentials}"})
    return conn


def kept_alive_gets(conn: http.client.HTTPSConnection, count: int, size: int) -> tuple[int, int, Exception | None]:
    """(bodies read whole, body bytes received in all, the error that stopped them): `count` GETs of `size` bytes
    one after the other on one connection."""
    whole, received = 0, 0
    try:
        for _ in range(count):
            conn.request("GET", f"/bytes/{size}")
            answer = conn.getresponse()
            assert answer.status == 200
            while chunk := answer.read(65536):
                received += len(chunk)
            if answer.length not in (None, 0):
                return whole, received, http.client.IncompleteRead(b"", answer.length)
            whole += 1
    except (OSError, http.client.HTTPException) as e:
        return whole, received, e
    return whole, received, None


def test_one_tunnel_is_cut_at_the_run_s_byte_budget_and_the_run_refused_after(proxy, origin):
    budget = 100_000
    uid, url = proxy.run(rules(origin), budget=Budget(bytes=budget))
    conn = tunnel(url, origin)
    whole, received, error = kept_alive_gets(conn, 5, MEGABYTES_2)
    conn.close()
    # Issue 35 item 4: 10,000,000 bytes went through before; now the tunnel stops one chunk past the budget.
    assert whole == 0 and error is not None, (whole, received, error)
    assert 0 < received <= budget + CHUNK_BYTES, received
    status, headers = plain_get(url, f"http://allowed.test:{origin.plain_port}/after")
    assert status == 403 and "spec.egressBudget.bytes: 100000" in headers["X-Coderun-Refused"], (status, headers)
    records = proxy.records(lambda rs: len([r for r in rs if r["user"] == uid]) >= 2)
    cut, refused = [r for r in records if r["user"] == uid]
    # What the log counts of the cut tunnel is over the budget: the run's status says EgressBudgetExceeded truly.
    moved = cut["bytes_sent"] + cut["bytes_received"]
    assert cut["method"] == "CONNECT" and budget < moved <= budget + 2 * CHUNK_BYTES, cut
    assert (refused["verdict"], refused["reason"]) == ("denied", "BudgetExceeded")


def test_a_budget_above_the_transfer_lets_every_kept_alive_get_through(proxy, origin):
    _, url = proxy.run(rules(origin), budget=Budget(bytes=20_000_000))
    conn = tunnel(url, origin)
    assert kept_alive_gets(conn, 5, MEGABYTES_2) == (5, 10_000_000, None)
    conn.close()


def test_a_run_s_tunnels_share_one_count(proxy, origin):
    """Two tunnels of one run, each under the budget alone, over it together: both are cut, and together they
    carried at most one chunk past it."""
    budget = 300_000
    _, url = proxy.run(rules(origin), budget=Budget(bytes=budget))
    first, second = tunnel(url, origin), tunnel(url, origin)
    got = [kept_alive_gets(conn, 1, 200_000) for conn in (first, second)]
    got += [kept_alive_gets(conn, 1, 200_000) for conn in (first, second)]
    for conn in (first, second):
        conn.close()
    assert got[0][:2] == (1, 200_000) and got[1][0] == 0 and got[2][0] == 0 and got[3][0] == 0, got
    assert sum(received for _, received, _ in got) <= budget + CHUNK_BYTES, got


def _closed_within(conn: http.client.HTTPSConnection, seconds: float) -> bool:
    """Whether the tunnel's socket is closed (readable, and reading gives nothing or fails) within `seconds`."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if select.select([conn.sock], [], [], left)[0]:
            try:
                return conn.sock.recv(1) == b""
            except (OSError, ssl.SSLError):
                return True
    return False


def test_revoking_a_run_s_credential_closes_its_open_tunnel_and_no_other(proxy, origin):
    revoked_uid, revoked_url = proxy.run(rules(origin))
    _, kept_url = proxy.run(rules(origin))
    revoked, kept = tunnel(revoked_url, origin), tunnel(kept_url, origin)
    for conn in (revoked, kept):
        assert kept_alive_gets(conn, 1, 10) == (1, 10, None)
    proxy.revoke(revoked_uid)
    assert _closed_within(revoked, 5.0)
    assert not _closed_within(kept, 0.5)
    assert kept_alive_gets(kept, 1, 10) == (1, 10, None)  # the other run's tunnel carries on
    for conn in (revoked, kept):
        conn.close()


def test_an_open_tunnel_is_closed_when_its_credential_expires(proxy, origin):
    _, url = proxy.run(rules(origin), expires_in=2)
    conn = tunnel(url, origin)
    assert kept_alive_gets(conn, 1, 10) == (1, 10, None)
    assert _closed_within(conn, 10.0)
    conn.close()
