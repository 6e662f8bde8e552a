"""spec.expect against the real output: which expectations failed, in words a person can act on.

Both inputs are hostile: the caller writes the schema (an exponential `pattern`, a `$ref` to anywhere, a
quadratic `uniqueItems`), the program writes the document (nesting 100 000 deep, a 5 000-digit integer).
So the JSON Schema check runs in a separate worker process with a hard time and memory limit, patterns run
on RE2 (linear time), references never leave the schema, and the result is a bounded list of short lines.
A check that cannot finish is reported as a validation error, never as a stuck or crashed operator.
"""
from __future__ import annotations

import json
import multiprocessing
import resource
import signal
from multiprocessing.connection import Connection
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from coderun.api.models import Expect, Validation

if TYPE_CHECKING:  # jsonschema is imported in the worker only
    from jsonschema import ValidationError
    from jsonschema.protocols import Validator

# CPU time, not wall time: a busy node must not fail an honest check. The wall limit is only a backstop.
SCHEMA_CHECK_CPU_SECONDS = 2
SCHEMA_CHECK_WALL_SECONDS = 15.0
SCHEMA_CHECK_MEMORY_BYTES = 512 * 1024 * 1024
MAX_ERRORS = 20
MAX_ERROR_CHARS = 300


def validate_output(expect: Expect | None, exit_code: int | None, stdout: str, stdout_truncated: bool) -> Validation | None:
    if expect is None or (expect.exit_code is None and expect.stdout_json_schema is None):
        return None
    errors: list[str] = []
    if expect.exit_code is not None and exit_code != expect.exit_code:
        errors.append(f"exit code {exit_code} is not the expected {expect.exit_code}")
    if expect.stdout_json_schema is not None:
        if stdout_truncated:
            errors.append("stdout was truncated, so it cannot be checked against stdoutJSONSchema; "
                          "raise limits.outputBytes")
        else:
            errors.extend(_bounded(check_in_worker(expect.stdout_json_schema, stdout)))
    return Validation(valid=not errors, errors=errors)


def _bounded(errors: list[str]) -> list[str]:
    shown = [e if len(e) <= MAX_ERROR_CHARS else e[:MAX_ERROR_CHARS - 1] + "…" for e in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        shown.append(f"… and {len(errors) - MAX_ERRORS} more")
    return shown


# ------------------------------------------------------------------------------------------ the worker
_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(["jsonschema", "re2", __name__])


def check_in_worker(schema: dict[str, Any], stdout: str, seconds: float = SCHEMA_CHECK_WALL_SECONDS) -> list[str]:
    """schema_errors() in a fresh process from the fork server: it dies past its CPU limit (SIGXCPU) and is
    killed past `seconds` of wall time."""
    receive, send = _context.Pipe(duplex=False)
    worker = _context.Process(target=_work, args=(send, schema, stdout), daemon=True)
    try:
        worker.start()
        send.close()
        if receive.poll(seconds):
            errors: list[str] = receive.recv()
            return errors
        return [f"checking stdout against stdoutJSONSchema took longer than {seconds:g}s and was stopped; "
                "simplify the schema (patterns, uniqueItems, nesting) or the output"]
    except (EOFError, OSError):  # the worker died: its CPU or memory limit, or it could not start
        worker.join(1)
        why = (f"took more than {SCHEMA_CHECK_CPU_SECONDS}s of CPU" if worker.exitcode == -signal.SIGXCPU
               else "ran out of memory or could not start")
        return [f"checking stdout against stdoutJSONSchema {why} and was stopped; simplify the schema "
                "(patterns, uniqueItems, nesting) or the output"]
    finally:
        if worker.is_alive():
            worker.kill()
        worker.join(1)
        receive.close()


def _work(send: Connection, schema: dict[str, Any], stdout: str) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (SCHEMA_CHECK_MEMORY_BYTES, SCHEMA_CHECK_MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (SCHEMA_CHECK_CPU_SECONDS, SCHEMA_CHECK_CPU_SECONDS + 1))
    try:
        result = schema_errors(schema, stdout)
    except BaseException as e:  # noqa: BLE001 - whatever happens, the operator gets an answer
        result = [f"stdout could not be checked against stdoutJSONSchema: {type(e).__name__}: {str(e)[:200]}"]
    send.send(_bounded(result))


TOO_DEEP = "stdout is nested too deeply to check against stdoutJSONSchema"


def schema_errors(schema: dict[str, Any], stdout: str) -> list[str]:
    """The check itself (run inside the worker): parse, check the schema, list what does not match."""
    import jsonschema
    import referencing
    try:
        document = json.loads(stdout)
    except json.JSONDecodeError as e:
        return [f"stdout is not JSON ({e.msg} at line {e.lineno} column {e.colno})"]
    except RecursionError:
        return [TOO_DEEP]
    except ValueError as e:  # e.g. an integer longer than Python's conversion limit
        return [f"stdout is JSON this check does not accept ({type(e).__name__}: {str(e)[:120]})"]
    try:
        validator_class = _linear_time(jsonschema.validators.validator_for(schema))
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as e:
        return [f"spec.expect.stdoutJSONSchema is not a valid JSON Schema: {e.message}"]
    # An empty registry: `$ref` resolves inside the schema only, never over the network.
    validator = validator_class(schema, registry=referencing.Registry())
    try:
        found = sorted(validator.iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path])
    except referencing.exceptions.Unresolvable as e:
        return [f"spec.expect.stdoutJSONSchema has a $ref that cannot be resolved ({e}); "
                "only references inside the schema (#/...) work"]
    except RecursionError:
        return [TOO_DEEP]
    return [f"stdout{_path(e.absolute_path)}: {e.message}" for e in found]


def _linear_time(validator_class: type[Validator]) -> type[Validator]:
    """The same validator with `pattern` and `patternProperties` on RE2 instead of Python's backtracking re."""
    import jsonschema
    import re2

    def pattern(validator: Validator, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if validator.is_type(instance, "string") and not _search(re2, patrn, instance):
            yield jsonschema.ValidationError(f"{instance[:80]!r} does not match {patrn!r}")

    # Any: the validator's own class, whose `descend` jsonschema's Validator protocol does not name
    def pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
                           ) -> Iterator[ValidationError]:
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in patterns.items():
            for key, value in instance.items():
                if _search(re2, patrn, key):
                    yield from validator.descend(value, subschema, path=key, schema_path=patrn)

    extended: type[Validator] = jsonschema.validators.extend(
        validator_class, {"pattern": pattern, "patternProperties": pattern_properties})
    return extended


def _search(re2: ModuleType, pattern: str, text: str) -> bool:
    try:
        return re2.search(pattern, text) is not None
    except re2.error as e:
        raise ValueError(f"pattern {pattern!r} is not supported (RE2 syntax, no look-around): {e}") from e


def _path(parts: Iterable[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)
