"""Tool schemas come from RunRequest, and render_result shows a model what it needs to act."""
import asyncio
import json

import pytest
from pydantic import ValidationError

from coderun.client import PolicyDenied, RunRequest, RunTimeout
from coderun.mcp_server import call_tool
from coderun.client.result import result_from_object
from coderun.tools import (anthropic_tools, input_schema, openai_tools, render_result, render_runtimes,
                           tool_description)
from coderun.client.runtimes import offered_runtimes


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
    assert set(schema["properties"]) == set(RunRequest.model_fields)  # language, code, files, stdin, timeout
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


class FakeAsyncClient:
    """Answers submit() with a scripted RunResult or exception, recording the requests."""
    def __init__(self, outcome):
        self.outcome, self.requests = outcome, []

    async def submit(self, request):
        self.requests.append(request)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome

    async def runtimes(self):
        return offered_runtimes()


def _call(client, name, arguments):
    return asyncio.run(call_tool(client, name, arguments))


def test_mcp_run_code_validates_arguments_with_run_request():
    client = FakeAsyncClient(_result(phase="Succeeded", reason="Completed", exitCode=0, stdout="1\n", stdoutBytes=2))
    assert _call(client, "run_code", {"code": "print(1)", "timeout": 3}) == ("exit code 0 (Completed)\n"
                                                                             "stdout (2 bytes):\n1", False)
    assert client.requests[0].timeout == 3
    text, is_error = _call(client, "run_code", {"code": "x", "timeout": 0})
    assert is_error and text.startswith("invalid arguments: timeout: Input should be greater than or equal to 1")
    assert _call(client, "nope", {})[1] is True


def test_mcp_marks_what_the_model_cannot_fix_as_errors():
    denied = _result(phase="Rejected", reason="PolicyDenied", policyRule="runtimes", message="use one of: python")
    assert _call(FakeAsyncClient(PolicyDenied(denied)), "run_code", {"code": "x"}) == (
        "rejected (PolicyDenied, policy rule runtimes): use one of: python", True)
    text, is_error = _call(FakeAsyncClient(RunTimeout("run-a", "ns", 2.0, None)), "run_code", {"code": "x"})
    assert is_error and "did not finish in time" in text
    failed = _result(phase="Failed", reason="NonZeroExit", exitCode=1, error={"type": "E", "message": "m", "line": 1})
    assert _call(FakeAsyncClient(failed), "run_code", {"code": "boom()"}) == (
        "exit code 1 (NonZeroExit)\nerror: E at line 1: m\nfailing line 1: boom()\n(no output)", False)
