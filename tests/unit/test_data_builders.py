"""Inputs by reference and artifacts in the store, as the API models and the pure builders shape them
(docs/data.md): the spec's rules, the runner's run.json, the pod's inputs volume, the route to the data service."""
import json
from dataclasses import replace

import pytest
from pydantic import ValidationError

from coderun.api.models import INPUT_PATH_TWICE, MiB, ArtifactCaps, CodeRunSpec, DataPolicy, InputRef
from coderun_operator.builders import build_input_configmap, build_pod
from coderun_operator.builders.egress import ProxyRoute
from coderun_operator.builders.objects import (INLINE_ARTIFACT_FILE_BYTES, INLINE_ARTIFACT_TOTAL_BYTES, INPUTS_MOUNT,
                                               artifact_caps, build_data_network_policy, inputs_bytes,
                                               transfer_seconds)
from coderun_operator.builders.session import session_inputs_room
from coderun_operator.policy import DEFAULT_POLICY, evaluate

SHA = "ab" * 32


def decide(body, policy=DEFAULT_POLICY):
    spec = CodeRunSpec.model_validate(body["spec"])
    return spec, evaluate(spec, policy)


@pytest.mark.parametrize("entry,words", [
    ({"path": "a.csv"}, "exactly one of s3, artifact or upload"),
    ({"path": "a.csv", "s3": {"bucket": "data", "key": "a"}, "upload": {"sha256": SHA, "size": 1}},
     "exactly one of s3, artifact or upload"),
    ({"path": "a.csv", "sha256": "cd" * 32, "upload": {"sha256": SHA, "size": 1}}, "must equal upload.sha256"),
    ({"path": "../a.csv", "upload": {"sha256": SHA, "size": 1}}, "must be relative"),
    ({"path": "a.csv", "upload": {"sha256": "XYZ", "size": 1}}, "String should match pattern"),
    ({"path": "a.csv", "s3": {"bucket": "Bad_Bucket", "key": "a"}}, "String should match pattern"),
    ({"path": "a.csv", "artifact": {"run": "Other/run", "name": "x"}}, "String should match pattern"),
])
def test_an_input_names_one_source_and_a_pin_that_agrees(entry, words):
    with pytest.raises(ValidationError) as refused:
        InputRef.model_validate(entry)
    assert words in str(refused.value)


def test_an_input_says_where_it_came_from():
    assert InputRef.model_validate({"path": "a", "s3": {"bucket": "data", "key": "x/y.csv"}}).source() == \
        "s3://data/x/y.csv"
    assert InputRef.model_validate({"path": "a", "artifact": {"run": "clean", "name": "out.csv"}}).source() == \
        "run/clean/out.csv"
    assert InputRef.model_validate({"path": "a", "upload": {"sha256": SHA, "size": 3}}).source() == f"upload:{SHA}"


def test_a_path_is_given_once_across_files_and_inputs():
    with pytest.raises(ValidationError) as refused:
        CodeRunSpec.model_validate({"language": "python", "code": "1", "files": [{"path": "a.csv", "content": "x"}],
                                    "inputs": [{"path": "a.csv", "upload": {"sha256": SHA, "size": 1}}]})
    assert INPUT_PATH_TWICE in str(refused.value)
    # the positive control: another path is fine
    CodeRunSpec.model_validate({"language": "python", "code": "1", "files": [{"path": "b.csv", "content": "x"}],
                                "inputs": [{"path": "a.csv", "upload": {"sha256": SHA, "size": 1}}]})


def test_without_the_store_the_inline_caps_bound_every_artifact():
    policy = replace(DEFAULT_POLICY, data=DataPolicy(artifacts=ArtifactCaps(max_files=40, max_file_bytes=64 * MiB,
                                                                            max_total_bytes=128 * MiB)))
    inline = artifact_caps(policy, with_store=False)
    assert (inline["maxFiles"], inline["maxFileBytes"], inline["maxTotalBytes"]) == \
        (40, INLINE_ARTIFACT_FILE_BYTES, INLINE_ARTIFACT_TOTAL_BYTES)
    stored = artifact_caps(policy, with_store=True)
    assert (stored["maxFileBytes"], stored["maxTotalBytes"], stored["inlineFileBytes"]) == \
        (64 * MiB, 128 * MiB, INLINE_ARTIFACT_FILE_BYTES)
    # the defaults fit the seeds' 5 MB artifact budget
    assert artifact_caps(DEFAULT_POLICY, with_store=True)["maxTotalBytes"] == 5 * MiB


def test_run_json_carries_the_data_section_only_with_the_store(run_body):
    body = run_body({"language": "python", "code": "print(1)",
                     "inputs": [{"path": "in/a.csv", "upload": {"sha256": SHA, "size": 5 * MiB}}]})
    spec, decision = decide(body)
    data = {"url": "http://10.0.0.9:8080", "token": "d1.k1.x.y",
            "inputs": [{"path": "in/a.csv", "size": 5 * MiB, "sha256": SHA}], "artifactsToStore": True}
    with_store = json.loads(build_input_configmap(body, spec, decision, run_data=data)["data"]["run.json"])
    assert with_store["data"] == data and with_store["artifacts"]["maxFileBytes"] == 5 * MiB
    without = json.loads(build_input_configmap(body, spec, decision)["data"]["run.json"])
    assert "data" not in without and without["artifacts"]["maxFileBytes"] == INLINE_ARTIFACT_FILE_BYTES
    assert inputs_bytes(data) == 5 * MiB and inputs_bytes(None) == 0


def test_a_pod_with_inputs_has_a_volume_of_their_own_outside_the_disk_limit(run_body):
    body = run_body({"language": "python", "code": "print(1)"})
    _, decision = decide(body)
    plain = build_pod(body, decision, "demo-input")
    data = {"url": "http://10.0.0.9:8080", "token": "t", "artifactsToStore": True,
            "inputs": [{"path": "a.csv", "size": 200 * 1000 * 1000 + 1, "sha256": SHA}]}
    sized = build_pod(body, decision, "demo-input", data)
    mounts = {m["mountPath"]: m["name"] for m in sized["spec"]["containers"][0]["volumeMounts"]}
    assert mounts[INPUTS_MOUNT] == "inputs"
    assert {"name": "inputs", "emptyDir": {"sizeLimit": "191Mi"}} in sized["spec"]["volumes"]
    # /tmp keeps the program's disk limit; the pod's ephemeral storage grows by the inputs' room
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in sized["spec"]["volumes"]
    assert INPUTS_MOUNT not in {m["mountPath"] for m in plain["spec"]["containers"][0]["volumeMounts"]}
    before = plain["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"]
    after = sized["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"]
    assert int(after) - int(before) == 191 * MiB
    # the pod's deadline leaves its transfers the runner's own bound: the input and the artifact caps, at 5 MB/s
    moved = plain["spec"]["activeDeadlineSeconds"] + transfer_seconds(decision.policy, data)
    assert sized["spec"]["activeDeadlineSeconds"] == moved
    assert transfer_seconds(decision.policy, data) >= (200 * 1000 * 1000 + 5 * MiB) // (5 * 1000 * 1000)
    # an input of no bytes still has its volume
    empty = build_pod(body, decision, "demo-input", {**data, "inputs": [{"path": "e", "size": 0, "sha256": SHA}]})
    assert {"name": "inputs", "emptyDir": {"sizeLimit": "1Mi"}} in empty["spec"]["volumes"]


def test_a_session_pod_keeps_room_for_inputs_only_when_its_policy_sets_data():
    assert session_inputs_room(evaluate(CodeRunSpec(language="python", code="1"), DEFAULT_POLICY)) == 0
    policy = replace(DEFAULT_POLICY, data=DataPolicy(max_inputs_total_bytes=300 * MiB))
    assert session_inputs_room(evaluate(CodeRunSpec(language="python", code="1"), policy)) == 300 * MiB


def test_sandbox_pods_reach_the_data_service_port_and_nothing_else():
    route = ProxyRoute("coderun-system", (("app.kubernetes.io/component", "data"),), 8080)
    policy = build_data_network_policy("team-a", route)
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == "team-a"
    assert spec["podSelector"] == {"matchLabels": {"coderun.io/sandbox": "true"}}
    assert spec["policyTypes"] == ["Egress"] and "ingress" not in spec
    assert spec["egress"] == [{"to": [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "coderun-system"}}, "podSelector": {"matchLabels": {
            "app.kubernetes.io/component": "data"}}}], "ports": [{"protocol": "TCP", "port": 8080}]}]
