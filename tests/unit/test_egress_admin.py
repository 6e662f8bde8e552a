"""The egress proxy's per-run logs and its admin endpoint, on their own (no squid): what the log daemon keeps of
each run, capped, what it counts for budgets, and the operator's endpoint that revokes and hands the logs out."""
import http.client
import io
import json
import threading
import time

import pytest

from coderun.egress import access_log, squid_config
from coderun.egress.admin import authorised, make_server
from coderun.egress.credential import admin_bearer, parse_revocations
from coderun.egress.run_logs import RunLogs, Usage

KEY = b"k" * 32


def record(uid="u-1", **values):
    return {"uid": uid, "host": "a.example.org", "verdict": "allowed", "bytes_sent": 10, "bytes_received": 90,
            **values}


def test_a_run_s_records_are_kept_up_to_the_cap_and_counted_beyond_it(tmp_path):
    logs = RunLogs(str(tmp_path), max_records=3)
    for _ in range(5):
        logs.append("u-1", record())
    logs.append("u-2", record("u-2", bytes_received=1))
    lines, usage = logs.read("u-1")
    assert len(lines.splitlines()) == 3 and json.loads(lines.splitlines()[0])["host"] == "a.example.org"
    assert usage == Usage(requests=5, bytes_sent=50, bytes_received=450, kept=3, kept_bytes=len(lines), dropped=2)
    assert usage.bytes == 500 and RunLogs(str(tmp_path)).usage("u-2").requests == 1  # another reader, from files
    assert logs.read("u-unknown") == (b"", Usage())


def test_a_run_s_log_is_capped_in_bytes_too_and_old_runs_are_swept(tmp_path):
    logs = RunLogs(str(tmp_path), max_bytes=450)
    for _ in range(5):
        logs.append("u-1", record(path="/" + "x" * 100))
    lines, usage = logs.read("u-1")
    assert len(lines) <= 450 and usage.kept == 2 and usage.dropped == 3
    logs.sweep(time.time() + logs.ttl + 3600)
    assert logs.read("u-1") == (b"", Usage()) and not list(tmp_path.iterdir())


def test_a_uid_that_is_not_one_never_names_a_file(tmp_path):
    with pytest.raises(ValueError):
        RunLogs(str(tmp_path)).append("../../etc/passwd", record())


def squid_line(**values) -> str:
    fields = {key: "-" for key, _ in squid_config.FIELDS}
    fields.update({k: str(v) for k, v in values.items()})
    return " ".join(fields[key] for key, _ in squid_config.FIELDS)


def test_the_log_daemon_keeps_a_run_s_records_apart_and_never_attributes_an_unverified_one(tmp_path):
    mine = squid_line(method="GET", host="a.example.org", port=80, stage="policy", status=200, user="u-1", uid="u-1",
                      bytes_sent=5)
    forged = squid_line(method="GET", host="a.example.org", port=80, stage="policy", status=407, user="u-1")
    access_log.serve(str(tmp_path / "access.jsonl"), stdin=io.BytesIO(f"L{mine}\nL{forged}\nL{mine}\n".encode()))
    assert len((tmp_path / "access.jsonl").read_text().splitlines()) == 3  # the pod's own log has all of them
    lines, usage = RunLogs(str(tmp_path / "runs")).read("u-1")
    assert usage.requests == 2 and len(lines.splitlines()) == 2  # the 407 with u-1's name is nobody's


def test_the_proxy_s_own_log_rotates_instead_of_filling_its_volume(tmp_path):
    log = access_log.ProxyLog(str(tmp_path / "access.jsonl"), max_bytes=100)
    for i in range(30):
        log.write(f'{{"n": {i}}}\n')
    log.close()
    assert (tmp_path / "access.jsonl").stat().st_size <= 100 and (tmp_path / "access.jsonl.1").exists()
    assert (tmp_path / "access.jsonl").read_text().splitlines()[-1] == '{"n": 29}'


@pytest.fixture
def admin(tmp_path):
    keys = {"k1": KEY}
    server = make_server("127.0.0.1:0", lambda: keys, str(tmp_path / "revoked"), str(tmp_path / "runs"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, tmp_path, keys
    server.shutdown()
    server.server_close()


def call(server, method, path, body=None, bearer=admin_bearer(KEY), headers=None):
    conn = http.client.HTTPConnection(*server.server_address, timeout=5)
    sent = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    conn.request(method, path, body=body, headers={**sent, **(headers or {})})
    response = conn.getresponse()
    return response.status, response.read(), dict(response.getheaders())


def test_only_a_bearer_derived_from_a_held_key_is_let_in():
    assert authorised(f"Bearer {admin_bearer(KEY)}", {"old": b"o" * 32, "k1": KEY})
    for header in (None, "", admin_bearer(KEY), f"Bearer {admin_bearer(b'x' * 32)}", "Bearer ", "Basic abc"):
        assert not authorised(header, {"k1": KEY}), header
    assert not authorised(f"Bearer {admin_bearer(KEY)}", {})


def test_the_admin_endpoint_revokes_and_hands_out_a_run_s_log(admin):
    server, root, _ = admin
    RunLogs(str(root / "runs")).append("u-1", record())
    status, body, headers = call(server, "GET", "/runs/u-1/log")
    assert status == 200 and json.loads(body)["host"] == "a.example.org"
    assert headers["X-Coderun-Requests"] == "1" and headers["X-Coderun-Dropped"] == "0"
    expires = int(time.time()) + 600
    assert call(server, "POST", "/runs/u-1/revoke", json.dumps({"expires": expires}))[0] == 204
    assert parse_revocations((root / "revoked").read_text().splitlines(), time.time()) == {"u-1"}
    assert call(server, "GET", "/runs/u-2/log")[:2] == (200, b"")  # a run that asked this pod nothing


@pytest.mark.parametrize("method, path, body, bearer, status", [
    ("GET", "/runs/u-1/log", None, None, 401),
    ("GET", "/runs/u-1/log", None, "nope", 401),
    ("GET", "/runs/..%2F..%2Fetc/log", None, admin_bearer(KEY), 404),
    ("GET", "/runs/U-1/log", None, admin_bearer(KEY), 404),
    ("GET", "/runs/u-1/revoke", None, admin_bearer(KEY), 404),
    ("POST", "/runs/u-1/log", "{}", admin_bearer(KEY), 404),
    ("POST", "/runs/u-1/revoke", "x" * 2000, admin_bearer(KEY), 413),
    ("POST", "/runs/u-1/revoke", '{"expires": "soon"}', admin_bearer(KEY), 400),
    ("POST", "/runs/u-1/revoke", "not json", admin_bearer(KEY), 400),
])
def test_the_admin_endpoint_refuses_what_it_does_not_expect(admin, method, path, body, bearer, status):
    server, root, _ = admin
    assert call(server, method, path, body, bearer)[0] == status
    assert not parse_revocations((root / "revoked").read_text().splitlines(), time.time())


def test_a_revocation_outlives_the_admin_container_and_expired_ones_go(tmp_path):
    from coderun.egress.admin import Revocations
    path = str(tmp_path / "revoked")
    first = Revocations(path)
    now = time.time()
    first.revoke("u-1", int(now) + 600, now)
    first.revoke("u-2", int(now) + 1, now)
    again = Revocations(path)  # a restarted container reads what it wrote
    again.revoke("u-3", int(now) + 600, now + 5)
    assert parse_revocations((tmp_path / "revoked").read_text().splitlines(), now + 5) == {"u-1", "u-3"}
    assert "u-2" not in (tmp_path / "revoked").read_text()
