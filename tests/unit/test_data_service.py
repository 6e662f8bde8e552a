"""The data service (coderun_operator.data.service) against a real S3 store: versitygw, the embedded store's own
binary, on loopback. Each answer the contract names (docs/data.md), and what is left in the store after each
refused or broken transfer: nothing."""
from __future__ import annotations

import dataclasses
import hashlib
import http.client
import itertools
import json
import logging
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from coderun.egress.files import keys_in as keys_in_dir
import coderun_operator.data.service as service_module
from coderun_operator.data.grant import ReadGrant, RunGrant, StoredObject, UploadGrant, mint
from coderun_operator.data.service import DataServer, Service
from coderun_operator.data.store import (Deleted, StoreSettings, StoreUnavailable, client, delete_prefix,
                                         ensure_bucket, head)

REPO = Path(__file__).parents[2]
KEYS = {"k1": b"k" * 32}
MIB = 1 << 20
PART = 5 * MIB  # S3's smallest part: bodies above it go in parts
NS, NAME, UID = "team-a", "job-1", "0f1e-22"
PREFIX = f"runs/{NS}/{UID}/artifacts/"


def versitygw_binary() -> Path:
    """The store's binary as `e2e/cluster/build-binaries.sh versitygw` caches it."""
    found = subprocess.run(["bash", "-c", "source e2e/cluster/versions.sh && echo $CODERUN_CACHE/bin/versitygw-"
                            "$VERSITYGW_VERSION/versitygw"], cwd=REPO, capture_output=True, text=True, check=True)
    return Path(found.stdout.strip())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def store_settings(tmp_path_factory):
    binary = versitygw_binary()
    if not binary.exists():
        pytest.fail(f"no versitygw at {binary}: run `bash e2e/cluster/build-binaries.sh versitygw` (about 75 s, "
                    "cached afterwards)")
    root, port = tmp_path_factory.mktemp("store"), free_port()
    log = open(root.parent / "versitygw.log", "wb")
    gw = subprocess.Popen([str(binary), "--access", "testkey", "--secret", "testsecret1234", "--quiet",
                           "--port", f"127.0.0.1:{port}", "posix", str(root)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if gw.poll() is not None or time.monotonic() > deadline:
                gw.kill()
                pytest.fail(f"versitygw did not listen on {port}: {(root.parent / 'versitygw.log').read_text()}")
            time.sleep(0.05)  # polling the port, bounded by the deadline
    yield StoreSettings(f"http://127.0.0.1:{port}", "us-east-1", "testkey", "testsecret1234")
    gw.terminate()
    gw.wait(10)
    log.close()


@pytest.fixture(scope="session")
def s3(store_settings):
    return client(store_settings)


BUCKETS = itertools.count()


@pytest.fixture
def bucket(s3):
    """A bucket of the test's own, so what each test leaves is its own."""
    name = f"t{next(BUCKETS)}-{os.getpid()}"
    assert ensure_bucket(s3, name) is True
    assert ensure_bucket(s3, name) is False
    return name


class Running:
    def __init__(self, service: Service, **kw):
        self.service = service
        self.server = DataServer(("127.0.0.1", 0), service, **kw)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def request(self, method, path, token=None, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        try:
            conn.request(method, path, body=body, headers={**({"Authorization": f"Bearer {token}"} if token else {}),
                                                           **(headers or {})})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def raw(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=20)

    def headers_only(self, path, token, length) -> tuple[int, str]:
        """A PUT's headers and none of its body: an answer that comes is given before a byte of it is read."""
        with self.raw() as conn:
            conn.sendall(f"PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                         f"Content-Length: {length}\r\n\r\n".encode())
            head_part, _, body = conn.makefile("rb").read().partition(b"\r\n\r\n")  # it closes the connection
        assert b"Connection: close" in head_part
        return int(head_part.split()[1]), json.loads(body)["reason"]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def start():
    running = []

    def make(s3, bucket, **kw):
        server_kw = {k: kw.pop(k) for k in ("max_connections",) if k in kw}
        service = Service(s3, kw.pop("keys", lambda: KEYS), bucket, part_bytes=PART, **kw)
        running.append(Running(service, **server_kw))
        return running[-1]
    yield make
    for r in running:
        r.stop()


@pytest.fixture
def svc(s3, bucket, start):
    return start(s3, bucket)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_grant(bucket, inputs=(), **caps) -> str:
    grant = RunGrant(namespace=NS, name=NAME, uid=UID, expires=int(time.time()) + 600, inputs=tuple(inputs),
                     bucket=bucket, artifacts_prefix=PREFIX,
                     **{"max_file_bytes": 8 * MIB, "max_total_bytes": 16 * MIB, "max_files": 4, **caps})
    return mint("k1", KEYS["k1"], grant)


def upload_grant(bucket, files) -> str:
    return mint("k1", KEYS["k1"], UploadGrant(NS, int(time.time()) + 600, bucket, tuple(files)))


def read_grant(bucket, prefix=PREFIX) -> str:
    return mint("k1", KEYS["k1"], ReadGrant(NS, UID, int(time.time()) + 600, bucket, prefix))


def error(answer) -> tuple[int, str]:
    status, _, body = answer
    return status, json.loads(body)["reason"]


def keys_in(s3, bucket) -> list[str]:
    """Every object and every unfinished multipart upload in the bucket."""
    objects = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents") or ()]
    uploads = [f"(upload) {u['Key']}" for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads") or ()]
    return sorted(objects + uploads)


def put(s3, bucket, key, data, digest=None):
    s3.put_object(Bucket=bucket, Key=key, Body=data, Metadata={"sha256": digest} if digest else {})


# Inputs.

def test_an_input_streams_with_its_pin(s3, bucket, svc, caplog):
    data = os.urandom(3 * MIB + 17)
    put(s3, bucket, "in/data.bin", data, sha(data))
    put(s3, bucket, "in/unpinned.csv", b"a,b\n1,2\n")
    token = run_grant(bucket, [StoredObject(bucket, "in/data.bin", len(data), sha(data)),
                               StoredObject(bucket, "in/unpinned.csv", 8, "")])
    with caplog.at_level(logging.INFO, logger="coderun.data"):
        status, headers, body = svc.request("GET", "/v1/inputs/0", token)
        # (the service logs a transfer once it ended, which may be just after the caller read its last byte)
        deadline = time.monotonic() + 10
        while not any("in/data.bin" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert (status, body == data, headers["Content-Length"], headers["X-Coderun-Sha256"]) == (
        200, True, str(len(data)), sha(data))
    status, headers, body = svc.request("GET", "/v1/inputs/1", token)
    assert (status, body, "X-Coderun-Sha256" in headers) == (200, b"a,b\n1,2\n", False)
    # One line a transfer, naming the run, the object, the bytes and the outcome; never the grant.
    line = [r.getMessage() for r in caplog.records if "in/data.bin" in r.getMessage()]
    assert len(line) == 1 and f"run={NS}/{NAME}" in line[0] and f"bytes={len(data)}" in line[0]
    assert "outcome=ok" in line[0] and token not in caplog.text and token.split(".")[2] not in caplog.text
    assert error(svc.request("GET", "/v1/inputs/2", token)) == (403, "NotGranted")
    assert error(svc.request("GET", "/v1/inputs/x", token)) == (403, "NotGranted")


def test_a_missing_input_is_unavailable_and_a_changed_one_a_mismatch(s3, bucket, svc):
    put(s3, bucket, "in/a", b"12345", sha(b"12345"))
    token = run_grant(bucket, [StoredObject(bucket, "in/gone", 5, sha(b"12345")),
                               StoredObject(bucket, "in/a", 6, sha(b"12345")),
                               StoredObject(bucket, "in/a", 5, sha(b"other")),
                               StoredObject("no-such-bucket", "in/a", 5, ""),
                               StoredObject(bucket, "in/a", 5, sha(b"12345"))])
    status, _, body = svc.request("GET", "/v1/inputs/0", token)
    assert status == 404 and json.loads(body)["reason"] == "InputUnavailable" and "in/gone" in json.loads(body)[
        "message"]
    assert error(svc.request("GET", "/v1/inputs/1", token)) == (409, "InputMismatch")
    assert error(svc.request("GET", "/v1/inputs/2", token)) == (409, "InputMismatch")
    assert error(svc.request("GET", "/v1/inputs/3", token)) == (404, "InputUnavailable")
    assert svc.request("GET", "/v1/inputs/4", token)[::2] == (200, b"12345")  # the control


def test_a_bad_an_expired_or_no_grant_is_refused(s3, bucket, svc):
    put(s3, bucket, "in/a", b"x")
    inputs = [StoredObject(bucket, "in/a", 1, "")]
    good = run_grant(bucket, inputs)
    assert svc.request("GET", "/v1/inputs/0", good)[0] == 200
    assert error(svc.request("GET", "/v1/inputs/0")) == (401, "BadGrant")
    assert error(svc.request("GET", "/v1/inputs/0", good[:-3] + "AAA")) == (401, "BadGrant")
    other = mint("k1", b"o" * 32, RunGrant(NS, NAME, UID, int(time.time()) + 60, tuple(inputs), bucket, PREFIX, 1, 1, 1))
    assert error(svc.request("GET", "/v1/inputs/0", other)) == (401, "BadGrant")
    expired = mint("k1", KEYS["k1"], RunGrant(NS, NAME, UID, int(time.time()) - 1, tuple(inputs), bucket, PREFIX,
                                              1, 1, 1))
    status, headers, _ = svc.request("GET", "/v1/inputs/0", expired)
    assert (status, headers.get("WWW-Authenticate")) == (401, "Bearer")
    assert error(svc.request("GET", "/v1/inputs/0", expired)) == (401, "GrantExpired")
    assert error(svc.request("GET", "/v1/inputs/0", "d1." + "A" * 20000)) == (401, "BadGrant")


# Uploads.

@pytest.mark.parametrize("size", [3 * MIB, PART + MIB + 5], ids=["one-put", "multipart"])
def test_an_upload_is_stored_under_its_sha256(s3, bucket, svc, size):
    data = os.urandom(size)
    token = upload_grant(bucket, [(sha(data), size)])
    status, _, body = svc.request("PUT", f"/v1/uploads/{sha(data)}", token, data)
    key = f"uploads/{NS}/{sha(data)}"
    assert (status, json.loads(body)) == (200, {"sha256": sha(data), "size": size, "key": key})
    assert head(s3, bucket, key) == (size, sha(data))
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data


@pytest.mark.parametrize("size", [3 * MIB, PART + MIB + 5], ids=["one-put", "multipart"])
def test_an_upload_of_other_bytes_leaves_nothing(s3, bucket, svc, size):
    data = os.urandom(size)
    promised = sha(data[:-1] + bytes([data[-1] ^ 1]))
    token = upload_grant(bucket, [(promised, size)])
    status, _, body = svc.request("PUT", f"/v1/uploads/{promised}", token, data)
    assert (status, json.loads(body)["reason"]) == (400, "InputMismatch")
    assert promised in json.loads(body)["message"]
    assert keys_in(s3, bucket) == []
    # Another size than the grant's is refused before a byte is read.
    assert svc.headers_only(f"/v1/uploads/{promised}", token, size + 1) == (400, "InputMismatch")
    assert keys_in(s3, bucket) == []


def test_an_upload_already_there_is_answered_at_once_without_its_body(s3, bucket, svc):
    data = b"hello world"
    put(s3, bucket, f"uploads/{NS}/{sha(data)}", data, sha(data))
    token = upload_grant(bucket, [(sha(data), len(data))])
    with svc.raw() as conn:  # headers only: the body is never sent, and the answer comes anyway
        conn.sendall(f"PUT /v1/uploads/{sha(data)} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode())
        answer = conn.makefile("rb").read()  # to the end: the service closes the connection
    head_part, _, body = answer.partition(b"\r\n\r\n")
    assert head_part.startswith(b"HTTP/1.1 200") and b"Connection: close" in head_part
    assert json.loads(body) == {"sha256": sha(data), "size": len(data), "key": f"uploads/{NS}/{sha(data)}"}


def test_a_caller_that_sends_its_whole_body_still_reads_an_early_answer(s3, bucket, svc):
    # The runner sends an artifact whole before it reads the answer: an answer given before the body was read
    # (a refusal, or an upload already there) must still reach it, not a connection reset. 16 MiB: more than
    # loopback's socket buffers hold, so the caller is still sending when the answer comes.
    data = os.urandom(16 * MIB)
    put(s3, bucket, f"uploads/{NS}/{sha(data)}", data, sha(data))
    sends = [("/v1/artifacts/big", run_grant(bucket, max_file_bytes=MIB), data, b"HTTP/1.1 413", b'"ArtifactTooLarge"'),
             (f"/v1/uploads/{sha(data)}", upload_grant(bucket, [(sha(data), len(data))]), data, b"HTTP/1.1 200",
              sha(data).encode())]
    for path, token, body, status, word in sends:
        with svc.raw() as conn:
            conn.sendall(f"PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            answer = conn.makefile("rb").read()
        assert answer.startswith(status) and word in answer
    assert keys_in(s3, bucket) == [f"uploads/{NS}/{sha(data)}"]


def test_an_upload_the_grant_does_not_name_is_refused(s3, bucket, svc):
    data = b"abc"
    token = upload_grant(bucket, [(sha(b"other"), 5)])
    assert error(svc.request("PUT", f"/v1/uploads/{sha(data)}", token, data)) == (403, "NotGranted")
    assert error(svc.request("PUT", "/v1/uploads/../../x", token, data)) == (403, "NotGranted")
    assert keys_in(s3, bucket) == []


# Artifacts.

@pytest.mark.parametrize("size", [MIB + 3, PART + MIB + 5], ids=["one-put", "multipart"])
def test_an_artifact_is_stored_with_its_sha256(s3, bucket, svc, size):
    data = os.urandom(size)
    status, _, body = svc.request("PUT", "/v1/artifacts/out/r%C3%A9sult%20one.bin", run_grant(bucket), data)
    key = PREFIX + "out/résult one.bin"
    assert (status, json.loads(body)) == (200, {"name": "out/résult one.bin", "key": key, "size": size,
                                                "sha256": sha(data)})
    assert head(s3, bucket, key) == (size, sha(data))
    assert keys_in(s3, bucket) == [key]
    # And a read grant reads it back, with the sha256 the service computed.
    token = read_grant(bucket)
    status, headers, got = svc.request("GET", "/v1/artifacts/out/r%C3%A9sult%20one.bin", token)
    assert (status, got == data, headers["X-Coderun-Sha256"]) == (200, True, sha(data))
    assert error(svc.request("GET", "/v1/artifacts/out/other.bin", token)) == (404, "ArtifactUnavailable")
    # only under its own run's prefix: another run's artifact is out of its reach, whatever the name says
    assert error(svc.request("GET", "/v1/artifacts/out/r%C3%A9sult%20one.bin",
                             read_grant(bucket, f"runs/{NS}/other-uid/artifacts/"))) == (404, "ArtifactUnavailable")
    assert error(svc.request("GET", "/v1/artifacts/..%2F..%2Fother-uid%2Fartifacts%2Fx", token)) == \
        (400, "BadArtifactName")


def test_the_artifact_caps(s3, bucket, svc):
    token = run_grant(bucket, max_file_bytes=MIB, max_total_bytes=2 * MIB, max_files=3)
    assert svc.headers_only("/v1/artifacts/big", token, MIB + 1) == (413, "ArtifactTooLarge")
    assert svc.request("PUT", "/v1/artifacts/a", token, b"x" * MIB)[0] == 200
    assert svc.request("PUT", "/v1/artifacts/a", token, b"y" * MIB)[0] == 200  # the same name again: replaced
    assert svc.request("PUT", "/v1/artifacts/b", token, b"x" * (MIB - 10))[0] == 200
    assert error(svc.request("PUT", "/v1/artifacts/c", token, b"x" * 11)) == (413, "ArtifactsTooLarge")
    assert svc.request("PUT", "/v1/artifacts/c", token, b"x" * 10)[0] == 200  # exactly at the total cap
    assert error(svc.request("PUT", "/v1/artifacts/d", token, b"")) == (413, "TooManyArtifacts")
    assert keys_in(s3, bucket) == [PREFIX + "a", PREFIX + "b", PREFIX + "c"]
    assert s3.get_object(Bucket=bucket, Key=PREFIX + "a")["Body"].read() == b"y" * MIB


@pytest.mark.parametrize("path", ["/v1/artifacts/a/../b", "/v1/artifacts/..", "/v1/artifacts/%2Fetc%2Fpasswd",
                                  "/v1/artifacts//etc/passwd", "/v1/artifacts/", "/v1/artifacts/a%00b",
                                  "/v1/artifacts/./a", "/v1/artifacts/%FF", "/v1/artifacts/" + "x" * 1025])
def test_a_bad_artifact_name_is_refused(s3, bucket, svc, path):
    assert error(svc.request("PUT", path, run_grant(bucket), b"data")) == (400, "BadArtifactName")
    assert keys_in(s3, bucket) == []


@pytest.mark.parametrize("size", [3 * MIB, PART + 2 * MIB], ids=["one-put", "multipart"])
@pytest.mark.parametrize("route", ["artifacts/out.bin", "uploads"])
def test_a_body_cut_short_leaves_nothing(s3, bucket, svc, size, route):
    data = os.urandom(size)
    token = upload_grant(bucket, [(sha(data), size)]) if route == "uploads" else run_grant(bucket)
    path = f"/v1/uploads/{sha(data)}" if route == "uploads" else f"/v1/{route}"
    with svc.raw() as conn:
        conn.sendall(f"PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     f"Content-Length: {size}\r\n\r\n".encode() + data[:size - MIB - 1])
        conn.shutdown(socket.SHUT_WR)  # the caller is gone half way
        answer = conn.makefile("rb").read()
    assert answer.startswith(b"HTTP/1.1 400") and b'"BodyCutShort"' in answer
    assert keys_in(s3, bucket) == []


def test_each_grant_opens_only_its_own_routes(s3, bucket, svc):
    put(s3, bucket, "in/a", b"abc")
    data = b"uploaded"
    run = run_grant(bucket, [StoredObject(bucket, "in/a", 3, "")])
    upload = upload_grant(bucket, [(sha(data), len(data))])
    put(s3, bucket, PREFIX + "a", b"abc")
    read = read_grant(bucket)
    assert error(svc.request("GET", "/v1/inputs/0", read)) == (403, "NotGranted")
    assert error(svc.request("GET", "/v1/inputs/0", upload)) == (403, "NotGranted")
    assert error(svc.request("PUT", f"/v1/uploads/{sha(data)}", run, data)) == (403, "NotGranted")
    assert error(svc.request("PUT", "/v1/artifacts/a", read, data)) == (403, "NotGranted")
    assert error(svc.request("PUT", "/v1/artifacts/a", upload, data)) == (403, "NotGranted")
    assert error(svc.request("GET", "/v1/artifacts/a", run)) == (403, "NotGranted")
    assert keys_in(s3, bucket) == ["in/a", PREFIX + "a"]
    # The controls: each grant on its own route.
    assert svc.request("GET", "/v1/inputs/0", run)[::2] == (200, b"abc")
    assert svc.request("GET", "/v1/artifacts/a", read)[::2] == (200, b"abc")
    assert svc.request("PUT", f"/v1/uploads/{sha(data)}", upload, data)[0] == 200
    assert svc.request("PUT", "/v1/artifacts/a", run, data)[0] == 200


def test_routes_and_methods_outside_the_api(svc, bucket):
    assert error(svc.request("GET", "/v1/other/1", run_grant(bucket))) == (404, "NotFound")
    assert error(svc.request("DELETE", "/v1/artifacts/a", run_grant(bucket))) == (405, "MethodNotAllowed")
    assert error(svc.request("PUT", "/v1/artifacts/a", run_grant(bucket), b"x",
                             {"Transfer-Encoding": "chunked"})) == (411, "LengthRequired")


def test_keys_are_read_from_their_mounted_secret_as_it_changes(s3, bucket, start, tmp_path):
    # The keys Secret may appear after the service starts, and rotate under it: keys_in re-reads the directory.
    svc = start(s3, bucket, keys=keys_in_dir(str(tmp_path)).current)
    put(s3, bucket, "in/a", b"abc")
    inputs = (StoredObject(bucket, "in/a", 3, ""),)
    token = mint("k2", b"n" * 32, RunGrant(NS, NAME, UID, int(time.time()) + 600, inputs, bucket, PREFIX, 1, 1, 1))
    assert error(svc.request("GET", "/v1/inputs/0", token)) == (401, "BadGrant")
    (tmp_path / "k2").write_bytes(b"n" * 32)
    deadline = time.monotonic() + 10
    while svc.request("GET", "/v1/inputs/0", token)[0] != 200:  # looked at again within a second
        assert time.monotonic() < deadline, "the new key was never read"
        time.sleep(0.1)


# Bounds and the store's failures.

def test_busy_past_the_transfers_allowed(s3, bucket, start):
    svc = start(s3, bucket, max_transfers=1)
    put(s3, bucket, "in/a", b"abc")
    token = run_grant(bucket, [StoredObject(bucket, "in/a", 3, "")])
    data = b"z" * 1000
    with svc.raw() as held:
        # An artifact's headers, asking to continue: the service answers 100 once it holds the one transfer.
        held.sendall(f"PUT /v1/artifacts/held HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                     f"Content-Length: {len(data)}\r\nExpect: 100-continue\r\n\r\n".encode())
        reader = held.makefile("rb")
        assert reader.readline() == b"HTTP/1.1 100 Continue\r\n" and reader.readline() == b"\r\n"
        status, headers, body = svc.request("GET", "/v1/inputs/0", token)
        assert (status, json.loads(body)["reason"], headers["Retry-After"]) == (503, "Busy", "2")
        held.sendall(data)
        assert reader.readline().startswith(b"HTTP/1.1 200")
    assert svc.request("GET", "/v1/inputs/0", token)[::2] == (200, b"abc")  # the control: free again


def test_connections_past_the_bound_are_answered_busy_and_closed(s3, bucket, start):
    svc = start(s3, bucket, max_connections=1)
    with svc.raw() as first:
        with svc.raw() as second:
            answer = second.makefile("rb").read()
            assert answer.startswith(b"HTTP/1.1 503") and b'"Busy"' in answer
        first.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert first.makefile("rb").readline().startswith(b"HTTP/1.1 200")


def test_a_store_down_is_503_store_unavailable(store_settings, bucket, start, svc):
    assert svc.request("GET", "/healthz")[0] == 200
    down = client(dataclasses.replace(store_settings, endpoint=f"http://127.0.0.1:{free_port()}"))
    broken = start(down, bucket)
    status, _, body = broken.request("GET", "/healthz")
    assert (status, json.loads(body)["reason"]) == (503, "StoreUnavailable")
    inputs = [StoredObject(bucket, "in/a", 3, "")]
    assert error(broken.request("GET", "/v1/inputs/0", run_grant(bucket, inputs))) == (503, "StoreUnavailable")
    assert error(broken.request("PUT", "/v1/artifacts/a", run_grant(bucket), b"abc")) == (503, "StoreUnavailable")
    data = b"abc"
    assert error(broken.request("PUT", f"/v1/uploads/{sha(data)}", upload_grant(bucket, [(sha(data), 3)]),
                                data)) == (503, "StoreUnavailable")


# The store's small calls the operator makes.

def test_the_operators_store_calls(s3, bucket, store_settings):
    put(s3, bucket, "runs/ns/u1/artifacts/a", b"abc", sha(b"abc"))
    put(s3, bucket, "runs/ns/u1/artifacts/b/c", b"d")
    put(s3, bucket, "runs/ns/u10/artifacts/a", b"kept")
    assert head(s3, bucket, "runs/ns/u1/artifacts/a") == (3, sha(b"abc"))
    assert head(s3, bucket, "runs/ns/u1/artifacts/b/c") == (1, None)
    assert head(s3, bucket, "runs/ns/u1/artifacts/none") is None
    with pytest.raises(ValueError):
        delete_prefix(s3, bucket, "runs/ns/u1")  # not a folder: it would take u10 too
    assert delete_prefix(s3, bucket, "runs/ns/u1/", max_pages=1) == Deleted(2, False)
    assert delete_prefix(s3, bucket, "runs/ns/u1/") == Deleted(0, True)
    assert keys_in(s3, bucket) == ["runs/ns/u10/artifacts/a"]
    down = client(dataclasses.replace(store_settings, endpoint=f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(StoreUnavailable):
        head(down, bucket, "runs/ns/u10/artifacts/a")


def test_store_settings_from_a_mounted_secret_or_the_api(tmp_path):
    import base64
    values = {"endpoint": "http://store:7070\n", "region": "us-east-1", "access-key-id": "a", "secret-access-key": "s"}
    for entry, value in values.items():
        (tmp_path / entry).write_text(value)
    settings = StoreSettings.from_dir(str(tmp_path))
    assert settings == StoreSettings("http://store:7070", "us-east-1", "a", "s") and "'s'" not in repr(settings)
    data = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
    assert StoreSettings.from_secret_data(data) == settings
    with pytest.raises(ValueError, match="no entry 'region'"):
        StoreSettings.from_secret_data({k: v for k, v in data.items() if k != "region"})
    with pytest.raises(ValueError, match="not an http"):
        StoreSettings.from_secret_data({**data, "endpoint": base64.b64encode(b"store:7070").decode()})
    (tmp_path / "secret-access-key").unlink()
    with pytest.raises(ValueError, match="no entry 'secret-access-key'"):
        StoreSettings.from_dir(str(tmp_path))


def test_headers_that_drip_are_cut_at_the_header_deadline(s3, bucket, start, monkeypatch):
    monkeypatch.setattr(service_module, "HEADER_SECONDS", 0.5)
    svc = start(s3, bucket)
    with svc.raw() as slow:
        slow.sendall(b"GET /v1/inputs/0 HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        slow.settimeout(10)  # far past the deadline: a connection held open fails the read below
        assert slow.makefile("rb").read() == b""  # closed by the service, not by us
    assert svc.request("GET", "/healthz")[0] == 200  # the control: a whole request in time is answered


def test_one_address_holds_a_bounded_number_of_connections(s3, bucket, start, monkeypatch):
    monkeypatch.setattr(service_module, "MAX_CONNECTIONS_PER_ADDRESS", 2)
    svc = start(s3, bucket)
    with svc.raw() as first, svc.raw() as second:
        with svc.raw() as third:
            answer = third.makefile("rb").read()
            assert answer.startswith(b"HTTP/1.1 503") and b'"Busy"' in answer
        first.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert first.makefile("rb").readline().startswith(b"HTTP/1.1 200")
    # the address's count comes back down once the service's threads saw the connections close (waited for)
    deadline = time.monotonic() + 10
    while svc.request("GET", "/healthz")[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert svc.request("GET", "/healthz")[0] == 200


@pytest.mark.parametrize("size", [MIB + 3, PART + MIB + 5], ids=["one-put", "multipart"])
def test_an_artifact_declared_with_its_sha256_is_stored_so_or_not_at_all(s3, bucket, svc, size):
    data = os.urandom(size)
    status, _, body = svc.request("PUT", "/v1/artifacts/declared.bin", run_grant(bucket), data,
                                  {"X-Coderun-Sha256": sha(data)})
    assert (status, json.loads(body)["sha256"]) == (200, sha(data))
    assert head(s3, bucket, PREFIX + "declared.bin") == (size, sha(data))
    assert error(svc.request("PUT", "/v1/artifacts/lied.bin", run_grant(bucket), data,
                             {"X-Coderun-Sha256": "0" * 64})) == (400, "ArtifactMismatch")
    assert PREFIX + "lied.bin" not in keys_in(s3, bucket)
