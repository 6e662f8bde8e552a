"""The egress proxy behind a corporate proxy (egressProxy.upstream): a second squid rendered with an Upstream, in
front of a stand-in upstream proxy on 127.0.0.1 (conftest.Upstream) that asks for a Basic login and reaches the
tier's origins. Every request a run makes leaves through the upstream, with the proxy's login and never the run's
credential; the checks, the per-request log and the budgets work as without it."""
from __future__ import annotations

import base64
import urllib.error

import pytest

from coderun.egress.credential import Budget
from support.egress import fetch, rules


def _login(upstream) -> str:
    return "Basic " + base64.b64encode(f"{upstream.username}:{upstream.password}".encode()).decode()


def _records(proxy, uid: str, count: int) -> list[dict]:
    found = proxy.records(lambda rs: len([r for r in rs if r["user"] == uid]) >= count)
    mine = [r for r in found if r["user"] == uid]
    assert len(mine) == count, (mine, proxy.cache_log())
    return mine


def test_https_and_http_leave_through_the_upstream_with_the_proxys_login_and_are_logged(
        proxy_via_upstream, upstream, origin):
    uid, url = proxy_via_upstream.run(rules(origin))
    before = len(upstream.seen)
    status, body, _ = fetch(url, f"https://allowed.test:{origin.tls_port}/via-upstream", origin)
    assert status == 200 and b'"/via-upstream"' in body  # the origin's own certificate: spliced, not decrypted
    status, body, _ = fetch(url, f"http://allowed.test:{origin.plain_port}/plain?q=1", origin)
    assert status == 200 and b'"/plain?q=1"' in body
    seen = upstream.seen[before:]
    assert [(s["method"], s["target"]) for s in seen] == [
        ("CONNECT", f"allowed.test:{origin.tls_port}"), ("GET", f"http://allowed.test:{origin.plain_port}/plain?q=1")]
    # The upstream gets the proxy's own login, never the run's credential (its token is in the proxy URL).
    assert all(s["authorization"] == _login(upstream) for s in seen), seen
    connect, get = _records(proxy_via_upstream, uid, 2)
    assert (connect["method"], connect["host"], connect["sni"], connect["tls"], connect["verdict"]) == (
        "CONNECT", "allowed.test", "allowed.test", "splice", "allowed")
    assert (get["method"], get["path"], get["status"], get["verdict"]) == ("GET", "/plain", 200, "allowed")


def test_a_refused_request_never_reaches_the_upstream(proxy_via_upstream, upstream, origin):
    uid, url = proxy_via_upstream.run(rules(origin))
    before = len(upstream.seen)
    status, _, headers = fetch(url, f"http://other.test:{origin.plain_port}/", origin)
    assert status == 403 and "other.test" in headers["X-Coderun-Refused"]
    with pytest.raises(urllib.error.URLError, match="Tunnel connection failed: 403"):  # the CONNECT refused
        fetch(url, f"https://other.test:{origin.tls_port}/", origin)
    assert upstream.seen[before:] == []
    assert [r["verdict"] for r in _records(proxy_via_upstream, uid, 2)] == ["denied", "denied"]
    # The control: an allowed name from the same run does reach it.
    assert fetch(url, f"http://allowed.test:{origin.plain_port}/ok", origin)[0] == 200
    assert upstream.seen[before:][-1]["target"] == f"http://allowed.test:{origin.plain_port}/ok"


def test_the_budget_still_counts_every_request_behind_the_upstream(proxy_via_upstream, upstream, origin):
    uid, url = proxy_via_upstream.run(rules(origin), budget=Budget(requests=2))
    before = len(upstream.seen)
    codes = [fetch(url, f"https://allowed.test:{origin.tls_port}/tls", origin)[0]]
    codes += [fetch(url, f"http://allowed.test:{origin.plain_port}/n{i}", origin)[0] for i in range(2)]
    assert codes == [200, 200, 403], codes
    assert len(upstream.seen[before:]) == 2  # the refused third never left
    assert _records(proxy_via_upstream, uid, 3)[-1]["reason"] == "BudgetExceeded"


def test_without_an_upstream_the_proxy_connects_itself(proxy, upstream, origin):
    """The control: the tier's ordinary squid (no Upstream) reaches the origin and the stand-in sees nothing."""
    uid, url = proxy.run(rules(origin))
    before = len(upstream.seen)
    assert fetch(url, f"http://allowed.test:{origin.plain_port}/direct", origin)[0] == 200
    assert fetch(url, f"https://allowed.test:{origin.tls_port}/direct", origin)[0] == 200
    assert upstream.seen[before:] == []
