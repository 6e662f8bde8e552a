"""RunRequest -> CodeRun body, and CodeRun -> RunResult: the SDK's pure halves."""
import base64
import hashlib
import re
import subprocess
import sys
from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from coderun.api.models import CodeRunSpec, Limits
from coderun.client import CodeRunError, PolicyDenied, RunRejected, RunRequest
from coderun.client.request import build_body, file_input, new_run_name, rfc3339_millis, sandbox_path
from coderun.client.result import result_from_object
from coderun.client.sync import default_wait_seconds, raise_if_rejected


def test_body_has_a_client_chosen_name_labels_a_create_token_and_a_millisecond_created_at():
    spec = RunRequest(code="print(1)").to_spec()
    body = build_body(spec, client_name="agent", labels={"team": "a"}, create_token="t-1",
                      now=datetime(2026, 11, 22, 10, 0, 0, 123456, tzinfo=timezone.utc))
    name = body["metadata"].pop("name")
    assert body["metadata"] == {
        "labels": {"coderun.io/client": "agent", "team": "a"},
        "annotations": {"coderun.io/created-at": "2026-11-22T10:00:00.123Z", "coderun.io/create-token": "t-1"},
    }
    # chosen before the first attempt, so a retried create finds its own run under the same name
    assert re.fullmatch(r"run-[bcdfghjklmnpqrstvwxz2456789]{8}", name)
    assert body["apiVersion"] == "coderun.io/v1alpha1" and body["kind"] == "CodeRun"
    assert body["spec"] == {"language": "python", "code": "print(1)"}


def test_each_body_gets_its_own_name_and_token():
    bodies = [build_body(RunRequest(code="x").to_spec(), client_name="sdk") for _ in range(50)]
    assert len({b["metadata"]["name"] for b in bodies}) == 50
    assert len({b["metadata"]["annotations"]["coderun.io/create-token"] for b in bodies}) == 50


def test_an_explicit_name_is_used_and_a_long_prefix_still_makes_a_valid_name():
    body = build_body(RunRequest(code="x").to_spec(), client_name="sdk", name="fixed")
    assert body["metadata"]["name"] == "fixed" and "generateName" not in body["metadata"]
    assert len(new_run_name("p" * 80)) == 63


def test_the_created_at_annotation_parses_back_to_the_same_instant():
    moment = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=timezone.utc)
    assert datetime.fromisoformat(rfc3339_millis(moment).replace("Z", "+00:00")) == moment


def test_timeout_overrides_limits_and_limits_go_camel_case_on_the_wire():
    spec = RunRequest(code="x", timeout=9).to_spec({"memory": "512Mi", "timeoutSeconds": 3})
    assert spec.model_dump(by_alias=True, exclude_none=True)["limits"] == {"timeoutSeconds": 9, "memory": "512Mi"}
    assert RunRequest(code="x").to_spec(Limits(cpu="500m")).limits.cpu == "500m"
    assert RunRequest(code="x").to_spec().limits is None
    asked = RunRequest(code="x", memory="1Gi", cpu="500m").to_spec({"memory": "512Mi", "cpu": "2"})
    assert (asked.limits.memory, asked.limits.cpu) == ("1Gi", "500m")


def test_files_accept_a_mapping_of_text_and_bytes():
    request = RunRequest(code="x", files={"data.csv": "a,b\n", "blob.bin": b"\xff\x00", "utf8.txt": "é".encode()})
    by_path = {f.path: f for f in request.files}
    assert by_path["data.csv"].content == "a,b\n"
    assert by_path["utf8.txt"].content == "é"
    assert base64.b64decode(by_path["blob.bin"].content_base64) == b"\xff\x00"
    assert by_path["blob.bin"].content is None


def test_files_in_wire_form_validate_like_the_crd():
    request = RunRequest.model_validate({"code": "x", "files": [{"path": "d.bin", "contentBase64": "AAE="}]})
    assert request.files[0].content_base64 == "AAE="
    with pytest.raises(ValidationError):
        RunRequest.model_validate({"code": "x", "files": [{"path": "d", "content": "a", "bogus": 1}]})


@pytest.mark.parametrize("bad", [{"code": ""}, {"code": "x", "language": "Py thon"}, {"code": "x", "timeout": 0},
                                 {"code": "x", "unknown": 1}])
def test_bad_requests_are_refused_before_any_api_call(bad):
    with pytest.raises(ValidationError):
        RunRequest.model_validate(bad)


def test_file_input_and_sandbox_path():
    assert file_input("a.txt", "hi").content == "hi"
    assert sandbox_path("/home/me/data/data.csv") == "data.csv"
    assert sandbox_path("data.csv") == "data.csv"


def test_default_wait_is_the_run_limit_plus_startup_allowance():
    # The allowance: the operator's own 300 s bound on a sandbox that cannot start, and a minute for its write.
    assert default_wait_seconds(10) == 370
    assert default_wait_seconds(None) == 420


def _obj(status=None, **meta):
    return {"metadata": {"name": "run-x", "namespace": "ns", "labels": {"coderun.io/client": "sdk"},
                         "creationTimestamp": "2026-11-22T10:00:00Z", **meta},
            "spec": {"language": "python", "code": "x"}, **({"status": status} if status else {})}


def test_result_from_a_finished_run_is_typed():
    result = result_from_object(_obj({
        "phase": "Failed", "reason": "NonZeroExit", "exitCode": 1, "stdout": "", "stderr": "Trace...",
        "error": {"type": "KeyError", "message": "'valeu'", "line": 3},
        "metrics": {"wallMillis": 12, "maxRSSBytes": 1000, "totalMillis": 2000},
        "artifacts": [{"name": "a.png", "size": 3, "sha256": "ab", "configMap": "run-x-artifacts", "key": "artifact-0"}],
        "someFutureField": "ignored, not fatal"}))
    assert (result.name, result.namespace, result.exit_code) == ("run-x", "ns", 1)
    assert result.error.type == "KeyError" and result.error.line == 3
    assert result.metrics.max_rss_bytes == 1000 and result.artifacts[0].config_map == "run-x-artifacts"
    assert result.finished and not result.succeeded and not result.rejected and not result.timed_out


def test_result_without_status_is_not_finished():
    result = result_from_object(_obj())
    assert result.phase is None and not result.finished and result.labels == {"coderun.io/client": "sdk"}


def test_infrastructure_failures_and_timeouts_are_told_apart():
    assert result_from_object(_obj({"phase": "Failed", "reason": "PodDeleted"})).infrastructure_failure
    timed_out = result_from_object(_obj({"phase": "Failed", "reason": "Timeout"}))
    assert timed_out.timed_out and not timed_out.infrastructure_failure


def test_rejections_raise_policy_denied_with_rule_and_message():
    denied = result_from_object(_obj({"phase": "Rejected", "reason": "PolicyDenied", "policyRule": "runtimes",
                                      "message": "language 'ruby' is not offered; use one of: python"}))
    with pytest.raises(PolicyDenied) as caught:
        raise_if_rejected(denied)
    assert caught.value.rule == "runtimes" and "use one of: python" in caught.value.message
    invalid = result_from_object(_obj({"phase": "Rejected", "reason": "InvalidSpec", "message": "bad"}))
    with pytest.raises(RunRejected) as caught:
        raise_if_rejected(invalid)
    assert not isinstance(caught.value, PolicyDenied) and caught.value.reason == "InvalidSpec"
    ok = result_from_object(_obj({"phase": "Succeeded", "reason": "Completed", "exitCode": 0}))
    assert raise_if_rejected(ok) is ok


def test_the_spec_made_from_a_request_is_a_valid_coderun_spec():
    spec = RunRequest(code="print(1)", stdin="in", files={"d.txt": "x"}, timeout=3).to_spec()
    assert CodeRunSpec.model_validate(spec.model_dump(by_alias=True, exclude_none=True)) == spec


def test_the_sdk_cli_and_tools_import_without_kopf_mcp_or_openai():
    """The light `pip install coderun` has kubernetes + pydantic only: none of these may pull in the extras."""
    blocked = "import sys\nfor name in ('kopf', 'mcp', 'openai'):\n    sys.modules[name] = None\n"
    done = subprocess.run([sys.executable, "-c", blocked + "import coderun.client, coderun.cli, coderun.tools\n"
                           "assert not [m for m in sys.modules if m.startswith('coderun_operator')]"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr  # nor the control plane: the layout's line between the two


def test_a_refusal_by_the_policy_webhook_is_policy_denied_with_rule_and_message():
    from coderun.client.waiting import refuse
    detail = ('admission webhook "validate-run.validate.coderun.io" denied the request: line 2: the code imports '
              "'socket', which policy 'strict' denies (codeRules.deniedPythonImports); change the code "
              "[codeRules.deniedPythonImports]")
    error = refuse("create CodeRun", 403, detail)
    assert isinstance(error, PolicyDenied) and error.result is None and error.status == 403
    assert error.rule == "codeRules.deniedPythonImports" and error.message.startswith("line 2: the code imports")
    assert not error.message.endswith("]")


def test_artifact_bytes_are_only_the_bytes_the_status_vouches_for():
    from coderun.api.models import Artifact
    from coderun.client.artifacts import artifact_bytes
    data = b"\x89PNG-bytes"
    artifact = Artifact.model_validate({"name": "a.png", "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                        "configMap": "run-x-artifacts", "key": "artifact-0"})
    assert artifact_bytes(artifact, {"artifact-0": base64.b64encode(data).decode()}) == data
    for replaced in (base64.b64encode(b"forged-bytes").decode(), "not base64!"):
        with pytest.raises(CodeRunError, match="no longer holds the bytes the run recorded"):
            artifact_bytes(artifact, {"artifact-0": replaced})
