import base64
import json

from coderun.api.models import CodeRunSpec
from coderun_operator.builders import (build_input_configmap, build_namespace_network_policy, build_network_policy, build_pod,
                              child_name, code_hash)
from coderun_operator.policy import DEFAULT_POLICY, evaluate


def decide(body):
    spec = CodeRunSpec.model_validate(body["spec"])
    return spec, evaluate(spec, DEFAULT_POLICY)


def test_pod_is_hardened_as_the_design_demands(run_body):
    body = run_body({"language": "python", "code": "print(1)", "limits": {"memory": "128Mi", "timeoutSeconds": 7}})
    _, decision = decide(body)
    pod = build_pod(body, decision, "demo-input")
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert spec["runtimeClassName"] == "gvisor" and spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert not (spec["hostNetwork"] or spec["hostPID"] or spec["hostIPC"])
    assert spec["dnsPolicy"] == "None"
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"] == container["resources"]["limits"]
    # the program's 128Mi and its /tmp's 64Mi: the runner keeps /tmp in a tmpfs capped at the disk limit
    assert container["resources"]["limits"]["memory"] == "192Mi"
    assert spec["activeDeadlineSeconds"] > 7
    assert container["env"] == []
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in spec["volumes"]
    assert all("hostPath" not in v for v in spec["volumes"])
    assert pod["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    assert pod["metadata"]["labels"]["coderun.io/sandbox"] == "true"
    assert pod["metadata"]["name"] == "demo-sandbox"


def test_a_pool_pod_has_its_input_where_a_cold_pod_has_it_on_a_volume_of_its_own(run_body):
    """The warm runner writes the input it receives at the ConfigMap's path, on a small volume apart from /tmp
    (whose size is the program's disk limit), so the input never counts against that limit twice."""
    from coderun_operator.builders import build_pool_pod
    body = run_body({"language": "python", "code": "print(1)"})
    _, decision = decide(body)
    cold = build_pod(body, decision, "demo-input")["spec"]
    warm = build_pool_pod("ns", decision, {"coderun.io/pool": "p", "coderun.io/pool-language": "python", "key": "k"},
                          600)["spec"]
    mounts = {m["mountPath"]: m for m in warm["containers"][0]["volumeMounts"]}
    assert mounts.keys() == {m["mountPath"] for m in cold["containers"][0]["volumeMounts"]} == {"/coderun/input", "/tmp"}
    assert mounts["/coderun/input"] == {"name": "input", "mountPath": "/coderun/input"}
    assert {"name": "input", "mountPath": "/coderun/input", "readOnly": True} in cold["containers"][0]["volumeMounts"]
    volumes = {v["name"]: v for v in warm["volumes"]}
    assert volumes["input"] == {"name": "input", "emptyDir": {"sizeLimit": "4Mi"}}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}
    assert "--input-stdin" in warm["containers"][0]["command"]


def test_input_configmap_carries_code_stdin_files_and_instructions(run_body):
    body = run_body({"language": "python", "code": "print(1)", "stdin": "in",
                     "files": [{"path": "a/b.csv", "content": "x,y"},
                               {"path": "bin", "contentBase64": "AAE=\n"}]})
    spec, decision = decide(body)
    cm = build_input_configmap(body, spec, decision)
    instructions = json.loads(cm["data"]["run.json"])
    assert cm["immutable"] is True and cm["data"]["code"] == "print(1)" and cm["data"]["stdin"] == "in"
    assert instructions["files"] == [{"path": "a/b.csv", "key": "file-0"}, {"path": "bin", "key": "file-1"}]
    assert cm["data"]["file-0"] == "x,y" and base64.b64decode(cm["binaryData"]["file-1"]) == b"\x00\x01"
    assert instructions["timeoutSeconds"] == 5 and instructions["floodBytes"] > instructions["outputBytes"]
    assert instructions["stdinKey"] == "stdin" and instructions["codeFile"] == "main.py"
    assert instructions["scratchTmpfs"] is True and instructions["diskBytes"] == 64 * 1048576


def test_network_policies_deny_everything(run_body):
    body = run_body()
    for policy in (build_network_policy(body), build_namespace_network_policy("team-a")):
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        assert policy["spec"]["ingress"] == [] and policy["spec"]["egress"] == []
    assert build_network_policy(body)["spec"]["podSelector"]["matchLabels"] == {
        "coderun.io/run-uid": body["metadata"]["uid"]}


def test_child_names_are_deterministic_and_fit():
    assert child_name("demo", "sandbox") == "demo-sandbox"
    long = "a" * 200
    name = child_name(long, "sandbox")
    assert len(name) <= 63 and name.endswith("-sandbox") and name == child_name(long, "sandbox")
    assert child_name("a" * 199 + "b", "sandbox") != name


def test_code_hash_covers_every_input(run_body):
    base = {"language": "python", "code": "print(1)"}
    hashes = {code_hash(CodeRunSpec.model_validate(s)) for s in (
        base, {**base, "code": "print(2)"}, {**base, "stdin": "x"},
        {**base, "files": [{"path": "f", "content": "1"}]})}
    assert len(hashes) == 4
    assert code_hash(CodeRunSpec.model_validate(base)) == code_hash(CodeRunSpec.model_validate(dict(base)))
