"""The strict variant of the tool schemas (OpenAI's strict mode), the Responses API shape, a null argument
meaning the default, the tool call every framework adapter makes (coderun.tools.invoke), and the adapters' error
when their framework is missing. The adapters with their real frameworks: tests/frameworks."""
import sys

import pytest
from pydantic import ValidationError

from coderun.client import CodeRunError, PolicyDenied, RunRequest, RunTimeout
from coderun.client.result import result_from_object
from coderun.client.runtimes import offered_runtimes
from coderun.tools import (LIST_RUNTIMES, RUN_CODE, input_schema, openai_tools, render_result, responses_tools,
                           strict_schema, tool_parameters)
from coderun.tools.invoke import call_tool_sync


# OpenAI's strict mode (Structured Outputs, "Supported schemas"): the keywords it enforces; anything else it
# refuses or ignores, so the strict schema must not carry it.
STRICT_SUPPORTED = {"type", "description", "properties", "required", "additionalProperties", "items", "enum",
                    "const", "anyOf", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                    "exclusiveMaximum", "multipleOf", "minItems", "maxItems"}


def strict_violations(schema, path="$"):
    """Every way `schema` breaks strict mode's documented rules, written from the rules, not from strict.py."""
    found = [f"{path}: {key} is not supported" for key in schema if key not in STRICT_SUPPORTED]
    types = schema.get("type") if isinstance(schema.get("type"), list) else [schema.get("type")]
    if "object" in types:
        if schema.get("additionalProperties") is not False:
            found.append(f"{path}: additionalProperties must be false")
        if sorted(schema.get("required", [])) != sorted(schema.get("properties", {})):
            found.append(f"{path}: every property must be required")
    for name, prop in schema.get("properties", {}).items():
        found += strict_violations(prop, f"{path}.{name}")
    if "items" in schema:
        found += strict_violations(schema["items"], f"{path}[]")
    for i, option in enumerate(schema.get("anyOf", [])):
        found += strict_violations(option, f"{path}|{i}")
    return found


def admits_null(schema):
    types = schema.get("type") if isinstance(schema.get("type"), list) else [schema.get("type")]
    return "null" in types or any(admits_null(option) for option in schema.get("anyOf", []))


def test_the_strict_checker_finds_what_breaks_strict_mode():
    assert strict_violations(input_schema(RunRequest))  # the plain schema has optional properties and maxLength
    assert strict_violations({"type": "object", "properties": {}}) == ["$: additionalProperties must be false"]


@pytest.mark.parametrize("name", [RUN_CODE, LIST_RUNTIMES])
def test_the_strict_schema_keeps_every_property_and_makes_the_optional_ones_nullable(name):
    plain, strict = tool_parameters(name), tool_parameters(name, strict=True)
    assert strict["type"] == "object" and "anyOf" not in strict  # the root: a plain object
    assert strict_violations(strict) == []
    assert list(strict["properties"]) == list(plain["properties"])
    for prop, schema in strict["properties"].items():
        assert admits_null(schema) == (prop not in plain.get("required", [])), prop


def test_strict_mode_moves_what_it_cannot_enforce_into_the_description():
    properties = tool_parameters(RUN_CODE, strict=True)["properties"]
    assert properties["code"]["description"].endswith("1 to 131072 characters.")
    assert properties["language"]["description"].endswith("null means not given (default python).")
    assert properties["language"]["pattern"] == input_schema(RunRequest)["properties"]["language"]["pattern"]
    assert properties["timeout"]["minimum"] == 1 and properties["timeout"]["maximum"] == 3600
    file = properties["files"]["items"]
    assert file["required"] == ["path", "content", "contentBase64"] and admits_null(file["properties"]["content"])
    assert not admits_null(file["properties"]["path"])


def test_strict_schema_of_a_nullable_enum_and_a_nested_union():
    schema = strict_schema({"type": "object", "properties": {
        "unit": {"type": "string", "enum": ["C", "F"]},
        "where": {"anyOf": [{"type": "string"}, {"type": "object", "properties": {"lat": {"type": "number"}}}]}}})
    assert strict_violations(schema) == []
    assert schema["properties"]["unit"]["enum"] == ["C", "F", None]
    assert schema["properties"]["where"]["anyOf"][-1] == {"type": "null"}


def test_a_call_with_every_optional_argument_null_is_the_minimal_call():
    # A strict model sends every property; the ones it does not need are null, and the policy's default applies.
    nulls = {prop: None for prop in tool_parameters(RUN_CODE, strict=True)["properties"]}
    assert RunRequest.model_validate({**nulls, "code": "print(1)"}) == RunRequest.model_validate({"code": "print(1)"})
    assert RunRequest.model_validate({**nulls, "code": "print(1)"}).to_spec().limits is None
    with_file = RunRequest.model_validate({**nulls, "code": "x", "files": [
        {"path": "d.csv", "content": "a\n", "contentBase64": None}]})
    assert with_file.files[0].content == "a\n" and with_file.files[0].content_base64 is None
    with pytest.raises(ValidationError, match="code\n  Field required"):
        RunRequest.model_validate(nulls)  # code stays required: null is not a program


@pytest.mark.parametrize("strict", [False, True])
def test_the_responses_api_shape_is_flat_and_states_strict(strict):
    responses = responses_tools(strict=strict)
    chat = openai_tools(strict=strict)
    assert [t["name"] for t in responses] == [RUN_CODE, LIST_RUNTIMES]
    for flat, nested in zip(responses, chat):
        assert set(flat) == {"type", "name", "description", "parameters", "strict"} and flat["strict"] is strict
        assert flat["type"] == nested["type"] == "function"
        assert {k: flat[k] for k in ("name", "description", "parameters")} == \
            {k: nested["function"][k] for k in ("name", "description", "parameters")}
        assert nested["function"].get("strict", False) is strict
        assert flat["parameters"] == tool_parameters(flat["name"], strict=strict)


def _result(**status):
    return result_from_object({"metadata": {"name": "run-a", "namespace": "ns"}, "status": status})


class FakeClient:
    """A CodeRunClient stand-in: answers submit() with a scripted RunResult or exception, recording requests."""
    def __init__(self, outcome):
        self.outcome, self.requests = outcome, []

    def submit(self, request):
        self.requests.append(request)
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome

    def runtimes(self):
        return offered_runtimes()


SUCCEEDED = _result(phase="Succeeded", reason="Completed", exitCode=0, stdout="42\n", stdoutBytes=3)


def test_a_call_as_json_text_or_a_dict_runs_the_same_request_and_renders_the_result():
    text_call, dict_call = FakeClient(SUCCEEDED), FakeClient(SUCCEEDED)
    assert call_tool_sync(text_call, RUN_CODE, '{"code": "print(42)", "language": null, "timeout": 3}') == (
        render_result(SUCCEEDED, "print(42)"), False)
    call_tool_sync(dict_call, RUN_CODE, {"code": "print(42)", "timeout": 3})
    assert text_call.requests == dict_call.requests == [RunRequest(code="print(42)", timeout=3)]


@pytest.mark.parametrize("name,arguments,text", [
    (RUN_CODE, '{"code": ', "invalid arguments: not a JSON object (Expecting value"),
    (RUN_CODE, {"code": "x", "timeout": 0}, "invalid arguments: timeout: Input should be greater than or equal to 1"),
    (RUN_CODE, {"language": "python"}, "invalid arguments: code: Field required"),
    ("shell", {}, "unknown tool 'shell'; the tools are run_code and list_runtimes"),
])
def test_a_call_the_model_got_wrong_says_what_to_change_and_runs_nothing(name, arguments, text):
    client = FakeClient(SUCCEEDED)
    reply = call_tool_sync(client, name, arguments)
    assert reply.is_error and reply.text.startswith(text) and client.requests == []


@pytest.mark.parametrize("outcome,text", [
    (PolicyDenied(_result(phase="Rejected", reason="PolicyDenied", policyRule="runtimes", message="use python")),
     "rejected (PolicyDenied, policy rule runtimes): use python"),
    (PolicyDenied.at_admission('admission webhook "x" denied the request: ask for at most 2Gi [maximums.memory]'),
     "refused by policy (maximums.memory): ask for at most 2Gi"),
    (RunTimeout("run-a", "ns", 2.0, None), "the run did not finish in time: "),
    (CodeRunError("create CodeRun: connection refused"), "coderun is unavailable: create CodeRun: connection refused"),
    (_result(phase="Failed", reason="PodDeleted", message="the pod was deleted"), "platform failure (PodDeleted)"),
])
def test_what_the_model_cannot_fix_is_an_error_reply(outcome, text):
    reply = call_tool_sync(FakeClient(outcome), RUN_CODE, {"code": "x"})
    assert reply.is_error and reply.text.startswith(text)


def test_a_failed_program_is_a_normal_reply_and_list_runtimes_renders_the_policy():
    failed = _result(phase="Failed", reason="NonZeroExit", exitCode=1, error={"type": "E", "message": "m", "line": 1})
    assert call_tool_sync(FakeClient(failed), RUN_CODE, {"code": "boom()"}) == (
        "exit code 1 (NonZeroExit)\nerror: E at line 1: m\nfailing line 1: boom()\n(no output)", False)
    text, is_error = call_tool_sync(FakeClient(SUCCEEDED), LIST_RUNTIMES, None)
    assert not is_error and text.splitlines()[-1] == "policy builtin-default; no network; approval Never"


@pytest.mark.parametrize("module,framework,extra", [
    ("openai_agents", "agents", "openai-agents"),
    ("langchain", "langchain_core", "langchain"),
    ("llama_index", "llama_index", "llamaindex"),
])
def test_an_adapter_without_its_framework_names_the_extra_to_install(monkeypatch, module, framework, extra):
    adapter = __import__(f"coderun.tools.frameworks.{module}", fromlist=["coderun_tools"])
    for loaded in [m for m in sys.modules if m == framework or m.startswith(framework + ".")]:
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setitem(sys.modules, framework, None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ImportError, match=rf"pip install 'coderun\[{extra}\]'"):
        adapter.coderun_tools(FakeClient(SUCCEEDED))
