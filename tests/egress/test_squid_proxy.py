"""The egress proxy as a component: Debian's squid with coderun's squid.conf and helpers, on loopback, driven the
way a run drives it (Python's urllib with the proxy URL the operator would put in HTTP_PROXY / HTTPS_PROXY, and
raw sockets where an attacker would), each request then found in the access log as one record."""
from __future__ import annotations

import base64
import json
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request

import pytest

from coderun.egress.credential import EGRESS_BUDGET, Budget, egress_weight
from coderun.egress.rules import Rule
from support.egress import fetch, read_head, rules


def connect(proxy_url: str, target: str, sni: str | None = None, ca: str | None = None,
            source: str = "127.0.0.1") -> tuple[str, dict, bytes | Exception | None]:
    """A raw CONNECT: (status line, headers, what a TLS handshake naming `sni` got: the origin's answer or the
    error) — what a program that ignores the proxy's conventions can do."""
    parts = urllib.parse.urlsplit(proxy_url)
    credentials = base64.b64encode(f"{parts.username}:{urllib.parse.unquote(parts.password)}".encode()).decode()
    sock = socket.create_connection((parts.hostname, parts.port), timeout=15, source_address=(source, 0))
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {credentials}\r\n"
                 "\r\n".encode())
    head = read_head(sock)
    lines = head.split(b"\r\n\r\n", 1)[0].decode(errors="replace").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    if sni is None or " 200 " not in lines[0]:
        sock.close()
        return lines[0], headers, None
    context = ssl.create_default_context(cafile=ca)
    context.check_hostname = False  # the test names the wrong host on purpose
    try:
        with context.wrap_socket(sock, server_hostname=sni) as tls:
            tls.sendall(f"GET /tunnelled HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n".encode())
            return lines[0], headers, tls.recv(4096)
    except (OSError, ssl.SSLError) as e:
        return lines[0], headers, e


def one_record(proxy, uid: str, count: int = 1) -> list[dict]:
    found = proxy.records(lambda rs: len([r for r in rs if r["user"] == uid]) >= count)
    mine = [r for r in found if r["user"] == uid]
    assert len(mine) == count, (mine, proxy.cache_log())
    return mine


RECORD_FIELDS = {"time", "run", "host", "port", "method", "path", "verdict", "reason", "rule", "bytes_sent",
                 "bytes_received", "duration_ms", "status", "client", "sni", "message"}


def test_an_allowed_name_passes_over_http_and_the_origin_sees_nothing_of_the_run(proxy, origin):
    uid, url = proxy.run(rules(origin))
    status, body, _ = fetch(url, f"http://allowed.test:{origin.plain_port}/hello?secret=1", origin)
    assert status == 200 and b'"/hello?secret=1"' in body
    seen = origin.seen[-1]["headers"]
    assert seen["Host"] == f"allowed.test:{origin.plain_port}"
    assert not {"Proxy-Authorization", "X-Forwarded-For", "Via"} & set(seen), seen  # no token, no run address
    [record] = one_record(proxy, uid)
    assert RECORD_FIELDS <= set(record)
    assert record | {"time": None, "duration_ms": None, "bytes_sent": None, "bytes_received": None} == record | {
        "time": None, "duration_ms": None, "bytes_sent": None, "bytes_received": None, "run": f"tier/{uid}",
        "policy": proxy.policy, "method": "GET", "host": "allowed.test", "port": origin.plain_port, "path": "/hello",
        "status": 200, "verdict": "allowed", "reason": "Allowed", "client": "127.0.0.1",
        "rule": f"egress[0] allowed.test:{origin.plain_port},{origin.tls_port}"}
    assert record["bytes_received"] > len(body) and record["bytes_sent"] > 0 and record["duration_ms"] >= 0
    assert record["time"].endswith("+00:00")


def test_an_allowed_name_passes_over_https_spliced_never_decrypted(proxy, origin):
    uid, url = proxy.run(rules(origin))
    status, body, _ = fetch(url, f"https://a.wild.test:{origin.tls_port}/secure", origin)
    assert status == 200 and b'"/secure"' in body  # the origin's own certificate: squid did not decrypt
    [record] = one_record(proxy, uid)
    assert (record["method"], record["host"], record["sni"], record["tls"], record["verdict"], record["path"]) == (
        "CONNECT", "a.wild.test", "a.wild.test", "splice", "allowed", None)
    assert record["rule"].startswith("egress[1] *.wild.test") and record["bytes_received"] > 1000


def test_the_largest_credential_a_policy_can_make_works_over_http_and_https(proxy, origin):
    filler = tuple(Rule(host=f"{i:02d}{'a' * 60}.{'b' * 60}.{'c' * 60}.{'d' * 40}.example.com", ports=(1, 2))
                   for i in range(14))
    mine = rules(origin, hosts=("allowed.test",))
    assert sum(egress_weight(r.host or r.cidr, len(r.ports)) for r in filler + mine) <= EGRESS_BUDGET
    uid, url = proxy.run(filler + mine)
    assert len(url) > 4500  # about the largest: the budget is spent
    assert fetch(url, f"http://allowed.test:{origin.plain_port}/", origin)[0] == 200
    assert fetch(url, f"https://allowed.test:{origin.tls_port}/", origin)[0] == 200
    assert one_record(proxy, uid, 2)[1]["rule"].startswith("egress[14] allowed.test")


def test_a_large_body_passes_and_is_counted(proxy, origin):
    uid, url = proxy.run(rules(origin))
    status, body, _ = fetch(url, f"https://allowed.test:{origin.tls_port}/bytes/5000000", origin)
    assert status == 200 and len(body) == 5_000_000
    [record] = one_record(proxy, uid)
    assert 5_000_000 < record["bytes_received"] < 5_100_000


@pytest.mark.parametrize("target", ["other.test", "wild.test", "b.a.wild.test"])
def test_a_name_no_rule_allows_is_refused_with_a_message_naming_host_and_policy(proxy, origin, target):
    uid, url = proxy.run(rules(origin))
    status, body, headers = fetch(url, f"http://{target}:{origin.plain_port}/", origin)
    says = f"egress to {target}:{origin.plain_port} is not allowed by CodeRunPolicy {proxy.policy}; it allows allowed.test"
    assert status == 403 and says in body.decode() and says in headers["X-Coderun-Refused"]
    [record] = one_record(proxy, uid)
    assert (record["verdict"], record["reason"], record["host"]) == ("denied", "NotAllowed", target)
    assert record["message"].startswith(says)


def test_https_to_a_refused_name_is_a_plain_403_not_a_tls_error(proxy, origin):
    uid, url = proxy.run(rules(origin))
    with pytest.raises(urllib.error.URLError, match="Tunnel connection failed: 403"):
        fetch(url, f"https://other.test:{origin.tls_port}/", origin)
    status, headers, _ = connect(url, f"other.test:{origin.tls_port}")
    assert status == "HTTP/1.1 403 Forbidden"
    assert headers["X-Coderun-Refused"].startswith(f"egress to other.test:{origin.tls_port} is not allowed by "
                                                   f"CodeRunPolicy {proxy.policy}")
    assert [r["reason"] for r in one_record(proxy, uid, 2)] == ["NotAllowed", "NotAllowed"]


def test_an_allowed_name_on_another_port_is_refused(proxy, origin):
    _, url = proxy.run(rules(origin))
    status, body, _ = fetch(url, "http://allowed.test:9/", origin)
    assert status == 403 and b"egress to allowed.test:9 is not allowed" in body


def test_a_name_resolving_into_a_protected_range_is_refused_unless_a_cidr_rule_covers_it(proxy, origin):
    uid, url = proxy.run(rules(origin, cidr=False))
    status, body, _ = fetch(url, f"http://allowed.test:{origin.plain_port}/", origin)
    assert status == 403 and (f"egress to allowed.test:{origin.plain_port} refused: it resolves to 127.0.0.1, "
                              "inside 127.0.0.0/8 (loopback)") in body.decode()
    assert one_record(proxy, uid)[0]["reason"] == "ProtectedAddress"
    with pytest.raises(urllib.error.URLError, match="403"):
        fetch(url, f"https://allowed.test:{origin.tls_port}/", origin)


@pytest.mark.parametrize("target", ["127.0.0.1:{port}", "[::1]:{port}", "2130706433:{port}"])
def test_addresses_are_not_names(proxy, origin, target):
    _, url = proxy.run(rules(origin))
    status, headers, _ = connect(url, target.format(port=origin.tls_port))
    assert status.startswith("HTTP/1.1 403") and "connects to names only" in headers["X-Coderun-Refused"]


@pytest.mark.parametrize("scheme", ["https", "ftp"])
def test_only_connect_and_plain_http(proxy, origin, scheme):
    _, url = proxy.run(rules(origin))
    assert _get_absolute(url, f"{scheme}://allowed.test:{origin.tls_port}/") == 403


def _get_absolute(proxy_url: str, target: str) -> int:
    """GET https://... or ftp://... asked of the proxy itself (squid would speak TLS or FTP to the origin)."""
    parts = urllib.parse.urlsplit(proxy_url)
    credentials = base64.b64encode(f"{parts.username}:{urllib.parse.unquote(parts.password)}".encode()).decode()
    with socket.create_connection((parts.hostname, parts.port), timeout=15) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {credentials}\r\n"
                     "Connection: close\r\n\r\n".encode())
        status = sock.makefile("rb").readline().split()
    return int(status[1])


def test_the_tls_server_name_must_be_the_connect_host(proxy, origin):
    uid, url = proxy.run(rules(origin))
    status, _, answer = connect(url, f"allowed.test:{origin.tls_port}", sni="allowed.test", ca=origin.ca)
    assert status == "HTTP/1.1 200 Connection established" and answer.startswith(b"HTTP/1.1 200 OK")
    status, _, answer = connect(url, f"allowed.test:{origin.tls_port}", sni="other.test", ca=origin.ca)
    assert status == "HTTP/1.1 200 Connection established" and isinstance(answer, (OSError, ssl.SSLError)), answer
    fronted = one_record(proxy, uid, 2)[1]
    assert (fronted["verdict"], fronted["reason"], fronted["sni"], fronted["tls"]) == (
        "denied", "SNIMismatch", "other.test", "terminate")
    assert fronted["message"] == "TLS server name other.test is not the CONNECT host allowed.test: the tunnel was closed"
    assert origin.seen[-1]["path"] == "/tunnelled"  # the first one; the fronted one never reached it


@pytest.mark.parametrize("credential", ["none", "garbage", "another run's user name", "expired", "other key"])
def test_a_bad_credential_is_asked_again_and_opens_nothing(proxy, origin, credential):
    uid, url = proxy.run(rules(origin), expires_in=-1 if credential == "expired" else 600)
    parts = urllib.parse.urlsplit(url)
    url = {"none": f"http://{parts.hostname}:{parts.port}",
           "garbage": f"http://{uid}:v1.tier.e30.AAAA@{parts.hostname}:{parts.port}",
           "another run's user name": url.replace(f"//{uid}:", "//run-999:"),
           "expired": url,
           "other key": url.replace("v1.tier.", "v1.nokey.")}[credential]
    status, _, headers = fetch(url, f"http://allowed.test:{origin.plain_port}/", origin)
    assert status == 407 and headers["Proxy-Authenticate"] == 'Basic realm="coderun-egress"'
    with pytest.raises(urllib.error.URLError, match="407"):
        fetch(url, f"https://allowed.test:{origin.tls_port}/", origin)


def test_a_credential_revoked_at_the_admin_endpoint_is_refused_on_its_next_request(proxy, origin):
    """Squid keeps the credential's answer 5 s, but the budget check, asked on every request, reads the
    revocations on every call: the next request after the revocation is refused, plain or tunnelled."""
    uid, url = proxy.run(rules(origin))
    assert fetch(url, f"http://allowed.test:{origin.plain_port}/", origin)[0] == 200
    assert fetch(url, f"https://allowed.test:{origin.tls_port}/", origin)[0] == 200
    proxy.revoke(uid)
    # 403 from the budget check while squid still holds the credential's answer (5 s), 407 once it asks again
    status, _, headers = fetch(url, f"http://allowed.test:{origin.plain_port}/", origin)
    assert status == 407 or (status == 403 and "was revoked: the run has ended" in headers["X-Coderun-Refused"]), \
        (status, headers)
    line, headers, _ = connect(url, f"allowed.test:{origin.tls_port}")
    assert " 407 " in line or (" 403 " in line and "was revoked" in headers["X-Coderun-Refused"]), (line, headers)


def test_absurd_and_injected_headers_are_refused_and_the_proxy_keeps_serving(proxy, origin):
    uid, url = proxy.run(rules(origin))
    parts = urllib.parse.urlsplit(url)
    credentials = base64.b64encode(f"{uid}:{urllib.parse.unquote(parts.password)}".encode()).decode()
    for request in [
        f"GET http://allowed.test:{origin.plain_port}/ HTTP/1.1\r\nHost: x\r\nX-Big: {'a' * 70000}\r\n"
        f"Proxy-Authorization: Basic {credentials}\r\n\r\n",
        f"GET http://allowed.test%0d%0aX-Evil:%201:{origin.plain_port}/ HTTP/1.1\r\nHost: x\r\n"
        f"Proxy-Authorization: Basic {credentials}\r\n\r\n",
        f"CONNECT allowed.test\r\nX: y:{origin.tls_port} HTTP/1.1\r\nProxy-Authorization: Basic {credentials}\r\n\r\n",
        "\x16\x03\x01garbage\r\n\r\n",
    ]:
        with socket.create_connection((parts.hostname, parts.port), timeout=15) as sock:
            sock.sendall(request.encode())
            answer = sock.recv(4096)
        assert not answer.startswith(b"HTTP/1.1 200"), (request[:60], answer[:200])
    assert fetch(url, f"http://allowed.test:{origin.plain_port}/", origin)[0] == 200


def test_one_client_cannot_hold_all_the_connections(proxy, origin):
    _, flood = proxy.run(rules(origin))
    parts = urllib.parse.urlsplit(flood)
    held = []
    try:
        for _ in range(70):  # idle connections from one client address (a run's pod)
            held.append(socket.create_connection((parts.hostname, parts.port), timeout=5,
                                                 source_address=("127.0.0.2", 0)))
        status, _, _ = connect(flood, f"allowed.test:{origin.tls_port}", source="127.0.0.2")
        assert status.startswith("HTTP/1.1 403"), status
        _, calm = proxy.run(rules(origin))
        assert fetch(calm, f"http://allowed.test:{origin.plain_port}/", origin)[0] == 200  # another client
    finally:
        for sock in held:
            sock.close()


def test_the_admin_endpoint_hands_out_each_run_s_own_records_and_nothing_unverified(proxy, origin):
    uid, url = proxy.run(rules(origin))
    other, _ = proxy.run(rules(origin))
    assert fetch(url, f"http://allowed.test:{origin.plain_port}/one", origin)[0] == 200
    assert fetch(url, f"http://other.test:{origin.plain_port}/", origin)[0] == 403
    forged = url.replace(f"//{uid}:", f"//{other}:")  # another run's name, this run's token: a 407 for nobody
    assert fetch(forged, f"http://allowed.test:{origin.plain_port}/", origin)[0] == 407
    one_record(proxy, uid, 2)
    status, body, headers = proxy.ask_admin("GET", f"/runs/{uid}/log")
    records = [json.loads(line) for line in body.splitlines()]
    assert status == 200 and [(r["host"], r["verdict"]) for r in records] == [("allowed.test", "allowed"),
                                                                              ("other.test", "denied")]
    assert headers["X-Coderun-Requests"] == "2" and headers["X-Coderun-Dropped"] == "0"
    assert proxy.ask_admin("GET", f"/runs/{other}/log")[1] == b""
    assert proxy.ask_admin("GET", f"/runs/{uid}/log", bearer="guess")[0] == 401


def test_a_credential_for_another_proxy_pod_opens_nothing_here(proxy, origin):
    """A run's credential names the proxy pod it is pinned to; its NetworkPolicy opens every proxy pod, so a
    program may dial another, whose helpers refuse it: the run's budget is counted in one place."""
    _, url = proxy.run(rules(origin), pod="coderun-egress-proxy-elsewhere")
    status, _, _ = fetch(url, f"http://allowed.test:{origin.plain_port}/", origin)
    assert status == 407
    line, _, _ = connect(url, f"allowed.test:{origin.tls_port}")
    assert " 407 " in line, line


def test_a_run_over_its_request_budget_is_refused_at_once_and_exactly_saying_so(proxy, origin):
    """Back to back, with no wait for the log: the budget counts a request as it asks, whatever the policy then
    says of it (the run's status counts them so). A CONNECT is one request (its TLS stage is not counted again)."""
    uid, url = proxy.run(rules(origin), budget=Budget(requests=4))
    assert fetch(url, f"http://other.test:{origin.plain_port}/", origin)[0] == 403  # not allowed: spent all the same
    codes = [fetch(url, f"https://allowed.test:{origin.tls_port}/tls", origin)[0]]
    codes += [fetch(url, f"http://allowed.test:{origin.plain_port}/n{i}", origin)[0] for i in range(5)]
    assert codes == [200, 200, 200, 403, 403, 403], codes
    status, _, headers = fetch(url, f"http://allowed.test:{origin.plain_port}/last", origin)
    assert status == 403 and "spec.egressBudget.requests: 4" in headers["X-Coderun-Refused"]
    records = one_record(proxy, uid, 8)
    assert [r["reason"] for r in records[-4:]] == ["BudgetExceeded"] * 4, records
