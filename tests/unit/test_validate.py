from coderun.api.models import Expect
from coderun.controlplane.results.validate import validate_output

SCHEMA = {"type": "object", "required": ["rate"], "properties": {"rate": {"type": "number", "maximum": 1}}}


def test_no_expectations_means_no_validation():
    assert validate_output(None, 0, "x", False) is None
    assert validate_output(Expect(), 0, "x", False) is None


def test_exit_code_and_schema_pass():
    result = validate_output(Expect(exit_code=0, stdout_json_schema=SCHEMA), 0, '{"rate": 0.5}', False)
    assert result.valid and result.errors == []


def test_each_failure_is_named():
    result = validate_output(Expect(exit_code=0, stdout_json_schema=SCHEMA), 2, '{"rate": 5}', False)
    assert not result.valid
    assert result.errors[0] == "exit code 2 is not the expected 0"
    assert result.errors[1].startswith("stdout.rate: 5 is greater than the maximum of 1")


def test_non_json_truncated_and_bad_schema_are_explained():
    assert "not JSON" in validate_output(Expect(stdout_json_schema=SCHEMA), 0, "hello", False).errors[0]
    assert "truncated" in validate_output(Expect(stdout_json_schema=SCHEMA), 0, "{}", True).errors[0]
    bad = validate_output(Expect(stdout_json_schema={"type": "nonsense"}), 0, "{}", False)
    assert "not a valid JSON Schema" in bad.errors[0]
