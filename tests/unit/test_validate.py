from coderun.api.models import Expect
from coderun_operator.results.validate import validate_output

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


def test_a_check_that_burns_cpu_is_stopped_with_a_clear_error():
    from coderun_operator.results import validate
    # uniqueItems over many distinct unhashable items is quadratic in jsonschema.
    stdout = "[" + ",".join(f'{{"k": {i}}}' for i in range(40000)) + "]"
    result = validate_output(Expect(stdout_json_schema={"type": "array", "uniqueItems": True}), 0, stdout, False)
    assert not result.valid and "CPU" in result.errors[0] and "simplify the schema" in result.errors[0]
    assert validate.SCHEMA_CHECK_CPU_SECONDS <= 2


def test_hostile_documents_and_schemas_get_answers_not_crashes():
    cases = [({"type": "integer"}, "9" * 5000, "not accept"), ({"type": "array"}, "[" * 100000, "nested too deeply"),
             ({"$ref": "http://169.254.169.254/x"}, "1", "$ref"),
             ({"type": "string", "pattern": "^(a+)+$"}, '"' + "a" * 40 + '!"', "does not match")]
    for schema, stdout, says in cases:
        result = validate_output(Expect(stdout_json_schema=schema), 0, stdout, False)
        assert not result.valid and says in result.errors[0], (schema, result.errors)
