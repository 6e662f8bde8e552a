"""The operator's side of the data plane (data_plane.py) against a real S3-compatible store on loopback: inputs
resolved by HEAD (never the bytes), the policy's caps and buckets, uploads awaited, artifacts chained, grants minted
that the data service accepts, and a run's objects gone with the run."""
import base64
import hashlib
from dataclasses import replace

import pytest

from coderun.api.models import MiB, CodeRunSpec, DataBucket, DataPolicy
from coderun_operator.data.grant import ReadGrant, RunGrant, UploadGrant, verify
from coderun_operator.data_plane import (INPUT_MISMATCH, INPUT_NOT_ALLOWED, INPUT_TOO_LARGE, INPUT_UNAVAILABLE,
                                         InputProblem, UploadsAwaited, artifacts_prefix)
from coderun_operator.policy import DEFAULT_POLICY, evaluate
from fake_k8s import FakeK8s
from support.store import DATA_KEY as KEY, install_data_plane, running_store

NS = "team-a"
EXPIRES = 4102444800  # 2100-01-01


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with running_store(tmp_path_factory.mktemp("store"), buckets=("coderun", "datasets")) as running:
        yield running


@pytest.fixture
def plane(store):
    return install_data_plane(FakeK8s(), store)


def policy(**data):
    return replace(DEFAULT_POLICY, data=DataPolicy(**data))


def prepare(plane, run_body, inputs, data_policy=None, runs=None, creator="alice"):
    body = run_body({"language": "python", "code": "print(1)", "inputs": inputs},
                    annotations={"coderun.io/created-by": creator})
    spec = CodeRunSpec.model_validate(body["spec"])
    decision = evaluate(spec, data_policy or DEFAULT_POLICY)
    found = {r["metadata"]["name"]: r for r in runs or ()}
    return body, plane.prepare(body, spec, decision, EXPIRES, lambda ns, name: found.get(name),
                               lambda earlier: (earlier["metadata"].get("annotations") or {}).get(
                                   "coderun.io/created-by") == creator)


def put(store, bucket, key, data, sha=True):
    store.client().put_object(Bucket=bucket, Key=key, Body=data,
                              Metadata={"sha256": hashlib.sha256(data).hexdigest()} if sha else {})


def test_an_upload_not_there_is_awaited_with_a_grant_for_exactly_it(plane, run_body):
    data = b"a,b\n1,2\n" * 1000
    sha = hashlib.sha256(data).hexdigest()
    _, prepared = prepare(plane, run_body, [{"path": "in.csv", "upload": {"sha256": sha, "size": len(data)}}])
    assert isinstance(prepared, UploadsAwaited)
    upload = prepared.upload
    assert upload["url"] == "http://10.96.0.50:8080"  # the Service's address, for callers
    assert upload["files"] == [{"path": "in.csv", "sha256": sha, "size": len(data)}]
    grant = verify(upload["token"], {"k1": KEY}, 0)
    assert isinstance(grant, UploadGrant) and grant.files == ((sha, len(data)),) and grant.namespace == NS


def test_an_upload_there_is_laid_out_with_a_run_grant_the_runner_alone_holds(plane, store, run_body):
    data = b"x,y\n" * 5000
    sha = hashlib.sha256(data).hexdigest()
    put(store, "coderun", f"uploads/{NS}/{sha}", data)
    body, prepared = prepare(plane, run_body, [{"path": "d/in.csv", "upload": {"sha256": sha, "size": len(data)}}])
    assert isinstance(prepared, dict)
    assert prepared["url"] == "http://10.88.0.7:8080"  # one ready data pod: sandboxes resolve no names
    assert prepared["inputs"] == [{"path": "d/in.csv", "size": len(data), "sha256": sha}]
    grant = verify(prepared["token"], {"k1": KEY}, 0)
    # valid past the program's deadline by what its transfers may take
    assert isinstance(grant, RunGrant) and grant.uid == body["metadata"]["uid"] and grant.expires > EXPIRES
    assert [(o.key, o.size, o.sha256) for o in grant.inputs] == [(f"uploads/{NS}/{sha}", len(data), sha)]
    assert grant.artifacts_prefix == artifacts_prefix(NS, body["metadata"]["uid"])
    assert (grant.max_file_bytes, grant.max_total_bytes) == (5 * MiB, 5 * MiB)


def test_an_s3_input_must_be_where_the_policy_allows(plane, store, run_body):
    put(store, "datasets", "shared/a.csv", b"1,2\n")
    put(store, "datasets", "private/b.csv", b"3,4\n")
    allowed = policy(buckets=[DataBucket(bucket="datasets", prefix="shared/")])
    _, ok = prepare(plane, run_body, [{"path": "a.csv", "s3": {"bucket": "datasets", "key": "shared/a.csv"}}],
                    allowed)
    assert isinstance(ok, dict) and ok["inputs"][0]["sha256"] == hashlib.sha256(b"1,2\n").hexdigest()
    _, outside = prepare(plane, run_body, [{"path": "b.csv", "s3": {"bucket": "datasets", "key": "private/b.csv"}}],
                         allowed)
    assert isinstance(outside, InputProblem) and outside.reason == INPUT_NOT_ALLOWED
    assert "b.csv" in outside.message and "spec.data.buckets" in outside.message
    _, by_default = prepare(plane, run_body, [{"path": "a.csv", "s3": {"bucket": "datasets", "key": "shared/a.csv"}}])
    assert isinstance(by_default, InputProblem) and by_default.reason == INPUT_NOT_ALLOWED


@pytest.mark.parametrize("case", ["missing", "too-large", "pin", "total"])
def test_an_input_that_cannot_be_had_ends_with_a_reason_naming_it(plane, store, run_body, case):
    put(store, "datasets", "shared/big.csv", b"z" * 3000)
    allowed = dict(buckets=[DataBucket(bucket="datasets", prefix="shared/")])
    ref = {"path": "big.csv", "s3": {"bucket": "datasets", "key": "shared/big.csv"}}
    inputs, data_policy, reason = {
        "missing": ([{**ref, "s3": {"bucket": "datasets", "key": "shared/nope.csv"}}], policy(**allowed),
                    INPUT_UNAVAILABLE),
        "too-large": ([ref], policy(max_input_bytes=2000, **allowed), INPUT_TOO_LARGE),
        "pin": ([{**ref, "sha256": "0" * 64}], policy(**allowed), INPUT_MISMATCH),
        "total": ([ref, {**ref, "path": "again.csv"}], policy(max_inputs_total_bytes=5000, **allowed),
                  INPUT_TOO_LARGE),
    }[case]
    _, prepared = prepare(plane, run_body, inputs, data_policy)
    assert isinstance(prepared, InputProblem) and prepared.reason == reason, prepared
    assert ("nope.csv" if case == "missing" else "big.csv" if case != "total" else "inputs") in prepared.message


def finished(name, uid, creator, artifacts, phase="Succeeded"):
    return {"metadata": {"name": name, "namespace": NS, "uid": uid,
                         "annotations": {"coderun.io/created-by": creator}},
            "status": {"phase": phase, "artifacts": artifacts}}


def test_an_earlier_runs_artifact_chains_only_for_its_creator_once_it_finished(plane, store, run_body):
    data = b"cleaned\n" * 100
    sha = hashlib.sha256(data).hexdigest()
    put(store, "coderun", artifacts_prefix(NS, "uid-clean") + "out.csv", data)
    clean = finished("clean", "uid-clean", "alice", [{"name": "out.csv", "size": len(data), "sha256": sha,
                                                       "stored": True}])
    ref = [{"path": "in.csv", "artifact": {"run": "clean", "name": "out.csv"}}]
    _, chained = prepare(plane, run_body, ref, runs=[clean])
    assert isinstance(chained, dict) and chained["inputs"] == [{"path": "in.csv", "size": len(data), "sha256": sha}]
    _, someone_else = prepare(plane, run_body, ref, runs=[clean], creator="mallory")
    assert isinstance(someone_else, InputProblem) and someone_else.reason == INPUT_NOT_ALLOWED
    _, running = prepare(plane, run_body, ref, runs=[finished("clean", "uid-clean", "alice", [], "Running")])
    assert isinstance(running, InputProblem) and running.reason == INPUT_UNAVAILABLE
    _, no_such = prepare(plane, run_body, [{"path": "in.csv", "artifact": {"run": "clean", "name": "nope"}}],
                         runs=[clean])
    assert isinstance(no_such, InputProblem) and "out.csv" in no_such.message  # says what there is


def test_an_inline_artifact_is_copied_to_the_store_once_its_bytes_are_vouched_for(plane, store, run_body):
    data = b"small\n"
    sha = hashlib.sha256(data).hexdigest()
    plane.api.objects[("ConfigMap", NS, "early-artifacts")] = {
        "metadata": {"name": "early-artifacts", "namespace": NS},
        "binaryData": {"artifact-0": base64.b64encode(data).decode()}}
    early = finished("early", "uid-early", "alice", [{"name": "s.txt", "size": len(data), "sha256": sha,
                                                       "configMap": "early-artifacts", "key": "artifact-0"}])
    _, chained = prepare(plane, run_body, [{"path": "s.txt", "artifact": {"run": "early", "name": "s.txt"}}],
                         runs=[early])
    assert isinstance(chained, dict) and chained["inputs"][0]["sha256"] == sha
    body = store.client().get_object(Bucket="coderun", Key=artifacts_prefix(NS, "uid-early") + "s.txt")["Body"]
    assert body.read() == data
    # a ConfigMap changed after the run no longer vouches for the bytes: not copied
    plane.api.objects[("ConfigMap", NS, "early-artifacts")]["binaryData"]["artifact-0"] = \
        base64.b64encode(b"other!").decode()
    tampered = finished("tampered", "uid-tampered", "alice", [{"name": "s.txt", "size": len(data), "sha256": sha,
                                                               "configMap": "early-artifacts", "key": "artifact-0"}])
    _, refused = prepare(plane, run_body, [{"path": "s.txt", "artifact": {"run": "tampered", "name": "s.txt"}}],
                         runs=[tampered])
    assert isinstance(refused, InputProblem) and refused.reason == INPUT_UNAVAILABLE


def test_stored_artifacts_are_vouched_for_read_by_grant_and_gone_with_their_run(plane, store, run_body):
    body = run_body({"language": "python", "code": "1"})
    uid = body["metadata"]["uid"]
    data = b"result" * 1000
    sha = hashlib.sha256(data).hexdigest()
    put(store, "coderun", artifacts_prefix(NS, uid) + "r.bin", data)
    put(store, "coderun", artifacts_prefix(NS, "uid-gone") + "g.bin", b"gone")
    entry = {"name": "r.bin", "size": len(data), "sha256": sha}
    assert plane.verify_stored(body, entry)
    assert not plane.verify_stored(body, {**entry, "sha256": "0" * 64})  # the runner's word alone is not enough
    assert not plane.verify_stored(body, {**entry, "name": "absent.bin"})
    grant = plane.read_grant(body, [entry], EXPIRES)
    read = verify(grant["token"], {"k1": KEY}, 0)
    assert isinstance(read, ReadGrant) and read.prefix == artifacts_prefix(NS, uid) and read.uid == uid
    put(store, "coderun", f"uploads/{NS}/{'e' * 64}", b"an upload")
    from datetime import datetime, timedelta, timezone
    now = datetime.now(timezone.utc)
    assert plane.sweep(lambda run_uid: run_uid != "uid-gone", now) == 1  # only the run that is gone
    uploads = {o["Key"] for o in store.client().list_objects_v2(Bucket="coderun", Prefix="uploads/")["Contents"]}
    assert f"uploads/{NS}/{'e' * 64}" in uploads  # a day's grace for uploads
    plane.sweep(lambda run_uid: True, now + timedelta(days=1, seconds=1))
    uploads = store.client().list_objects_v2(Bucket="coderun", Prefix="uploads/").get("Contents", ())
    assert f"uploads/{NS}/{'e' * 64}" not in {o["Key"] for o in uploads}
    listed = store.client().list_objects_v2(Bucket="coderun", Prefix="runs/")
    keys = {o["Key"] for o in listed.get("Contents", ())}
    assert artifacts_prefix(NS, uid) + "r.bin" in keys and not any("uid-gone" in k for k in keys)
    plane.forget(NS, uid)
    assert "Contents" not in store.client().list_objects_v2(Bucket="coderun", Prefix=f"runs/{NS}/{uid}/")


@pytest.mark.parametrize("key", ["shared/../private/b.csv", "shared/./a.csv", "shared//a.csv"])
def test_an_s3_key_that_could_leave_its_prefix_is_not_allowed(plane, store, run_body, key):
    allowed = policy(buckets=[DataBucket(bucket="datasets", prefix="shared/")])
    _, refused = prepare(plane, run_body, [{"path": "a.csv", "s3": {"bucket": "datasets", "key": key}}], allowed)
    assert isinstance(refused, InputProblem) and refused.reason == INPUT_NOT_ALLOWED


def test_coderuns_own_bucket_is_never_an_s3_input_whatever_the_policy_says(plane, store, run_body):
    put(store, "coderun", f"uploads/other-ns/{'f' * 64}", b"another namespace's upload")
    careless = policy(buckets=[DataBucket(bucket="coderun", prefix="")])
    _, refused = prepare(plane, run_body, [{"path": "x", "s3": {"bucket": "coderun",
                                                                "key": f"uploads/other-ns/{'f' * 64}"}}], careless)
    assert isinstance(refused, InputProblem) and refused.reason == INPUT_NOT_ALLOWED


def test_inputs_whose_keys_overflow_the_grant_are_refused_naming_why(plane, store, run_body):
    key = "shared/long/" + "/".join(["k" * 200] * 4)
    put(store, "datasets", key, b"1")
    allowed = policy(buckets=[DataBucket(bucket="datasets", prefix="shared/")])
    inputs = [{"path": f"in{i}", "s3": {"bucket": "datasets", "key": key}} for i in range(16)]
    _, refused = prepare(plane, run_body, inputs, allowed)
    assert isinstance(refused, InputProblem) and refused.reason == INPUT_TOO_LARGE and "keys" in refused.message


def test_a_chained_artifact_is_pinned_to_what_its_run_recorded(plane, store, run_body):
    data = b"recorded\n"
    put(store, "coderun", artifacts_prefix(NS, "uid-swapped") + "out.csv", b"swapped in the store since")
    swapped = finished("swapped", "uid-swapped", "alice", [{"name": "out.csv", "size": len(data),
                                                             "sha256": hashlib.sha256(data).hexdigest(),
                                                             "stored": True}])
    _, refused = prepare(plane, run_body, [{"path": "in.csv", "artifact": {"run": "swapped", "name": "out.csv"}}],
                         runs=[swapped])
    assert isinstance(refused, InputProblem) and refused.reason == INPUT_MISMATCH and "swapped" in refused.message
