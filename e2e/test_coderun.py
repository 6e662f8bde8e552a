"""CodeRun end to end on the real cluster: from a created object to a complete, typed status."""
import base64
import hashlib
import json

import pytest

from conftest import wait_for

PY = "python"


def run(operator, namespace, code, timeout=90, **spec):
    name = operator.create_run(namespace, {"language": PY, "code": code, **spec})
    return operator.wait_run(namespace, name, timeout=timeout)["status"]


def condition(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_success_has_a_complete_typed_status(operator, namespace):
    status = run(operator, namespace, "import sys\nprint(6*7)\nprint('note', file=sys.stderr)")
    assert (status["phase"], status["reason"], status["exitCode"]) == ("Succeeded", "Completed", 0)
    assert status["stdout"] == "42\n" and status["stderr"] == "note\n"
    assert status["stdoutSha256"] == hashlib.sha256(b"42\n").hexdigest()
    assert status["stdoutTruncated"] is False and status["stdoutBytes"] == 3
    assert condition(status, "Complete")["status"] == "True"
    assert condition(status, "Accepted")["status"] == "True"
    assert status["image"].startswith("coderun.local/sandbox-python:v2@sha256:")
    assert status["codeHash"].startswith("sha256:") and status["runtimeClass"] == "gvisor"
    metrics = status["metrics"]
    for field in ("wallMillis", "cpuMillis", "maxRSSBytes", "queueMillis", "startupMillis", "totalMillis"):
        assert isinstance(metrics[field], int) and metrics[field] >= 0, field
    assert metrics["totalMillis"] >= metrics["wallMillis"]
    assert status["observedGeneration"] == 1 and status["completionTime"] >= status["startTime"]


def test_non_zero_exit_keeps_stderr(operator, namespace):
    status = run(operator, namespace, "import sys\nprint('bad input', file=sys.stderr)\nsys.exit(3)")
    assert (status["phase"], status["reason"], status["exitCode"]) == ("Failed", "NonZeroExit", 3)
    assert status["stderr"] == "bad input\n"
    assert condition(status, "Failed")["reason"] == "NonZeroExit"


def test_exception_is_parsed_into_type_and_line(operator, namespace):
    status = run(operator, namespace, "x = 1\ny = 0\nprint(x / y)\n")
    assert status["reason"] == "NonZeroExit" and status["exitCode"] == 1
    assert status["error"] == {"type": "ZeroDivisionError", "message": "division by zero", "line": 3}
    assert "line 3" in status["message"]


def test_infinite_loop_times_out(operator, namespace):
    status = run(operator, namespace, "while True:\n    pass\n", limits={"timeoutSeconds": 2})
    assert (status["phase"], status["reason"]) == ("Failed", "Timeout")
    assert 2000 <= status["metrics"]["wallMillis"] < 2000 + 3000
    assert "timeoutSeconds" in status["message"]


def test_memory_hog_is_oom_killed(operator, namespace):
    hog = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))\n"
    status = run(operator, namespace, hog, limits={"memory": "128Mi", "timeoutSeconds": 20})
    assert (status["phase"], status["reason"]) == ("Failed", "OOMKilled"), status.get("message")
    assert "memory" in status["message"]


def test_stdout_flood_gives_a_bounded_status(operator, namespace):
    flood = "import sys\nblock = 'x' * 65536\nfor _ in range(16384):\n    sys.stdout.write(block)\n"  # 1 GiB
    name = operator.create_run(namespace, {"language": PY, "code": flood, "limits": {"timeoutSeconds": 60}})
    whole = operator.wait_run(namespace, name)
    status = whole["status"]
    assert status["reason"] == "OutputLimitExceeded"
    assert status["stdoutTruncated"] is True and len(status["stdout"]) == 65536
    assert len(json.dumps(whole).encode()) < 1024 * 1024


def test_stdin_and_files_reach_the_program(operator, namespace):
    code = ("import sys, pathlib\nprint(sys.stdin.read().strip().upper())\n"
            "print(pathlib.Path('data/in.csv').read_text().splitlines()[1])\n"
            "print(pathlib.Path('blob.bin').read_bytes().hex())\n")
    files = [{"path": "data/in.csv", "content": "a,b\n1,2\n"},
             {"path": "blob.bin", "contentBase64": base64.b64encode(b"\x00\xff\x10").decode()}]
    status = run(operator, namespace, code, stdin="hello\n", files=files)
    assert status["stdout"] == "HELLO\n1,2\n00ff10\n", status


def test_non_utf8_output_does_not_break_the_status(operator, namespace):
    code = "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe done\\n')\nsys.stderr.buffer.write(b'\\xc3')\n"
    status = run(operator, namespace, code)
    assert status["phase"] == "Succeeded"
    assert status["stdout"] == "ok \ufffd\ufffd done\n" and status["stdoutBytes"] == 11


def test_matplotlib_png_comes_back_as_an_artifact(operator, namespace):
    code = ("import os, matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [2, 4, 1])\n"
            "path = os.path.join(os.environ['CODERUN_OUTPUT_DIR'], 'plot.png')\nplt.savefig(path)\n"
            "import hashlib\nprint(hashlib.sha256(open(path, 'rb').read()).hexdigest())\n")
    status = run(operator, namespace, code, limits={"timeoutSeconds": 30})
    assert status["phase"] == "Succeeded", status.get("stderr")
    [artifact] = status["artifacts"]
    assert artifact["name"] == "plot.png" and artifact["sha256"] == status["stdout"].strip()
    stored = operator.core.read_namespaced_config_map(artifact["configMap"], namespace)
    content = base64.b64decode(stored.binary_data[artifact["key"]])
    assert content[:8] == b"\x89PNG\r\n\x1a\n" and hashlib.sha256(content).hexdigest() == artifact["sha256"]
    assert len(content) == artifact["size"]


def test_symlink_out_of_the_output_dir_does_not_leak(operator, namespace):
    code = ("import os\nout = os.environ['CODERUN_OUTPUT_DIR']\n"
            "os.symlink('/etc/passwd', os.path.join(out, 'passwd'))\n"
            "open(os.path.join(out, 'real.txt'), 'w').write('mine')\n")
    name = operator.create_run(namespace, {"language": PY, "code": code})
    whole = operator.wait_run(namespace, name)
    status = whole["status"]
    assert [a["name"] for a in status["artifacts"]] == ["real.txt"]
    assert {"name": "passwd", "why": "symlink"} in status["artifactsSkipped"]
    stored = operator.core.read_namespaced_config_map(status["artifacts"][0]["configMap"], namespace)
    everything = json.dumps(whole) + json.dumps(operator.api.sanitize_for_serialization(stored))
    assert "root:x:0:0" not in everything


def test_secrets_in_output_are_redacted(operator, namespace):
    status = run(operator, namespace, "print('key=AKIA' + 'ABCDEFGHIJKLMNOP')\n")
    assert "AKIAABCDEFGHIJKLMNOP" not in status["stdout"]
    assert "[REDACTED:aws-access-key]" in status["stdout"] and status["redactions"] == 1


def test_expect_validates_stdout_against_a_json_schema(operator, namespace):
    schema = {"type": "object", "required": ["rate"], "properties": {"rate": {"type": "number", "maximum": 1}}}
    good = run(operator, namespace, "print('{\"rate\": 0.25}')", expect={"stdoutJSONSchema": schema, "exitCode": 0})
    bad = run(operator, namespace, "print('{\"rate\": 7}')", expect={"stdoutJSONSchema": schema})
    assert good["validation"] == {"valid": True, "errors": []}
    assert condition(good, "OutputValid")["status"] == "True"
    assert bad["validation"]["valid"] is False and "stdout.rate" in bad["validation"]["errors"][0]
    assert condition(bad, "OutputValid")["status"] == "False" and bad["phase"] == "Succeeded"


def test_policy_refuses_an_unknown_language_and_excessive_limits(operator, namespace):
    ruby = operator.create_run(namespace, {"language": "ruby", "code": "puts 1"})
    greedy = operator.create_run(namespace, {"language": PY, "code": "print(1)", "limits": {"memory": "4Gi"}})
    ruby_status = operator.wait_run(namespace, ruby)["status"]
    greedy_status = operator.wait_run(namespace, greedy)["status"]
    assert (ruby_status["phase"], ruby_status["reason"], ruby_status["policyRule"]) == \
        ("Rejected", "PolicyDenied", "runtimes")
    assert "python" in ruby_status["message"]
    assert greedy_status["policyRule"] == "maximums.memory" and "2Gi" in greedy_status["message"]
    assert condition(greedy_status, "Accepted")["status"] == "False"
    assert not operator.run_pods(namespace)


def test_pod_deleted_from_outside_fails_the_run(operator, namespace):
    name = operator.create_run(namespace, {"language": PY, "code": "import time\ntime.sleep(30)",
                                           "limits": {"timeoutSeconds": 60}})
    operator.core.delete_namespaced_pod(operator.wait_running(namespace, name), namespace, grace_period_seconds=0)
    status = operator.wait_run(namespace, name, timeout=30)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "PodDeleted")


def test_finished_run_is_deleted_after_its_ttl(operator, namespace):
    name = operator.create_run(namespace, {"language": PY, "code": "print(1)", "ttlSecondsAfterFinished": 2})
    assert operator.wait_run(namespace, name)["status"]["phase"] == "Succeeded"
    wait_for(lambda: name not in operator.run_names(namespace), 30, "the TTL controller to delete the finished run")


@pytest.mark.cold_only  # the cold pod's own children; a pool pod's hardening is test_warm's and the unit tests'
def test_children_are_owned_hardened_and_cleaned_up(operator, namespace):
    name = operator.create_run(namespace, {"language": PY, "code": "import time; time.sleep(3)"})
    pod = operator.core.read_namespaced_pod(operator.wait_running(namespace, name), namespace)
    spec, container = pod.spec, pod.spec.containers[0]
    assert spec.runtime_class_name == "gvisor" and spec.automount_service_account_token is False
    assert spec.enable_service_links is False and not (spec.host_network or spec.host_pid or spec.host_ipc)
    assert spec.security_context.run_as_non_root and spec.security_context.seccomp_profile.type == "RuntimeDefault"
    hardening = container.security_context
    assert hardening.read_only_root_filesystem and hardening.allow_privilege_escalation is False
    assert hardening.capabilities.drop == ["ALL"] and not container.env
    assert container.resources.requests == container.resources.limits
    assert [v.name for v in spec.volumes if v.host_path] == [] and spec.active_deadline_seconds
    status = operator.wait_run(namespace, name)["status"]
    cms = operator.core.list_namespaced_config_map(namespace, label_selector=f"coderun.io/run={name}").items
    policies = operator.networking.list_namespaced_network_policy(namespace).items
    assert all(cm.metadata.owner_references[0].name == name for cm in cms) and cms
    assert {p.metadata.name for p in policies} >= {f"{name}-deny", "coderun-sandbox-default-deny"}
    wait_for(lambda: not operator.run_pods(namespace), 30, "the finished pod to be deleted")
    assert status["podName"] == f"{name}-sandbox"


def test_a_run_no_node_can_take_fails_fast_as_unschedulable(operator, namespace):
    # Within the policy's maximum (2 CPUs) but, with the sandbox's own overhead, more than this node has.
    name = operator.create_run(namespace, {"language": PY, "code": "print(1)", "limits": {"cpu": "2"}})
    status = operator.wait_run(namespace, name, timeout=30)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "Unschedulable")
    assert "lower spec.limits.cpu" in status["message"]
    wait_for(lambda: not operator.run_pods(namespace), 30, "the pod to be deleted")


@pytest.mark.cold_only  # a pool pod made before the refusal would answer instead
def test_a_sandbox_the_namespace_refuses_fails_with_the_api_servers_reason(operator, namespace):
    operator.core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "no-pods"},
                                                               "spec": {"hard": {"pods": "0"}}})
    wait_for(lambda: operator.core.read_namespaced_resource_quota("no-pods", namespace).status.hard, 30,
             "the quota to be in force")
    status = operator.wait_run(namespace, operator.create_run(namespace, {"language": PY, "code": "print(1)"}),
                               timeout=30)["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "StartFailed")
    assert "exceeded quota" in status["message"] and "Pod" in status["message"]
