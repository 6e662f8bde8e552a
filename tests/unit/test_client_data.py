"""The SDK and the CLI move a run's large inputs and artifacts through the data service (issue 37): the SDK picks
inline or upload per file, uploads what the run waits for, and reads stored artifacts checked against the run's
record. Against the fake API server (fake_api.py, the test plays the operator) and a stand-in data service on
127.0.0.1 (below, the contract's HTTP API), both over real HTTP."""
import asyncio
import base64
import tracemalloc

import pytest

from coderun import cli
from coderun.api.models import MAX_FILE_CONTENT_CHARS, MAX_INPUT_TOTAL_CHARS
from coderun.client import (ArtifactUnavailable, CodeRunClient, InputTooLarge, UploadFailed, artifact_input)
from coderun.client.inputs import split_files
from coderun.client.result import result_from_object
from coderun.tools import render_result
from fake_api import FakeApiServer
from fake_data import EXPIRES, READ_TOKEN, UPLOAD_TOKEN, DataService, sha

BIG = 3 * MAX_FILE_CONTENT_CHARS  # past one inline file: uploaded


@pytest.fixture
def api():
    server = FakeApiServer().start()
    yield server
    server.stop()


@pytest.fixture
def service():
    with DataService() as standin:
        yield standin


@pytest.fixture
def client(api, tmp_path):
    return CodeRunClient(kubeconfig=str(api.kubeconfig(tmp_path / "kubeconfig")), client_name="test")


SUCCEEDED = {"phase": "Succeeded", "reason": "Completed", "exitCode": 0, "stdout": "ok\n"}


def operator(api, service, *, held=()):
    """Play the operator: a created run whose uploads the store lacks waits for them (Pending, status.upload);
    once the last one came it ends Succeeded, recording its inputs. Runs needing none end at once."""
    def on_create(obj):
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        inputs = obj["spec"].get("inputs") or []
        wanted = [{"path": i["path"], **i["upload"]} for i in inputs
                  if "upload" in i and i["upload"]["sha256"] not in held]
        records = [{"path": i["path"], "source": f"upload:{i['upload']['sha256']}", "size": i["upload"]["size"],
                    "sha256": i["upload"]["sha256"]} for i in inputs if "upload" in i]
        if not wanted:
            obj["status"] = {**SUCCEEDED, **({"inputs": records} if records else {})}
            return

        def on_upload(digest):
            if all(f["sha256"] in service.sizes for f in wanted):
                api.finish(namespace, name, {**SUCCEEDED, "inputs": records})
        service.on_upload = on_upload
        obj["status"] = {"phase": "Pending", "reason": "WaitingForUpload",
                         "upload": {"url": service.url, "token": UPLOAD_TOKEN, "expires": EXPIRES, "files": wanted}}
    api.on_create = on_create


def created_spec(api):
    """The spec of the run created last."""
    return [e[2] for e in api.events if e[1] == "ADDED"][-1]["spec"]


# ---- which way in
def test_small_files_go_inline_and_a_larger_one_is_uploaded_in_the_same_call(tmp_path):
    small_text, small_bytes, big = "a,b\n1,2\n", b"\x89PNG\xff", b"x" * BIG
    inline, uploads = split_files({"data.csv": small_text, "img.png": small_bytes, "big.bin": big}, code="print(1)")
    assert [(f.path, f.content, f.content_base64) for f in inline] == [
        ("data.csv", small_text, None), ("img.png", None, base64.b64encode(small_bytes).decode())]
    assert [(u.path, u.size, u.sha256) for u in uploads] == [("big.bin", BIG, sha(big))]


def test_files_that_fit_one_by_one_but_not_together_overflow_to_uploads():
    piece = "y" * MAX_FILE_CONTENT_CHARS  # each fits, three of them pass the spec's total with the code
    count = MAX_INPUT_TOTAL_CHARS // MAX_FILE_CONTENT_CHARS
    inline, uploads = split_files({f"p{i}.txt": piece for i in range(count)}, code="print(1)")
    assert len(inline) == count - 1 and [u.path for u in uploads] == [f"p{count - 1}.txt"]


def test_a_small_path_goes_inline_and_a_large_one_is_hashed_without_reading_it_whole(tmp_path, monkeypatch):
    (tmp_path / "small.csv").write_text("a\n1\n")
    big = tmp_path / "big.csv"
    with big.open("wb") as handle:
        for i in range(5):
            handle.write(bytes([65 + i]) * (1024 * 1024))
    expected = sha(big.read_bytes())
    read_whole = type(big).read_bytes
    monkeypatch.setattr(type(big), "read_bytes",
                        lambda self: pytest.fail(f"{self} read whole") if self == big else read_whole(self))
    inline, uploads = split_files({"small.csv": tmp_path / "small.csv", "big.csv": big})
    assert [(f.path, f.content) for f in inline] == [("small.csv", "a\n1\n")]
    assert [(u.path, u.size, u.sha256, u.source) for u in uploads] == [("big.csv", 5 * 1024 * 1024, expected, big)]


def test_a_file_past_coderuns_own_bound_is_refused_before_any_request(monkeypatch):
    monkeypatch.setattr("coderun.client.inputs.MAX_INPUT_BYTES", BIG - 1)
    with pytest.raises(InputTooLarge, match=r"input big.bin \(\d+ bytes\) is too large.*spec.data.maxInputBytes"):
        split_files({"big.bin": b"x" * BIG})


# ---- uploads, end to end through the SDK
def test_a_small_file_goes_in_the_spec_and_nothing_is_uploaded(api, service, client):
    operator(api, service)
    result = client.run("print(open('d.csv').read())", files={"d.csv": "a,b\n"})
    assert result.succeeded and service.requests == []
    spec = created_spec(api)
    assert spec["files"] == [{"path": "d.csv", "content": "a,b\n"}] and "inputs" not in spec


def test_big_bytes_are_uploaded_to_the_url_the_run_names_and_the_run_then_ends(api, service, client):
    operator(api, service)
    big = bytes(range(256)) * (BIG // 256)
    result = client.run("...", files={"data/big.bin": big, "small.txt": "hi"})
    assert result.succeeded and [i.path for i in result.inputs] == ["data/big.bin"]
    spec = created_spec(api)
    assert spec["files"] == [{"path": "small.txt", "content": "hi"}]
    assert spec["inputs"] == [{"path": "data/big.bin", "upload": {"sha256": sha(big), "size": len(big)}}]
    assert service.puts() == [("PUT", f"/v1/uploads/{sha(big)}", f"Bearer {UPLOAD_TOKEN}", str(len(big)))]
    assert service.uploads[sha(big)] == big


def test_a_path_and_an_open_file_are_streamed_from_disk(api, service, client, tmp_path):
    operator(api, service)
    local = tmp_path / "big.csv"
    local.write_bytes(b"row,value\n" * (BIG // 10))
    other = tmp_path / "other.bin"
    other.write_bytes(b"\x00\xff" * BIG)
    with other.open("rb") as handle:
        result = client.run("...", files={"big.csv": local, "other.bin": handle})
    assert result.succeeded
    assert service.uploads == {sha(local.read_bytes()): local.read_bytes(), sha(other.read_bytes()): other.read_bytes()}


def test_bytes_the_store_holds_already_are_not_sent_again(api, service, client):
    big = b"z" * BIG
    operator(api, service, held={sha(big)})
    assert client.run("...", files={"big.bin": big}).succeeded
    assert service.requests == []


@pytest.mark.parametrize("continue_mode", ["checked", "at-once", "never"])
def test_the_body_follows_100_continue_or_a_short_wait_for_it(api, service, client, monkeypatch, continue_mode):
    monkeypatch.setattr("coderun.client.data.CONTINUE_SECONDS", 0.2)  # a server that never says it
    operator(api, service)
    service.continue_mode = continue_mode
    big = bytes(range(256)) * (BIG // 256)
    assert client.run("...", files={"big.bin": big}).succeeded
    assert service.uploads == {sha(big): big} and service.expects == ["100-continue"]


def test_memory_stays_flat_in_the_size_of_an_uploaded_path_and_a_stored_artifact_written_to_a_file(
        api, service, client, tmp_path):
    """64 MiB each way, traced in this process (the stand-in's threads too): the peak is the chunks in flight."""
    operator(api, service)
    service.keep_bodies = False
    local = tmp_path / "big.bin"
    with local.open("wb") as out:
        for i in range(64):
            out.write(bytes([i]) * (1 << 20))
    digest = sha(local.read_bytes())
    artifact = local.read_bytes()
    stored_run(api, service, {"out.bin": artifact})
    result = client.get("run-a")
    tracemalloc.start()
    try:
        assert client.run("...", files={"big.bin": local}).succeeded
        uploaded_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        client.artifact(result, "out.bin", path=tmp_path / "out.bin")
        downloaded_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert service.sizes == {digest: 64 << 20} and (tmp_path / "out.bin").read_bytes() == artifact
    # a few 1 MiB chunks in flight (and the stand-in's): far below the 64 MiB a whole read would hold
    assert uploaded_peak < 24 << 20 and downloaded_peak < 24 << 20, (uploaded_peak, downloaded_peak)


def test_an_upload_answered_before_its_body_was_read_counts(api, service, client):
    operator(api, service)
    service.upload_mode = "present"  # the store had it: 200 at once, Connection: close, body not read
    big = b"p" * (16 * 1024 * 1024)
    seen = client.run("...", files={"big.bin": big}, wait=False)  # returns once the uploads are sent
    assert seen.upload is not None and [r[1] for r in service.puts()] == [f"/v1/uploads/{sha(big)}"]
    assert service.uploads == {}  # never read: the service said at once it had those bytes


def test_wait_for_returns_once_the_predicate_holds_or_the_run_ended(api, service, client):
    operator(api, service)
    created = client.run("...", inputs=[{"path": "a.csv", "upload": {"sha256": "0" * 64, "size": 10}}], wait=False)
    waiting = client.wait_for(created.name, lambda r: r.reason == "WaitingForUpload", timeout=10)
    assert waiting.upload.files[0].path == "a.csv" and service.requests == []  # nothing given, nothing sent
    api.finish("agents", created.name, {"phase": "Failed", "reason": "InputUnavailable"})
    ended = client.wait_for(created.name, lambda r: r.reason == "never", timeout=10)
    assert ended.reason == "InputUnavailable"


def test_an_upload_refused_for_its_size_is_input_too_large_naming_the_file_and_the_run_is_deleted(api, service,
                                                                                                    client):
    operator(api, service)
    service.upload_mode = "413"
    with pytest.raises(InputTooLarge) as refused:
        client.run("...", files={"huge.parquet": b"h" * BIG})
    message = str(refused.value)
    assert message.startswith(f"input huge.parquet ({BIG} bytes) is too large: the data service refused it "
                              "(InputTooLarge): upload")
    assert "spec.data.maxInputBytes" in message and "was deleted" in message
    assert api.runs == {}  # nobody would ever send its bytes: the run is gone


def test_a_run_the_operator_ends_for_its_input_sizes_is_input_too_large_and_nothing_is_sent(api, service, client):
    message = ("input big.bin (upload:...) is 786432 bytes, over the policy's data.maxInputBytes (1000): send a "
               "smaller file or ask the platform team for a larger cap")
    api.on_create = lambda obj: obj.update(status={"phase": "Failed", "reason": "InputTooLarge", "message": message})
    with pytest.raises(InputTooLarge, match=r"refused its inputs \(InputTooLarge\): input big.bin .*maxInputBytes"):
        client.run("...", files={"big.bin": b"b" * BIG})
    assert service.requests == []
    operator(api, service)  # the control: the same call goes through when the operator waits for the upload
    assert client.run("...", files={"big.bin": b"b" * BIG}).succeeded and len(service.puts()) == 1


def test_a_run_the_policy_refuses_before_its_uploads_is_policy_denied_and_kept_like_any_refused_run(api, service,
                                                                                                     client):
    from coderun.client import PolicyDenied
    api.on_create = lambda obj: obj.update(status={"phase": "Rejected", "reason": "PolicyDenied",
                                                   "policyRule": "data.buckets", "message": "no inputs here"})
    with pytest.raises(PolicyDenied, match="no inputs here") as denied:
        client.run("...", files={"big.bin": b"r" * BIG})
    assert denied.value.rule == "data.buckets" and service.requests == []
    assert list(api.runs) == [("agents", denied.value.result.name)]  # kept: not an upload's failure


def test_an_unreachable_data_service_is_upload_failed_naming_the_file(api, service, client, monkeypatch):
    operator(api, service)
    monkeypatch.setattr("coderun.client.data.time.sleep", lambda seconds: None)  # the retries' backoff
    service.server.server_close()  # nobody listens there any more
    with pytest.raises(UploadFailed, match="upload of input big.bin failed: cannot connect to the data service"):
        client.run("...", files={"big.bin": b"b" * BIG})


def test_a_session_run_uploads_its_large_file_and_a_later_run_sends_it_no_more(api, service, client):
    big = b"s" * BIG
    api.sessions[("agents", "s1")] = {"metadata": {"name": "s1", "namespace": "agents"},
                                      "spec": {"language": "python"}}
    operator(api, service)
    session = client.open_session("s1")
    assert session.run("...", files={"big.bin": big}).succeeded
    assert created_spec(api)["session"] == "s1" and service.uploads == {sha(big): big}
    operator(api, service, held={sha(big)})  # the store keeps it by its sha256: the operator asks for nothing
    assert session.run("...", files={"big.bin": big}).succeeded and len(service.puts()) == 1


def test_a_session_uploads_once_and_every_later_run_has_the_file_with_nothing_sent_again(api, service, client):
    big, small = b"u" * BIG, b"a,b\n"
    api.sessions[("agents", "s2")] = {"metadata": {"name": "s2", "namespace": "agents"},
                                      "spec": {"language": "python"}}
    operator(api, service)
    session = client.open_session("s2")
    uploaded = session.upload({"big.bin": big, "small.csv": small})
    assert uploaded.succeeded and {i.path for i in uploaded.inputs} == {"big.bin", "small.csv"}
    spec = created_spec(api)
    assert spec["code"] == "\n" and spec["session"] == "s2" and not spec.get("files")  # small ones go the same way
    assert service.uploads == {sha(big): big, sha(small): small}
    operator(api, service, held={sha(big), sha(small)})  # the store keeps them: nothing is asked for
    assert session.run("print(open('big.bin').read(3))").succeeded
    later = {i["path"]: i["upload"]["sha256"] for i in created_spec(api)["inputs"]}
    assert later == {"big.bin": sha(big), "small.csv": sha(small)} and len(service.puts()) == 2
    # a run that names a path itself takes its own file there
    other = b"v" * BIG
    operator(api, service, held={sha(big), sha(small)})
    assert session.run("...", files={"big.bin": other}).succeeded
    assert {i["path"]: i["upload"]["sha256"] for i in created_spec(api)["inputs"]}["big.bin"] == sha(other)


def test_a_caller_outside_the_cluster_names_its_own_way_to_the_data_service(api, service, tmp_path, monkeypatch):
    operator(api, service)
    on_create = api.on_create

    def cluster_address(obj):  # the status names an address only pods reach (a ClusterIP, here a dead port)
        on_create(obj)
        if "upload" in obj["status"]:
            obj["status"]["upload"]["url"] = "http://127.0.0.1:9"
    api.on_create = cluster_address
    monkeypatch.setattr("coderun.client.data.time.sleep", lambda seconds: None)  # the retries' backoff
    kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
    with pytest.raises(UploadFailed, match="set CODERUN_DATA_URL .* `kubectl port-forward"):
        CodeRunClient(kubeconfig=kubeconfig).run("...", files={"big.bin": b"o" * BIG})
    monkeypatch.setenv("CODERUN_DATA_URL", service.url)  # e.g. a port-forward's address
    assert CodeRunClient(kubeconfig=kubeconfig).run("...", files={"big.bin": b"o" * BIG}).succeeded
    stored_run(api, service, {"a.bin": b"abc"})
    api.finish("agents", "run-a", {**api.runs[("agents", "run-a")]["status"],
                                   "dataGrant": {"url": "http://127.0.0.1:9", "token": READ_TOKEN,
                                                 "expires": EXPIRES}})
    assert CodeRunClient(kubeconfig=kubeconfig).get("run-a").artifact("a.bin") == b"abc"


def test_async_client_uploads_too(api, service, tmp_path):
    from coderun.client.aio import AsyncCodeRunClient
    from fake_api import write_kubeconfig
    operator(api, service)
    big = b"q" * BIG
    path = write_kubeconfig(tmp_path / "kubeconfig", api.url)

    stored_run(api, service, {"out.bin": b"stored bytes"})

    async def main():
        async with AsyncCodeRunClient(kubeconfig=str(path)) as aio:
            ran = await aio.run("...", files={"big.bin": big})
            stored = await aio.get("run-a")
            return ran, await aio.artifact(stored, "out.bin"), await stored.artifact("out.bin")
    ran, read, through_result = asyncio.run(main())
    assert ran.succeeded and service.uploads == {sha(big): big}
    assert read == through_result == b"stored bytes"


# ---- inputs by reference
def test_inputs_by_reference_and_an_earlier_runs_artifact(api, service, client):
    operator(api, service)
    earlier = result_from_object({"metadata": {"name": "clean-1", "namespace": "agents"}, "status": {
        "phase": "Succeeded", "artifacts": [{"name": "out/clean.csv", "size": 3, "sha256": "a" * 64, "stored": True}]}})
    client.run("...", inputs=[artifact_input(earlier, "out/clean.csv"),
                              {"path": "raw.csv", "s3": {"bucket": "datasets", "key": "2026/raw.csv"}}])
    assert created_spec(api)["inputs"] == [
        {"path": "clean.csv", "sha256": "a" * 64, "artifact": {"run": "clean-1", "name": "out/clean.csv"}},
        {"path": "raw.csv", "s3": {"bucket": "datasets", "key": "2026/raw.csv"}}]
    assert artifact_input("clean-1", "x.csv", "in/x.csv").model_dump(exclude_none=True) == {
        "path": "in/x.csv", "artifact": {"run": "clean-1", "name": "x.csv"}}
    with pytest.raises(KeyError, match="no artifact 'nope'"):
        artifact_input(earlier, "nope")


# ---- artifacts
def stored_run(api, service, artifacts, recorded=None):
    """A finished run whose artifacts are in the store; `recorded` overrides what its status says of them."""
    service.artifacts.update(artifacts)
    listed = [{"name": n, "size": len(d), "sha256": sha(d), "stored": True} for n, d in (recorded or artifacts).items()]
    api.add("agents", "run-a", {**SUCCEEDED, "artifacts": listed,
                                "dataGrant": {"url": service.url, "token": READ_TOKEN, "expires": EXPIRES},
                                "artifactsSkipped": [{"name": "huge.csv", "why": "artifact-too-large"}]})


def test_a_stored_artifact_reads_as_bytes_and_into_a_file(api, service, client, tmp_path):
    data = bytes(range(256)) * 40000  # 10 MB
    stored_run(api, service, {"out/clean csv.csv": data})
    result = client.get("run-a")
    assert client.artifact(result, "out/clean csv.csv") == data
    assert result.artifact("out/clean csv.csv") == data  # through the client that read it
    written = client.artifact(result, "out/clean csv.csv", path=tmp_path / "clean.csv")
    assert written == tmp_path / "clean.csv" and written.read_bytes() == data
    assert {r[1] for r in service.requests} == {"/v1/artifacts/out/clean%20csv.csv"}
    assert {r[2] for r in service.requests} == {f"Bearer {READ_TOKEN}"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clean.csv", "kubeconfig"]  # no temporary left


def test_bytes_other_than_the_recorded_ones_are_refused_and_leave_no_file(api, service, client, tmp_path):
    stored_run(api, service, {"out.csv": b"swapped!"}, recorded={"out.csv": b"original"})
    result = client.get("run-a")
    target = tmp_path / "out.csv"
    target.write_bytes(b"kept as it was")
    with pytest.raises(ArtifactUnavailable, match="artifact out.csv of run run-a: the store no longer holds the "
                                                  "bytes the run recorded"):
        client.artifact(result, "out.csv", path=target)
    with pytest.raises(ArtifactUnavailable):
        client.artifact(result, "out.csv")
    assert target.read_bytes() == b"kept as it was"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kubeconfig", "out.csv"]


def test_an_expired_grant_is_read_anew_from_the_run_once(api, service, client):
    stored_run(api, service, {"a.bin": b"abc"})
    stale = client.get("run-a").model_copy(update={"data_grant": client.get("run-a").data_grant.model_copy(
        update={"token": "d1.k.old.sig"})})
    assert client.artifact(stale, "a.bin") == b"abc"
    assert [r[2] for r in service.requests] == ["Bearer d1.k.old.sig", f"Bearer {READ_TOKEN}"]
    service.read_tokens = set()
    with pytest.raises(ArtifactUnavailable, match="answered 401 GrantExpired"):
        client.artifact(stale, "a.bin")


def test_skipped_artifacts_are_visible_in_the_result_the_summary_and_the_tool_text(api, service, client):
    stored_run(api, service, {"a.bin": b"abc"})
    result = client.get("run-a")
    assert [(s.name, s.why) for s in result.artifacts_skipped] == [("huge.csv", "artifact-too-large")]
    assert result.skipped_line == "1 output file not kept: huge.csv (artifact-too-large)"
    assert str(result).endswith(" · 1 output file not kept: huge.csv (artifact-too-large)")
    assert "1 output file not kept: huge.csv (artifact-too-large)" in cli.summary_line(result)
    assert "1 output file not kept: huge.csv (artifact-too-large)" in render_result(result)
    many = result.model_copy(update={"artifacts_skipped_unlisted": 7})
    assert many.skipped_line == "8 output files not kept: huge.csv (artifact-too-large), 7 more"


# ---- the CLI
def test_cli_artifacts_get_writes_the_file_and_list_shows_where_each_is(api, service, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.chdir(tmp_path)
    data = b"id,total\n" * 100000
    stored_run(api, service, {"out/clean.csv": data})
    assert cli.main(["artifacts", "get", "run-a", "out/clean.csv"]) == 0
    assert (tmp_path / "clean.csv").read_bytes() == data
    assert cli.main(["artifacts", "get", "crun/run-a", "out/clean.csv", "-o", str(tmp_path / "x.csv")]) == 0
    assert (tmp_path / "x.csv").read_bytes() == data
    capsys.readouterr()
    assert cli.main(["artifacts", "list", "run-a"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].split() == ["NAME", "SIZE", "SHA256", "WHERE"]
    assert out.splitlines()[1].split() == ["out/clean.csv", str(len(data)), sha(data), "stored"]
    assert "1 output file not kept: huge.csv (artifact-too-large)" in err
    assert cli.main(["artifacts", "get", "run-a", "nope.csv"]) == cli.EXIT_NOT_FOUND
    assert "no artifact 'nope.csv'" in capsys.readouterr().err
    requests = len(api.requests)
    assert cli.main(["artifacts", "get", "run-a", "out/clean.csv", "-o", "no/such/dir/x.csv"]) == cli.EXIT_USAGE
    assert "cannot write no/such/dir/x.csv: its directory does not exist" in capsys.readouterr().err
    assert len(api.requests) == requests  # refused before the cluster is asked anything


def test_cli_artifacts_get_to_stdout(api, service, tmp_path, monkeypatch, capfdbinary):
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    stored_run(api, service, {"a.bin": b"\x00\x01binary\x1b]52;c;"})
    assert cli.main(["artifacts", "get", "run-a", "a.bin", "-o", "-"]) == 0
    assert capfdbinary.readouterr().out == b"\x00\x01binary\x1b]52;c;"
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)  # a terminal: the program's bytes could drive it
    assert cli.main(["artifacts", "get", "run-a", "a.bin", "-o", "-"]) == cli.EXIT_USAGE
    captured = capfdbinary.readouterr()
    assert captured.out == b"" and b"standard output is a terminal: pipe it, or give -o PATH" in captured.err


def test_cli_run_uploads_a_large_file_and_lists_the_inputs(api, service, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    operator(api, service)
    local = tmp_path / "big.csv"
    local.write_bytes(b"a,b\n" * BIG)
    assert cli.main(["run", "-c", "print(1)", "--file", str(local), "--file", f"small.txt={local}.small"]) \
        == cli.EXIT_USAGE  # an unreadable file is a usage error, before anything is created
    (tmp_path / "big.csv.small").write_text("hi")
    capsys.readouterr()
    assert cli.main(["run", "-c", "print(1)", "--file", str(local), "--file", f"small.txt={local}.small"]) == 0
    assert service.uploads == {sha(local.read_bytes()): local.read_bytes()}
    err = capsys.readouterr().err
    digest = sha(local.read_bytes())
    assert f"coderun: input big.csv: {local.stat().st_size} bytes, sha256 {digest}, from upload:{digest}\n" in err


def test_cli_run_takes_inputs_by_reference_as_the_status_names_their_sources(api, service, tmp_path, monkeypatch,
                                                                              capsys):
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    operator(api, service)
    assert cli.main(["run", "-c", "print(1)", "--input", "s3://datasets/2026/raw.csv",
                     "--input", "in/clean.csv=run/clean-1/out/clean.csv"]) == 0
    assert created_spec(api)["inputs"] == [
        {"path": "raw.csv", "s3": {"bucket": "datasets", "key": "2026/raw.csv"}},
        {"path": "in/clean.csv", "artifact": {"run": "clean-1", "name": "out/clean.csv"}}]
    capsys.readouterr()
    requests = len(api.requests)
    for bad, said in [("ftp://x/y", "give [DEST=]s3://BUCKET/KEY or [DEST=]run/RUN/ARTIFACT"),
                      ("s3://datasets", "give [DEST=]s3://BUCKET/KEY"),
                      ("a.csv=run/r1/a.csv --input a.csv=s3://b1b/a.csv", "input paths must be unique: a.csv "
                                                                            "named twice")]:
        argv = ["run", "-c", "print(1)"] + [x for part in bad.split(" --input ") for x in ("--input", part)]
        assert cli.main(argv) == cli.EXIT_USAGE
        assert said in capsys.readouterr().err
    assert len(api.requests) == requests  # each refused before the cluster was asked
