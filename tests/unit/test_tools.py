"""Tool schemas come from RunRequest, and render_result shows a model what it needs to act."""
import json

import pytest
from pydantic import ValidationError

from coderun.client import RunRequest
from coderun.client.result import result_from_object
from coderun.tools import (anthropic_tools, input_schema, openai_tools, render_result, render_runtimes,
                           tool_description)
from coderun.client.runtimes import offered_runtimes
from coderun.tools.policy_schema import policy_input_schema
from coderun.tools.structured import show_artifacts, sniff_image, to_read


def _walk(node):
    yield node
    if isinstance(node, dict):
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def test_openai_and_anthropic_definitions_share_one_schema_from_run_request():
    openai_run = next(t for t in openai_tools() if t["function"]["name"] == "run_code")
    anthropic_run = next(t for t in anthropic_tools() if t["name"] == "run_code")
    assert openai_run["type"] == "function"
    assert openai_run["function"]["parameters"] == anthropic_run["input_schema"] == input_schema(RunRequest)
    assert openai_run["function"]["description"] == anthropic_run["description"] == tool_description("run_code")
    schema = anthropic_run["input_schema"]
    assert set(schema["properties"]) == set(RunRequest.model_fields)  # language, code, files, stdin, timeout, memory, cpu
    assert schema["required"] == ["code"]
    assert schema["properties"]["files"]["items"]["properties"].keys() == {"path", "content", "contentBase64"}


def test_schemas_are_self_contained_and_free_of_kubernetes_only_keys():
    for tool in anthropic_tools():
        text = json.dumps(tool["input_schema"])
        assert "$ref" not in text and "$defs" not in text and "x-kubernetes" not in text
        assert all("title" not in node for node in _walk(tool["input_schema"]) if isinstance(node, dict)
                   and "type" in node)
        assert all(not (isinstance(n, dict) and {"type": "null"} in n.get("anyOf", [])) for n in _walk(tool))


def test_what_the_schema_allows_the_model_validates():
    arguments = {"code": "print(1)", "language": "python", "files": [{"path": "d.csv", "content": "a\n"}],
                 "stdin": "", "timeout": 5}
    assert RunRequest.model_validate(arguments).files[0].path == "d.csv"
    with pytest.raises(ValidationError):
        RunRequest.model_validate({"language": "python"})  # code is required in the schema too


def _result(**status):
    return result_from_object({"metadata": {"name": "run-a", "namespace": "ns"}, "status": status})


def test_render_a_failure_with_the_error_line_and_the_failing_source_line():
    code = "import csv\nrows = list(csv.DictReader(open('d.csv')))\nprint(sum(float(r['valeu']) for r in rows))\n"
    text = render_result(_result(phase="Failed", reason="NonZeroExit", exitCode=1, stdout="", stderr="Traceback...",
                                 stderrBytes=13, error={"type": "KeyError", "message": "'valeu'", "line": 3}), code)
    lines = text.splitlines()
    assert lines[0] == "exit code 1 (NonZeroExit)"
    assert lines[1] == "error: KeyError at line 3: 'valeu'"
    assert lines[2] == "failing line 3: print(sum(float(r['valeu']) for r in rows))"
    assert "stderr (13 bytes):\nTraceback..." in text and "stdout" not in text


def test_render_truncation_with_byte_counts_and_artifacts():
    text = render_result(_result(phase="Succeeded", reason="Completed", exitCode=0, stdout="x" * 10,
                                 stdoutBytes=5000, stdoutTruncated=True,
                                 artifacts=[{"name": "plot.png", "size": 2048, "sha256": "a", "configMap": "c",
                                             "key": "artifact-0"}]))
    assert text.splitlines()[0] == "exit code 0 (Completed)"
    assert "stdout (10 of 5000 bytes, truncated):\nxxxxxxxxxx" in text
    assert text.splitlines()[-1] == "artifacts: plot.png (2048 bytes)"


@pytest.mark.parametrize("status,first_line", [
    ({"phase": "Rejected", "reason": "PolicyDenied", "policyRule": "maximums.memory", "message": "ask for at most 2Gi"},
     "rejected (PolicyDenied, policy rule maximums.memory): ask for at most 2Gi"),
    ({"phase": "Failed", "reason": "Timeout", "effectiveLimits": {"timeoutSeconds": 2}},
     "timed out after 2s: the program was stopped (reason Timeout)"),
    ({"phase": "Failed", "reason": "OOMKilled", "effectiveLimits": {"memory": "64Mi"}},
     "killed: out of memory (limit 64Mi) (reason OOMKilled)"),
    ({"phase": "Failed", "reason": "PodDeleted", "message": "the pod was deleted"},
     "platform failure (PodDeleted), not the program's fault; retrying may help: the pod was deleted"),
    ({"phase": "Running"}, "not finished yet (phase Running)"),
])
def test_render_outcomes(status, first_line):
    assert render_result(_result(**status)).splitlines()[0] == first_line


def test_a_silent_success_says_so():
    assert render_result(_result(phase="Succeeded", reason="Completed", exitCode=0, stdout="")) == \
        "exit code 0 (Completed)\n(no output)"


def test_runtimes_text_names_the_language_and_limits():
    lines = render_runtimes(offered_runtimes()).splitlines()
    assert lines[0].startswith("javascript: image coderun.local/sandbox-node:v2 (gvisor)")
    assert lines[1].startswith("python: image coderun.local/sandbox-python:v2 (gvisor)")
    assert "timeoutSeconds=5" in lines[1] and "memory=256Mi" in lines[1] and "memory=2Gi" in lines[1]
    assert lines[2] == "policy builtin-default; no network; approval Never"


@pytest.mark.parametrize("data,mime", [
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 8, "image/png"), (b"\xff\xd8\xff\xe0JFIF", "image/jpeg"),
    (b"GIF89a\x01\x00", "image/gif"), (b"RIFF\x10\x00\x00\x00WEBPVP8 ", "image/webp"),
    (b"RIFF\x10\x00\x00\x00WAVEfmt ", None), (b"\x89PNG", None), (b"plot.png", None),
])
def test_images_are_known_by_their_bytes(data, mime):
    assert sniff_image(data) == mime


def test_the_policy_shapes_the_run_code_schema_and_the_static_one_stays_apart():
    static = input_schema(RunRequest)
    policy = offered_runtimes()
    shaped = policy_input_schema(static, policy)
    assert shaped["properties"]["language"] == {**static["properties"]["language"],
                                                "enum": ["javascript", "python"], "default": "python"}
    assert (shaped["properties"]["timeout"]["default"], shaped["properties"]["timeout"]["maximum"]) == (5, 300)
    assert shaped["properties"]["cpu"]["default"] == "1" and shaped["properties"]["cpu"]["description"] == \
        "CPU for the program, e.g. 500m or 2: default 1, at most 2 (policy builtin-default)."
    assert "enum" not in static["properties"]["language"] and static["properties"]["timeout"]["maximum"] == 3600
    assert policy_input_schema(static, []) == static


def test_a_policy_maximum_above_the_api_bound_is_cut_to_it():
    lenient = [r.model_copy(update={"maximum_limits": {**r.maximum_limits, "timeoutSeconds": 86400}})
               for r in offered_runtimes()]
    assert policy_input_schema(input_schema(RunRequest), lenient)["properties"]["timeout"]["maximum"] == 3600


def test_artifacts_past_the_bounds_are_listed_with_why():
    artifacts = [{"name": f"a{i}.csv", "size": 10, "sha256": "x", "configMap": "c", "key": f"k{i}"} for i in range(8)]
    result = _result(phase="Succeeded", reason="Completed", exitCode=0, artifacts=artifacts)
    assert to_read(result) == [f"a{i}.csv" for i in range(6)]  # at most six are read
    read = {"a0.csv": b"x,y\n", "a1.csv": b"1,2\n", "a2.csv": b"3,4\n", "a3.csv": "ConfigMap c: 403 forbidden",
            "a4.csv": b"\x00\x01", "a5.csv": b"\xff\xfe"}  # the last two neither text nor image: listed
    shown = show_artifacts(result, read)
    assert [(name, mime) for name, mime, _ in shown.texts] == [("a0.csv", "text/csv"), ("a1.csv", "text/csv")]
    why = {a.name: a.why_not_shown for a in shown.listing if a.shown == "listed"}
    assert why == {"a2.csv": "more than 2 text files", "a3.csv": "could not be read: ConfigMap c: 403 forbidden",
                   "a4.csv": None, "a5.csv": None, "a6.csv": "more than 6 artifacts", "a7.csv": "more than 6 artifacts"}
