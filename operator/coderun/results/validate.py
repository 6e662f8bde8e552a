"""spec.expect against the real output: which expectations failed, in words a person can act on."""
from __future__ import annotations

import json

import jsonschema

from ..api.models import Expect, Validation


def validate_output(expect: Expect | None, exit_code: int | None, stdout: str, stdout_truncated: bool) -> Validation | None:
    if expect is None or (expect.exit_code is None and expect.stdout_json_schema is None):
        return None
    errors: list[str] = []
    if expect.exit_code is not None and exit_code != expect.exit_code:
        errors.append(f"exit code {exit_code} is not the expected {expect.exit_code}")
    if expect.stdout_json_schema is not None:
        errors.extend(_schema_errors(expect.stdout_json_schema, stdout, stdout_truncated))
    return Validation(valid=not errors, errors=errors)


def _schema_errors(schema: dict, stdout: str, truncated: bool) -> list[str]:
    if truncated:
        return ["stdout was truncated, so it cannot be checked against stdoutJSONSchema; raise limits.outputBytes"]
    try:
        document = json.loads(stdout)
    except ValueError as e:
        return [f"stdout is not JSON ({e.msg} at line {e.lineno} column {e.colno})"]
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as e:
        return [f"spec.expect.stdoutJSONSchema is not a valid JSON Schema: {e.message}"]
    found = sorted(validator_class(schema).iter_errors(document), key=lambda e: list(e.absolute_path))
    return [f"stdout{_path(e.absolute_path)}: {e.message}" for e in found[:20]]


def _path(parts) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)
