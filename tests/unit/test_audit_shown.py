"""status.audit where people and agents read it: the SDK's typed field, the CLI's one `touched:` line on stderr,
and the tool result's text line and structured content."""
import io

from coderun import cli
from coderun.client.result import result_from_object
from coderun.tools import render_result, touched_line
from coderun.tools.structured import RunOutput, dump, output_schema, run_output

AUDIT = {
    "source": "gvisor-trace", "complete": True,
    "filesRead": [{"path": "data/visits.csv", "count": 1}, {"path": "/tmp/a", "count": 1},
                  {"path": "/tmp/b", "count": 1}, {"path": "/tmp/c", "count": 1}],
    "filesWritten": [{"path": "/tmp/outputs/plot.png", "count": 1}],
    "outsideWorkdir": {"reads": 214, "writes": 0, "denied": 0, "examples": []},
    "connectAttempts": [{"family": "inet", "address": "10.96.0.1", "port": 443, "result": "timedOut", "count": 1}],
    "socketsOpened": [{"family": "inet", "protocol": "tcp", "result": "created", "count": 1}],
    "processes": [{"argv": ["python3", "main.py"], "exitCode": 1}, {"argv": ["sh", "-c", "curl"], "exitCode": 127}],
    "counts": {"processes": 2, "failedExecs": 1, "connectAttempts": 1, "syscallsDenied": 0, "openat2": 0,
               "addressedSends": 0, "pointsLost": 0, "pointsUnknown": 0},
    "runner": {"filesRead": 2, "filesWritten": 1, "processes": 2},
    "omitted": {"filesRead": 10},
    "recordConfigMap": "run-a-audit",
}
TOUCHED = ("touched: 14 files read (data/visits.csv, /tmp/a, /tmp/b, ...), 1 file written (/tmp/outputs/plot.png), "
           "1 connect attempt (10.96.0.1:443 timedOut), 2 processes, 1 failed exec")


def _result(**status):
    return result_from_object({"metadata": {"name": "run-a", "namespace": "ns"},
                               "status": {"phase": "Failed", "reason": "NonZeroExit", "exitCode": 1, **status}})


def test_the_sdk_result_types_the_audit():
    audit = _result(audit=AUDIT).audit
    assert audit.connect_attempts[0].address == "10.96.0.1" and audit.counts.failed_execs == 1
    assert audit.record_config_map == "run-a-audit" and audit.omitted.files_read == 10
    assert _result().audit is None


def test_the_touched_line_says_what_the_program_touched_in_one_bounded_line():
    assert touched_line(_result(audit=AUDIT).audit) == TOUCHED
    quiet = {**AUDIT, "filesRead": [], "filesWritten": [], "connectAttempts": [], "omitted": None, "complete": False,
             "counts": {**AUDIT["counts"], "processes": 1, "failedExecs": 0, "connectAttempts": 0}}
    assert touched_line(_result(audit=quiet).audit) == \
        "touched: 1 process (incomplete: the record missed the run's end)"
    many = {**AUDIT, "filesRead": [{"path": "/tmp/" + "x" * 500 + "\x1b[2J", "count": 1}] * 50}
    line = touched_line(_result(audit=many).audit)
    assert len(line) <= 400 and "\x1b" not in line and "\n" not in line
    assert touched_line(_result(audit={"source": "Unavailable", "message": "the audit agent is not installed "
                                       "(CODERUN_AUDIT_AGENT)"}).audit) == \
        "audit unavailable: the audit agent is not installed (CODERUN_AUDIT_AGENT)"
    assert touched_line(None) is None


def test_the_cli_prints_the_touched_line_before_the_summary_on_stderr():
    """The verdict stays the last line (scripts read it); what the program touched comes just before."""
    out, err = io.StringIO(), io.StringIO()
    cli.print_result(_result(audit=AUDIT), "text", out, err)
    assert err.getvalue().splitlines() == [f"coderun: {TOUCHED}", "coderun: run-a exit code 1 (NonZeroExit)"]
    err = io.StringIO()
    cli.print_result(_result(), "text", io.StringIO(), err)
    assert "touched" not in err.getvalue() and "audit" not in err.getvalue()


def test_the_tool_result_carries_the_audit_as_text_and_as_structured_content():
    result = _result(audit=AUDIT)
    assert TOUCHED in render_result(result).splitlines()
    structured = dump(run_output(result))
    assert structured["audit"]["connectAttempts"][0] == AUDIT["connectAttempts"][0]
    RunOutput.model_validate(structured)
    schema = output_schema(RunOutput)
    assert "audit" in schema["properties"] and "audit" not in schema.get("required", [])
    assert "audit" not in dump(run_output(_result()))
