"""A run's egress record under a flood (issue 35, items 5 and 7): the log daemon keeps up with squid, and when the
run ends the admin endpoint hands over a log that counts every request the acl helper admitted, or says how many
it lacks; another run's record beside the flood stays whole. And squid's own check of the address it connects
to refuses the proxy's own ports whatever CIDR rule a run has."""
from __future__ import annotations

import base64
import http.client
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from coderun.egress.rules import Rule
from support.egress import fetch, rules

CONNECTIONS = 24
REQUESTS_PER_CONNECTION = 150


def refused_requests(proxy_url: str, target: str, count: int) -> int:
    """`count` plain-HTTP GETs of `target` through the proxy on one kept-alive connection (a new one when squid
    closes it), as a flooding program would send them; how many were answered."""
    parts = urllib.parse.urlsplit(proxy_url)
    credentials = base64.b64encode(f"{parts.username}:{urllib.parse.unquote(parts.password)}".encode()).decode()
    answered, conn = 0, None
    for _ in range(count):
        if conn is None:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        conn.request("GET", target, headers={"Proxy-Authorization": f"Basic {credentials}"})
        answer = conn.getresponse()
        answer.read()
        assert answer.status == 403, answer.status
        answered += 1
        if answer.will_close:
            conn.close()
            conn = None
    if conn is not None:
        conn.close()
    return answered


def run_end(proxy, uid: str) -> tuple[int, int, int, list[bytes]]:
    """What the operator gets at a run's end: revoke, then the log (requests logged, admitted, dropped, lines)."""
    proxy.revoke(uid)
    status, body, headers = proxy.ask_admin("GET", f"/runs/{uid}/log")
    assert status == 200
    return (int(headers["X-Coderun-Requests"]), int(headers["X-Coderun-Admitted"]),
            int(headers["X-Coderun-Dropped"]), body.splitlines())


def test_a_flood_of_refused_requests_is_counted_exactly_and_a_victim_beside_it_keeps_its_record(proxy, origin):
    flood_uid, flood_url = proxy.run(rules(origin))
    victim_uid, victim_url = proxy.run(rules(origin))
    target = f"http://other.test:{origin.plain_port}/flood"  # no rule names other.test: refused, no lookup
    victim_done, victim_statuses = threading.Event(), []

    def victim() -> None:
        try:
            for i in range(20):
                victim_statuses.append(fetch(victim_url, f"http://allowed.test:{origin.plain_port}/v{i}", origin)[0])
        finally:
            victim_done.set()

    with ThreadPoolExecutor(CONNECTIONS + 1) as pool:
        pool.submit(victim)
        sent = sum(pool.map(lambda _: refused_requests(flood_url, target, REQUESTS_PER_CONNECTION),
                            range(CONNECTIONS)))
    assert sent == CONNECTIONS * REQUESTS_PER_CONNECTION and victim_done.is_set()
    logged, admitted, dropped, lines = run_end(proxy, flood_uid)
    assert (logged, admitted) == (sent, sent), proxy.cache_log()  # every request counted, none lost in the log
    assert lines and dropped == sent - len(lines)  # kept up to the run file's cap (1 MiB), the rest counted
    assert victim_statuses == [200] * 20
    assert run_end(proxy, victim_uid)[:3] == (20, 20, 0)  # the victim's record is whole beside the flood


def test_the_admin_endpoint_says_what_the_log_lacks_when_it_cannot_catch_up(proxy, origin):
    """A count the log never reaches (records squid lost) is handed over as it is, after a bounded wait: the
    operator then writes complete: false. The positive control is the flood test above."""
    uid, url = proxy.run(rules(origin))
    assert fetch(url, f"http://allowed.test:{origin.plain_port}/one", origin)[0] == 200
    path = proxy.settings.runs_dir + f"/{uid}.admitted"
    with open(path, "r+") as count:  # as if squid had dropped 5 of the run's lines
        admitted = int(count.read()) + 5
        count.seek(0)
        count.write(str(admitted))
    logged, reported, _, _ = run_end(proxy, uid)
    assert (logged, reported) == (admitted - 5, admitted)


def test_no_cidr_rule_opens_the_proxy_s_own_ports(proxy, origin):
    """A name resolving to the proxy's own loopback, under a CIDR rule covering all of it: squid's own check of
    the address it would connect to refuses it (the pod refuses its whole loopback; the tier, whose origins are on
    loopback too, the proxy's ports). The origin's port under the same rule passes: the positive control."""
    own = int(proxy.address.rsplit(":", 1)[1])
    ports = (own, proxy.settings.tls_stage_port, origin.plain_port)
    _, url = proxy.run((Rule(host="allowed.test", ports=ports), Rule(cidr="127.0.0.0/8", ports=ports)))
    for port in ports[:2]:
        status, body, _ = fetch(url, f"http://allowed.test:{port}/admin", origin)
        assert status == 403, (port, body[:300])
    assert fetch(url, f"http://allowed.test:{origin.plain_port}/fine", origin)[0] == 200
