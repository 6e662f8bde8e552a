"""The runner's side of the data plane (runner data.py, issue 37): a run's inputs fetched from the data service into
the inputs dir before the program starts and linked from its work dir, and its artifacts past the inline caps
stored through the data service. The real runner against a stand-in data service on 127.0.0.1."""

from __future__ import annotations

import hashlib
import json
import os
import time
import types

import pytest

from coderun.sandbox.runner import data as runner_data
from coderun.sandbox.runner.inputs import InvalidInput, parse_run_spec
from coderun.sandbox.runner.main import execute
from support.data_standin import TOKEN, DataStandIn
from support.runner import run_entries, run_session_runner, run_spec, runner_in, session_stream, \
    write_configmap_dir

CSV = b"a,b\n1,2\n" * 1000
MARKER = "import pathlib\npathlib.Path('ran.marker').write_text('ran')\n"
READS_ITS_INPUT = ("import hashlib, os\n"
                   "data = open('in/data.csv', 'rb').read()\n"
                   "print(os.path.islink('in/data.csv'), len(data), hashlib.sha256(data).hexdigest())\n")


def sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


@pytest.fixture
def service():
    with DataStandIn([CSV]) as standin:
        yield standin


def test_an_input_is_fetched_verified_and_read_through_its_link(tmp_path, service):
    run = runner_in(tmp_path)(READS_ITS_INPUT, data=service.data(["in/data.csv"]))
    assert run.frame["reason"] == "Completed", run.frame
    assert run.frame["stdout"] == f"True {len(CSV)} {sha(CSV)}\n"
    assert run.frame["inputs"] == [{"path": "in/data.csv", "size": len(CSV), "sha256": sha(CSV)}]
    assert os.readlink(run.work / "in" / "data.csv") == str(tmp_path / "inputs" / "in" / "data.csv")
    assert (tmp_path / "inputs" / "in" / "data.csv").read_bytes() == CSV
    assert service.requests == [("GET", "/v1/inputs/0", f"Bearer {TOKEN}")]
    # Nothing of the grant is anywhere the runner prints, nor any temporary file left beside the input.
    assert TOKEN not in run.raw_stdout.decode() and "inputError" not in run.frame
    assert os.listdir(tmp_path / "inputs" / "in") == ["data.csv"]


def test_an_input_nobody_pinned_is_checked_for_size_and_reported_as_it_came(tmp_path, service):
    data = service.data(["in/data.csv"])
    data["inputs"][0]["sha256"] = ""  # an S3 object without a pin or sha256 metadata
    run = runner_in(tmp_path)(READS_ITS_INPUT, data=data)
    assert run.frame["reason"] == "Completed", run.frame
    assert run.frame["inputs"] == [{"path": "in/data.csv", "size": len(CSV), "sha256": sha(CSV)}]
    short = service.data(["in/data.csv"])
    short["inputs"][0].update(sha256="", size=len(CSV) + 1)  # the size still holds it
    failed = runner_in(tmp_path / "again")(READS_ITS_INPUT, data=short)
    assert failed.frame["inputError"]["reason"] in ("InputMismatch", "InputUnavailable"), failed.frame


def test_a_busy_data_service_is_asked_again_after_its_retry_after(tmp_path, service):
    service.input_modes[0] = "busy-once"
    service.artifact_mode = "busy-once"
    code = READS_ITS_INPUT + ("import os\nopen(os.path.join(os.environ['CODERUN_OUTPUT_DIR'], 'big.bin'), 'wb')"
                              ".write(b'b' * 600000)\n")
    run = runner_in(tmp_path)(code, data=service.data(["in/data.csv"], artifacts_to_store=True),
                              artifacts=STORING_CAPS)
    assert run.frame["reason"] == "Completed", run.frame
    assert service.gets() == ["/v1/inputs/0", "/v1/inputs/0"]  # busy, then the bytes
    assert [a["name"] for a in run.frame["artifacts"] if a.get("stored")] == ["big.bin"]
    assert [m for m, p, _ in service.requests if m == "PUT"] == ["PUT", "PUT"]


def test_the_grant_never_reaches_the_programs_environment_or_argv(tmp_path, service):
    code = "import os, sys\nprint(repr(dict(os.environ)), sys.argv, open('/proc/self/cmdline','rb').read())\n"
    run = runner_in(tmp_path)(code, data=service.data(["data.csv"]))
    assert run.frame["reason"] == "Completed", run.frame
    assert "d1." not in run.frame["stdout"] and "eyJ" not in run.frame["stdout"]
    assert "PATH" in run.frame["stdout"]  # the positive control: the environment was printed


@pytest.mark.parametrize("mode, reason, says", [
    ("wrong-bytes", "InputMismatch", "not the"),
    ("409", "InputMismatch", "InputMismatch"),
    ("404", "InputUnavailable", "InputUnavailable"),
    ("cut", "InputUnavailable", "the body ended early"),
    ("announce-longer", "InputTooLarge", "more than"),
    ("chunked-longer", "InputTooLarge", "more than"),
])
def test_an_input_that_fails_stops_the_run_before_its_program(tmp_path, service, mode, reason, says):
    service.input_modes[0] = mode
    run = runner_in(tmp_path)(MARKER, data=service.data(["data.csv"]))
    assert run.frame["reason"] == reason, run.frame
    assert run.frame["inputError"]["path"] == "data.csv" and run.frame["inputError"]["reason"] == reason
    assert says in run.frame["inputError"]["message"] and "data.csv" in run.frame["message"]
    assert run.frame["exitCode"] is None and run.frame["signal"] is None and "inputs" not in run.frame
    assert not (run.work / "ran.marker").exists()
    # The frame is vouched for as any other; nothing partial is left, the grant is in no message.
    assert run.termination["frameSha256"] == sha(run.frame_json) and run.termination["reason"] == reason
    assert os.listdir(tmp_path / "inputs") == []
    assert TOKEN not in run.raw_stdout.decode()


def test_a_data_service_that_refuses_connections_is_input_unavailable(tmp_path, service):
    data = service.data(["data.csv"])
    with DataStandIn() as gone:
        data["url"] = gone.url  # a port that was listening and is not any more
    run = runner_in(tmp_path)(MARKER, data=data)
    assert run.frame["inputError"]["reason"] == "InputUnavailable", run.frame
    assert "connection refused" in run.frame["inputError"]["message"]
    assert not (run.work / "ran.marker").exists()


@pytest.mark.parametrize("mode", ["stall-headers", "stall-body"])
def test_a_stalled_data_service_ends_in_input_unavailable_within_the_bound(tmp_path, service, monkeypatch, mode):
    # The bounds shrunk (a real transfer's deadline is 30 s past its size at 5 MB/s): a service that stops
    # answering, before its headers or in the middle of the body, ends the transfer at its deadline.
    monkeypatch.setattr(runner_data, "BOUNDS", runner_data.Bounds(connect_seconds=1, read_seconds=60,
                                                                   base_seconds=1.5, bytes_per_second=1e9))
    service.input_modes[0] = mode
    input_dir = tmp_path / "input"
    write_configmap_dir(input_dir, {"code": MARKER.encode(), "run.json": json.dumps(
        run_spec(data=service.data(["data.csv"]))).encode()})
    args = types.SimpleNamespace(input=str(input_dir), inputs=str(tmp_path / "inputs"),
                                 work=str(tmp_path / "scratch" / "work"), outputs=str(tmp_path / "scratch" / "out"))
    started = time.monotonic()
    frame = execute(args, is_pid1=False)
    elapsed = time.monotonic() - started
    assert frame["reason"] == "InputUnavailable", frame
    assert "did not answer in time" in frame["inputError"]["message"]
    assert 1.4 < elapsed < 5, elapsed
    assert not (tmp_path / "scratch" / "work" / "ran.marker").exists()
    assert os.listdir(tmp_path / "inputs") == []


WRITES_ARTIFACTS = ("import os\nout = os.environ['CODERUN_OUTPUT_DIR']\n"
                    "open(os.path.join(out, 'big.bin'), 'wb').write(bytes(range(256)) * 2000)\n"
                    "open(os.path.join(out, 'small.txt'), 'w').write('small')\n")
BIG = bytes(range(256)) * 2000
STORING_CAPS = {"maxFiles": 16, "maxFileBytes": 1 << 20, "maxTotalBytes": 2 << 20, "inlineFileBytes": 1000,
                "inlineTotalBytes": 4000}


def test_an_artifact_past_the_inline_caps_is_stored_and_a_small_one_stays_inline(tmp_path, service):
    run = runner_in(tmp_path)(WRITES_ARTIFACTS, data=service.data([], artifacts_to_store=True),
                              artifacts=STORING_CAPS)
    assert run.frame["reason"] == "Completed", run.frame
    big, small = run.frame["artifacts"]
    assert big == {"name": "big.bin", "size": len(BIG), "sha256": sha(BIG), "stored": True}
    assert small["name"] == "small.txt" and small["contentBase64"] == "c21hbGw=" and "stored" not in small
    assert service.stored == {"big.bin": BIG}
    assert [(m, p, a) for m, p, a in service.requests] == [("PUT", "/v1/artifacts/big.bin", f"Bearer {TOKEN}")]
    assert run.frame["artifactsSkipped"] == []


def test_without_artifacts_to_store_a_large_artifact_is_skipped_as_before(tmp_path, service):
    run = runner_in(tmp_path)(WRITES_ARTIFACTS, data=service.data([]),
                              artifacts={"maxFiles": 16, "maxFileBytes": 1000, "maxTotalBytes": 4000})
    assert [a["name"] for a in run.frame["artifacts"]] == ["small.txt"]
    assert run.frame["artifactsSkipped"] == [{"name": "big.bin", "why": "too-large"}]
    assert service.requests == []


@pytest.mark.parametrize("mode, why", [("413", "artifact-too-large"), ("lie", "store-failed")])
def test_a_store_that_refuses_or_disagrees_leaves_the_artifact_skipped_with_why(tmp_path, service, mode, why):
    service.artifact_mode = mode
    run = runner_in(tmp_path)(WRITES_ARTIFACTS, data=service.data([], artifacts_to_store=True),
                              artifacts=STORING_CAPS)
    assert run.frame["reason"] == "Completed", run.frame
    assert [a["name"] for a in run.frame["artifacts"]] == ["small.txt"]
    assert run.frame["artifactsSkipped"] == [{"name": "big.bin", "why": why}]


def test_hard_links_and_symlinks_are_skipped_whatever_their_size(tmp_path, service):
    code = ("import os\nout = os.environ['CODERUN_OUTPUT_DIR']\n"
            "open(os.path.join(out, 'a.txt'), 'w').write('a')\nos.link(os.path.join(out, 'a.txt'), "
            "os.path.join(out, 'b.txt'))\nos.symlink('/etc/hostname', os.path.join(out, 'c.txt'))\n"
            "open(os.path.join(out, 'd.txt'), 'w').write('d')\n")
    run = runner_in(tmp_path)(code, data=service.data([], artifacts_to_store=True), artifacts=STORING_CAPS)
    assert run.frame["artifactsSkipped"] == [{"name": "a.txt", "why": "hard-link"},
                                             {"name": "b.txt", "why": "hard-link"},
                                             {"name": "c.txt", "why": "symlink"}]
    assert [a["name"] for a in run.frame["artifacts"]] == ["d.txt"]  # the positive control
    assert service.requests == []


def test_all_caps_count_stored_and_inline_artifacts_together(tmp_path, service):
    code = ("import os\nout = os.environ['CODERUN_OUTPUT_DIR']\n"
            "for name in ('a', 'b', 'c'):\n    open(os.path.join(out, name), 'wb').write(b'x' * 3000)\n")
    caps = dict(STORING_CAPS, maxFiles=2)
    run = runner_in(tmp_path)(code, data=service.data([], artifacts_to_store=True), artifacts=caps)
    assert [(a["name"], a.get("stored", False)) for a in run.frame["artifacts"]] == [("a", True), ("b", True)]
    assert run.frame["artifactsSkipped"] == [{"name": "c", "why": "too-many"}]


def test_a_session_keeps_an_input_it_holds_and_fetches_one_that_changed(tmp_path):
    other = b"other,content\n"
    with DataStandIn([CSV, other]) as service:
        same = service.data(["in/data.csv"])
        # The third run: the first object at a new path, the other at the path the first two runs read.
        changed = service.data(["in/keep.csv", "in/data.csv"])
        stream = session_stream([("a" * 32, run_entries(READS_ITS_INPUT, data=same)),
                                 ("b" * 32, run_entries(READS_ITS_INPUT, data=same)),
                                 ("c" * 32, run_entries(READS_ITS_INPUT, data=changed))])
        run = run_session_runner(tmp_path, stream)
    assert [f["reason"] for f in run.frames] == ["Completed"] * 3, run.frames
    assert [f["stdout"] for f in run.frames] == [f"True {len(CSV)} {sha(CSV)}\n"] * 2 + [
        f"True {len(other)} {sha(other)}\n"]
    # One GET for the first two runs; the third's inputs are new (a new path, a new pin at the old path).
    assert service.gets() == ["/v1/inputs/0", "/v1/inputs/0", "/v1/inputs/1"]
    assert sorted(os.listdir(tmp_path / "inputs" / "in")) == ["data.csv", "keep.csv"]


def test_a_session_drops_the_inputs_a_later_run_does_not_name(tmp_path):
    with DataStandIn([CSV]) as service:
        stream = session_stream([("a" * 32, run_entries(READS_ITS_INPUT, data=service.data(["in/data.csv"]))),
                                 ("b" * 32, run_entries("print('none')\n"))])
        run = run_session_runner(tmp_path, stream)
    assert [f["stdout"] for f in run.frames] == [f"True {len(CSV)} {sha(CSV)}\n", "none\n"], run.frames
    assert os.listdir(tmp_path / "inputs") == []


# run.json's `data`, checked before anything runs

def spec_with(data: dict, **fields) -> dict:
    return {"version": 1, "command": ["python3", "main.py"], "codeFile": "main.py", "timeoutSeconds": 5,
            "data": data, **fields}


GOOD = {"url": "http://10.88.0.12:8080", "token": TOKEN,
        "inputs": [{"path": "d/data.csv", "size": 3, "sha256": "0" * 64}]}


def test_a_good_data_section_is_typed_and_inline_caps_default_to_the_caps():
    spec = parse_run_spec(spec_with(GOOD))
    assert spec["data"] == dict(GOOD, artifactsToStore=False)
    assert spec["artifacts"]["inlineFileBytes"] == spec["artifacts"]["maxFileBytes"]
    assert parse_run_spec(spec_with(GOOD, artifacts={"maxFileBytes": 10, "inlineFileBytes": 99}))[
        "artifacts"]["inlineFileBytes"] == 10
    assert parse_run_spec({k: v for k, v in spec_with(GOOD).items() if k != "data"})["data"] is None


@pytest.mark.parametrize("change, says", [
    ({"url": "https://10.0.0.1:8080"}, "data.url"),
    ({"url": "http://10.0.0.1:8080/path"}, "data.url"),
    ({"url": "http://user@10.0.0.1:8080"}, "data.url"),
    ({"token": TOKEN + "\r\nX-Other: 1"}, "data.token"),
    ({"token": ""}, "data.token"),
    ({"inputs": [{"path": "../x", "size": 1, "sha256": "0" * 64}]}, "'..'"),
    ({"inputs": [{"path": "x", "size": -1, "sha256": "0" * 64}]}, "size"),
    ({"inputs": [{"path": "x", "size": 1, "sha256": "A" * 64}]}, "sha256"),
    ({"inputs": [{"path": "main.py", "size": 1, "sha256": "0" * 64}]}, "used twice"),
    ({"inputs": [{"path": "d", "size": 1, "sha256": "0" * 64}, {"path": "d/x", "size": 1, "sha256": "0" * 64}]},
     "both a file and a dir"),
    ({"artifactsToStore": "yes"}, "artifactsToStore"),
])
def test_a_bad_data_section_is_invalid_input(change, says):
    with pytest.raises(InvalidInput) as raised:
        parse_run_spec(spec_with(dict(GOOD, **change)))
    assert says in str(raised.value)



def test_a_refusal_answered_before_the_body_is_read_is_still_the_why(tmp_path, service):
    # 8 MiB: past what the sockets' buffers hold, so the stand-in's early 413 (and close) comes mid-body.
    service.artifact_mode = "413"
    code = "import os\nopen(os.path.join(os.environ['CODERUN_OUTPUT_DIR'], 'huge.bin'), 'wb').write(b'h' * (8 << 20))\n"
    run = runner_in(tmp_path)(code, data=service.data([], artifacts_to_store=True),
                              artifacts=dict(STORING_CAPS, maxFileBytes=16 << 20, maxTotalBytes=16 << 20))
    assert run.frame["artifactsSkipped"] == [{"name": "huge.bin", "why": "artifact-too-large"}], run.frame


def test_a_session_fetches_again_an_input_a_program_changed(tmp_path):
    # Outside the pod's namespaces (here) nothing stops the program (root, the same uid as the runner) changing
    # the input's file: the next run's runner sees the file is not the one it laid out and fetches it again.
    tamper = ("import os\np = os.path.realpath('in/data.csv')\nos.chmod(p, 0o644)\n"
              "open(p, 'wb').write(b'tampered')\nprint('tampered')\n")
    with DataStandIn([CSV]) as service:
        data = service.data(["in/data.csv"])
        stream = session_stream([("a" * 32, run_entries(tamper, data=data)),
                                 ("b" * 32, run_entries(READS_ITS_INPUT, data=data))])
        run = run_session_runner(tmp_path, stream)
    assert [f["stdout"] for f in run.frames] == ["tampered\n", f"True {len(CSV)} {sha(CSV)}\n"], run.frames
    assert service.gets() == ["/v1/inputs/0", "/v1/inputs/0"]


def test_a_warm_pods_run_fetches_its_inputs_once_it_has_its_input(tmp_path, service):
    run = runner_in(tmp_path)(READS_ITS_INPUT, data=service.data(["in/data.csv"]), warm_nonce="d" * 32,
                              prestart=True)
    assert run.frame["reason"] == "Completed" and run.frame["nonce"] == "d" * 32, run.frame
    assert run.frame["stdout"] == f"True {len(CSV)} {sha(CSV)}\n"
    assert service.gets() == ["/v1/inputs/0"]


# The real thing: the runner against coderun's data service (coderun_operator.data.service) and its store
# (versitygw on loopback, as tests/unit/test_data_service.py starts it).

@pytest.fixture(scope="module")
def real_service(tmp_path_factory):
    import socket
    import subprocess
    import threading
    from pathlib import Path

    from coderun_operator.data.service import DataServer, Service
    from coderun_operator.data.store import StoreSettings, client, ensure_bucket

    repo = Path(__file__).parents[2]
    found = subprocess.run(["bash", "-c", "source e2e/cluster/versions.sh && echo $CODERUN_CACHE/bin/versitygw-"
                            "$VERSITYGW_VERSION/versitygw"], cwd=repo, capture_output=True, text=True, check=True)
    binary = Path(found.stdout.strip())
    if not binary.exists():
        pytest.fail(f"no versitygw at {binary}: run `bash e2e/cluster/build-binaries.sh versitygw`")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = tmp_path_factory.mktemp("store")
    gw = subprocess.Popen([str(binary), "--access", "testkey", "--secret", "testsecret1234", "--quiet",
                           "--port", f"127.0.0.1:{port}", "posix", str(root)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert gw.poll() is None and time.monotonic() < deadline, "versitygw did not listen"
            time.sleep(0.05)  # polling the port, bounded by the deadline
    s3 = client(StoreSettings(f"http://127.0.0.1:{port}", "us-east-1", "testkey", "testsecret1234"))
    ensure_bucket(s3, "coderun")
    server = DataServer(("127.0.0.1", 0), Service(s3, lambda: {"k1": b"k" * 32}, "coderun"))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield s3, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
        gw.terminate()
        gw.wait(10)


def test_against_the_real_data_service_inputs_arrive_and_artifacts_are_stored(tmp_path, real_service):
    from coderun_operator.data.grant import RunGrant, StoredObject, mint
    s3, url = real_service
    s3.put_object(Bucket="coderun", Key="in/data.csv", Body=CSV)
    uid = f"uid-{os.getpid()}-{time.monotonic_ns()}"
    grant = RunGrant(namespace="ns", name="job", uid=uid, expires=int(time.time()) + 600,
                     inputs=(StoredObject("coderun", "in/data.csv", len(CSV), sha(CSV)),), bucket="coderun",
                     artifacts_prefix=f"runs/ns/{uid}/artifacts/", max_file_bytes=len(BIG), max_total_bytes=1 << 20,
                     max_files=4)
    data = {"url": url, "token": mint("k1", b"k" * 32, grant), "artifactsToStore": True,
            "inputs": [{"path": "in/data.csv", "size": len(CSV), "sha256": sha(CSV)}]}
    code = READS_ITS_INPUT + WRITES_ARTIFACTS + ("open(os.path.join(out, 'over.bin'), 'wb')"
                                                 ".write(b'o' * (len(data) + 600000))\n")
    run = runner_in(tmp_path)(code, data=data, artifacts=dict(STORING_CAPS, maxFileBytes=1 << 20))
    assert run.frame["reason"] == "Completed", run.frame
    assert run.frame["stdout"] == f"True {len(CSV)} {sha(CSV)}\n"
    assert [a for a in run.frame["artifacts"] if a.get("stored")] == [
        {"name": "big.bin", "size": len(BIG), "sha256": sha(BIG), "stored": True}]
    # Past the grant's max_file_bytes: the service refuses it, and the frame says why.
    assert run.frame["artifactsSkipped"] == [{"name": "over.bin", "why": "artifact-too-large"}]
    stored = s3.get_object(Bucket="coderun", Key=f"runs/ns/{uid}/artifacts/big.bin")
    assert stored["Body"].read() == BIG and stored["Metadata"]["sha256"] == sha(BIG)
