"""A run with inputs by reference and stored artifacts through the controller's one lifecycle (FakeK8s for the API
server, a real S3-compatible store on loopback): it waits for its upload, starts with its inputs and grant in
run.json, ends with the runner's word on its inputs, lists stored artifacts only once the store holds them, and
leaves nothing in the store once it is gone."""
import hashlib
import json

import pytest

from coderun_operator.controller import Controller
from coderun_operator.data.grant import ReadGrant, RunGrant, verify
from coderun_operator.data_plane import artifacts_prefix
from fake_k8s import FakeK8s
from support.controller import NS, Clock, frame_log, make_run, submit, terminate
from support.store import DATA_KEY, install_data_plane, running_store

DATA = b"region,amount\nnorth,3\n" * 2000
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with running_store(tmp_path_factory.mktemp("store")) as running:
        yield running


@pytest.fixture
def env(store):
    api, clock = FakeK8s(), Clock()
    ctl = Controller(api=api, clock=clock, data=install_data_plane(api, store))
    return api, clock, ctl


def run_json(api, name="demo"):
    return json.loads(api.objects[("ConfigMap", NS, f"{name}-input")]["data"]["run.json"])


def upload_run(uid, data=DATA):
    """(The store lives for the module: each test uploads bytes of its own.)"""
    return make_run(uid=uid, inputs=[{"path": "sales.csv", "upload": {"sha256": hashlib.sha256(data).hexdigest(),
                                                                      "size": len(data)}}])


def test_a_run_waits_for_its_upload_then_starts_cold_with_its_inputs_and_grant(env, store):
    api, clock, ctl = env
    uid = "uid-wait"
    run = submit(env, upload_run(uid))
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Pending", "WaitingForUpload")
    assert run["status"]["upload"]["files"] == [{"path": "sales.csv", "sha256": SHA, "size": len(DATA)}]
    assert "sales.csv" in run["status"]["message"] and ("Pod", NS, "demo-sandbox") not in api.objects
    ctl.tick()  # still not there: it keeps waiting, no pod
    assert ("Pod", NS, "demo-sandbox") not in api.objects
    store.client().put_object(Bucket="coderun", Key=f"uploads/{NS}/{SHA}", Body=DATA, Metadata={"sha256": SHA})
    ctl.tick()
    pod = api.objects[("Pod", NS, "demo-sandbox")]
    assert any(v.get("name") == "inputs" for v in pod["spec"]["volumes"])
    data = run_json(api)["data"]
    assert data["inputs"] == [{"path": "sales.csv", "size": len(DATA), "sha256": SHA}]
    grant = verify(data["token"], {"k1": DATA_KEY}, 0)
    assert isinstance(grant, RunGrant) and grant.uid == uid
    # the sandboxes of the namespace may reach the data service's pods
    assert ("NetworkPolicy", NS, "coderun-sandbox-data") in api.objects


def test_an_upload_that_never_comes_ends_the_run_naming_the_file(env):
    api, clock, ctl = env
    submit(env, upload_run("uid-late", b"never uploaded"))
    from datetime import timedelta
    clock.now += timedelta(seconds=901)
    ctl.tick()
    status = api.run(NS, "demo")["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InputUnavailable")
    assert "sales.csv" in status["message"] and "uploadWaitSeconds" in status["message"]


def test_a_run_without_inputs_gets_the_store_for_its_large_artifacts(env):
    api, _, _ = env
    submit(env, make_run(uid="uid-plain"))
    document = run_json(api)
    assert document["data"]["inputs"] == [] and document["data"]["artifactsToStore"] is True
    assert document["artifacts"]["maxFileBytes"] == 5 * 1024 * 1024
    assert not any(v.get("name") == "inputs" for v in api.objects[("Pod", NS, "demo-sandbox")]["spec"]["volumes"])


@pytest.mark.parametrize("keeps", [True, False], ids=["keeps-its-grant", "without-keeping-a-conflict"])
def test_a_start_retried_by_a_new_leader_finds_its_own_input_and_grant_not_a_conflict(env, keeps):
    """The leader dies between creating the run's input and writing its status: the next one starts the run again
    seconds later, when a fresh grant would expire at another second; it lays the grant of then instead. (The
    control: a placement that does not look for it meets its own input as a conflict.)"""
    api, clock, ctl = env
    from datetime import timedelta
    submit(env, make_run(uid="uid-retried"))
    before = run_json(api)
    api.objects.pop(("Pod", NS, "demo-sandbox"))
    api.patch_run_status(NS, "demo", {"podName": None, "phase": None})  # as if the pod and status were lost
    clock.now += timedelta(seconds=17)
    if not keeps:
        ctl.cold.data = None
    ctl.on_run(api.get_run(NS, "demo"), deleted=False)
    status = api.run(NS, "demo")["status"]
    if keeps:
        assert status["podName"] == "demo-sandbox" and status.get("phase") != "Failed", status
        assert run_json(api) == before and ("Pod", NS, "demo-sandbox") in api.objects
    else:
        assert (status["phase"], status["reason"]) == ("Failed", "NameConflict"), status


def test_an_input_holding_a_grant_for_another_run_is_a_conflict(env):
    api, _, _ = env
    submit(env, make_run(uid="uid-first"))
    laid = api.objects[("ConfigMap", NS, "demo-input")]
    owner = [{**o, "name": "other", "uid": "uid-other"} for o in laid["metadata"]["ownerReferences"]]
    api.objects[("ConfigMap", NS, "other-input")] = {**laid, "metadata": {
        **laid["metadata"], "name": "other-input", "ownerReferences": owner}}
    status = submit(env, make_run(name="other", uid="uid-other"))["status"]  # its input holds uid-first's grant
    assert (status["phase"], status["reason"]) == ("Failed", "NameConflict"), status


def test_an_input_whose_data_section_was_changed_around_its_grant_is_a_conflict(env):
    """A namespace member who rewrote the run's input around its genuine grant (another path for an input, no
    artifacts stored) is not believed: the start retried meets a conflict."""
    api, _, ctl = env
    submit(env, make_run(uid="uid-tampered"))
    laid = api.objects[("ConfigMap", NS, "demo-input")]
    document = json.loads(laid["data"]["run.json"])
    document["data"]["artifactsToStore"] = False
    api.objects[("ConfigMap", NS, "demo-input")] = {**laid, "data": {**laid["data"], "run.json": json.dumps(document)}}
    api.objects.pop(("Pod", NS, "demo-sandbox"))
    api.patch_run_status(NS, "demo", {"podName": None, "phase": None})
    ctl.on_run(api.get_run(NS, "demo"), deleted=False)
    status = api.run(NS, "demo")["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "NameConflict"), status


def test_an_input_the_runner_could_not_have_fails_the_run_naming_it(env):
    api, _, _ = env
    submit(env, make_run(uid="uid-mismatch"))
    log, termination = frame_log(reason="InputUnavailable", exitCode=None, stdout="",
                                 inputError={"path": "sales.csv", "reason": "InputMismatch",
                                             "message": "the bytes have sha256 00…, not the pin"})
    status = terminate(env, log=log, termination=termination)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InputMismatch")
    assert status["message"].startswith("input sales.csv:") and "did not run" in status["message"]


def test_stored_artifacts_are_listed_only_when_the_store_holds_them(env, store):
    api, _, _ = env
    uid = "uid-artifacts"
    submit(env, make_run(uid=uid))
    big = b"x" * 300_000
    store.client().put_object(Bucket="coderun", Key=artifacts_prefix(NS, uid) + "big.bin", Body=big,
                              Metadata={"sha256": hashlib.sha256(big).hexdigest()})
    log, termination = frame_log(artifacts=[
        {"name": "big.bin", "size": len(big), "sha256": hashlib.sha256(big).hexdigest(), "stored": True},
        {"name": "claimed.bin", "size": 5, "sha256": "0" * 64, "stored": True}])  # the runner said; not there
    status = terminate(env, log=log, termination=termination)["status"]
    assert status["phase"] == "Succeeded"
    assert status["artifacts"] == [{"name": "big.bin", "size": len(big), "sha256": hashlib.sha256(big).hexdigest(),
                                    "stored": True}]
    assert {"name": "claimed.bin", "why": "corrupt"} in status["artifactsSkipped"]
    read = verify(status["dataGrant"]["token"], {"k1": DATA_KEY}, 0)
    assert isinstance(read, ReadGrant) and read.prefix == artifacts_prefix(NS, uid)
    assert status.get("cacheKey") is None  # a stored result is never a cache's answer


def test_a_deleted_runs_objects_leave_the_store(env, store):
    api, _, ctl = env
    uid = "uid-deleted"
    run = submit(env, make_run(uid=uid))
    store.client().put_object(Bucket="coderun", Key=artifacts_prefix(NS, uid) + "a.bin", Body=b"a")
    ctl.on_run(run, deleted=True)
    ctl.tick()
    assert "Contents" not in store.client().list_objects_v2(Bucket="coderun", Prefix=f"runs/{NS}/{uid}/")


def test_without_a_data_plane_a_run_with_inputs_fails_saying_how_to_get_one():
    api, clock = FakeK8s(), Clock()
    ctl = Controller(api=api, clock=clock)
    run = submit((api, clock, ctl), upload_run("uid-none"))
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "InputUnavailable")
    assert "data.enabled" in run["status"]["message"] and "spec.files" in run["status"]["message"]
    # the positive control: a run without inputs runs as before, artifacts inline
    ctl.on_run(api.add_run(make_run(name="plain", uid="uid-plain2")), deleted=False)
    document = json.loads(api.objects[("ConfigMap", NS, "plain-input")]["data"]["run.json"])
    assert "data" not in document and document["artifacts"]["maxFileBytes"] == 256 * 1024


def test_stored_artifacts_go_at_the_policys_artifact_ttl_while_the_run_stays(env, store):
    api, clock, ctl = env
    from datetime import timedelta
    from support.controller import policy_object
    ctl.on_policy(policy_object(data={"artifactTTLSeconds": 120}), deleted=False)
    uid = "uid-ttl"
    submit(env, make_run(uid=uid))
    big = b"t" * 300_000
    digest = hashlib.sha256(big).hexdigest()
    store.client().put_object(Bucket="coderun", Key=artifacts_prefix(NS, uid) + "t.bin", Body=big,
                              Metadata={"sha256": digest})
    log, termination = frame_log(artifacts=[{"name": "t.bin", "size": len(big), "sha256": digest, "stored": True}])
    status = terminate(env, log=log, termination=termination)["status"]
    assert status["dataGrant"]["expires"] == "2026-11-22T10:02:00Z"  # 120 s, not the run's hour
    ctl._forget_data(sweep=True)
    assert "Contents" in store.client().list_objects_v2(Bucket="coderun", Prefix=artifacts_prefix(NS, uid))
    clock.now += timedelta(seconds=121)
    ctl._forget_data(sweep=True)
    assert "Contents" not in store.client().list_objects_v2(Bucket="coderun", Prefix=artifacts_prefix(NS, uid))
    assert api.run(NS, "demo") is not None  # the run itself stays its ttlSecondsAfterFinished
