"""The CLI's decisions: exit codes, the summary line, --file mapping, reading inputs."""
import base64
import io
import json
import time

import pytest

from coderun import cli
from coderun.client.result import result_from_object


def _result(**status):
    return result_from_object({"metadata": {"name": "run-a", "namespace": "ns"}, "status": status})


@pytest.mark.parametrize("status,code", [
    ({"phase": "Succeeded", "reason": "Completed", "exitCode": 0}, 0),
    ({"phase": "Failed", "reason": "NonZeroExit", "exitCode": 7}, 7),
    ({"phase": "Rejected", "reason": "PolicyDenied", "policyRule": "runtimes"}, cli.EXIT_REJECTED),
    ({"phase": "Rejected", "reason": "InvalidSpec"}, cli.EXIT_REJECTED),
    ({"phase": "Failed", "reason": "Timeout", "signal": 9}, cli.EXIT_TIMEOUT),
    ({"phase": "Failed", "reason": "OOMKilled", "signal": 9}, cli.EXIT_OOM),
    ({"phase": "Failed", "reason": "OutputLimitExceeded"}, cli.EXIT_OUTPUT_LIMIT),
    ({"phase": "Failed", "reason": "Signaled", "signal": 15}, 143),
    ({"phase": "Failed", "reason": "PodDeleted"}, cli.EXIT_PLATFORM),
    ({"phase": "Failed", "reason": "InternalError"}, cli.EXIT_PLATFORM),
])
def test_exit_code_mirrors_the_run(status, code):
    assert cli.exit_code_for(_result(**status)) == code


def test_distinct_platform_codes_are_documented_in_help():
    help_text = cli.build_parser("coderun").format_help()
    for code in (cli.EXIT_REJECTED, cli.EXIT_PLATFORM, cli.EXIT_NOT_FINISHED, cli.EXIT_TIMEOUT, cli.EXIT_OOM):
        assert f"\n  {code} " in help_text
    assert len({cli.EXIT_NOT_FOUND, cli.EXIT_REJECTED, cli.EXIT_PLATFORM, cli.EXIT_NOT_FINISHED,
                cli.EXIT_OUTPUT_LIMIT, cli.EXIT_TIMEOUT, cli.EXIT_OOM, cli.EXIT_USAGE}) == 8


def test_summary_line_names_the_run_outcome_error_timings_and_truncation():
    line = cli.summary_line(_result(phase="Failed", reason="NonZeroExit", exitCode=1, stdout="ab", stdoutBytes=900,
                                    stdoutTruncated=True, error={"type": "KeyError", "message": "x", "line": 3},
                                    metrics={"wallMillis": 96, "totalMillis": 2230}))
    assert line == ("coderun: run-a exit code 1 (NonZeroExit) · KeyError at line 3 · wall 96ms · total 2.2s · "
                    "stdout truncated (2 of 900 bytes shown)")
    assert "\n" not in line


def test_file_args_map_to_sandbox_paths():
    assert cli.parse_file_arg("/tmp/x/data.csv") == ("data.csv", cli.Path("/tmp/x/data.csv"))
    assert cli.parse_file_arg("in/d.csv=../local.csv") == ("in/d.csv", cli.Path("../local.csv"))
    assert cli.parse_file_arg("../local.csv:in/d.csv") == ("in/d.csv", cli.Path("../local.csv"))


def test_labels_must_be_key_value():
    assert cli.parse_labels(["a=1", "b="]) == {"a": "1", "b": ""}
    with pytest.raises(cli.UsageError):
        cli.parse_labels(["nokey"])


def _run_args(**overrides):
    args = cli.build_parser("coderun").parse_args(["run", "placeholder"])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_build_request_reads_script_files_and_stdin(tmp_path):
    (tmp_path / "job.py").write_text("print(open('data.csv').read())")
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    (tmp_path / "blob.bin").write_bytes(b"\x89PNG\xff")
    (tmp_path / "in.txt").write_text("hello")
    request, uploads = cli.build_request(_run_args(script=str(tmp_path / "job.py"), timeout=3,
                                                   file=[str(tmp_path / "data.csv"), f"img/b.bin={tmp_path / 'blob.bin'}"],
                                                   stdin=str(tmp_path / "in.txt")))
    assert request.language == "python" and request.timeout == 3 and request.stdin == "hello" and uploads == []
    files = {f.path: f for f in request.files}
    assert files["data.csv"].content == "a,b\n1,2\n"
    assert base64.b64decode(files["img/b.bin"].content_base64) == b"\x89PNG\xff"


def test_build_request_refuses_what_it_cannot_do(tmp_path):
    with pytest.raises(cli.UsageError, match="cannot read file"):
        cli.build_request(_run_args(script=None, code="x", file=[str(tmp_path / "missing.csv")]))
    with pytest.raises(cli.UsageError, match="both come from standard input"):
        cli.build_request(_run_args(script="-", stdin="-"))
    with pytest.raises(cli.UsageError, match="give a script"):
        cli.build_request(_run_args(script=None))


def test_text_output_puts_stdout_first_and_stderr_plus_summary_on_stderr():
    out, err = io.StringIO(), io.StringIO()
    cli.print_result(_result(phase="Failed", reason="NonZeroExit", exitCode=7, stdout="42\n", stderr="warn"),
                     "text", out, err)
    assert out.getvalue() == "42\n"
    assert err.getvalue().splitlines() == ["warn", "coderun: run-a exit code 7 (NonZeroExit)"]


def test_json_output_is_the_camel_case_result():
    out = io.StringIO()
    cli.print_result(_result(phase="Succeeded", reason="Completed", exitCode=0, stdoutBytes=3), "json", out,
                     io.StringIO())
    document = json.loads(out.getvalue())
    assert document["stdoutBytes"] == 3 and document["name"] == "run-a" and document["exitCode"] == 0


def test_progress_stays_silent_when_stderr_is_not_a_terminal():
    stream = io.StringIO()
    with cli.Progress(stream, "run-a") as progress:
        progress.update(_result(phase="Running"))
    assert stream.getvalue() == "" and progress.phase == "Running"
    progress.update(_result(phase="Pending", upload={"url": "http://x", "token": "t", "expires": "2026-12-01T00:00:00Z"}))
    assert progress.phase == "Pending, uploading inputs"


def test_bad_limits_exit_with_usage_and_a_one_line_message(capsys, monkeypatch):
    monkeypatch.setattr(cli, "CodeRunClient", lambda *a, **k: pytest.fail("no client for a usage error"))
    assert cli.main(["run", "-c", "print(1)", "--memory", "4 Gi"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("usage: coderun run ")
    assert err[-1].startswith("coderun run: error: invalid input: memory: String should match pattern")


def test_progress_shows_the_phase_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    with cli.Progress(stream, "run-a") as progress:
        progress.update(_result(phase="Running"))
        deadline = time.monotonic() + 5
        while "run-a Running" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)  # polling a predicate with a deadline
    assert "run-a Running" in stream.getvalue()
    assert stream.getvalue().endswith("\r\033[K")  # the line is cleared before the output is printed


def test_mcp_takes_a_progress_interval_as_a_duration():
    parser = cli.build_parser("coderun")
    assert parser.parse_args(["mcp"]).progress_interval == 10
    assert parser.parse_args(["mcp", "--progress-interval", "2s"]).progress_interval == 2.0
    with pytest.raises(SystemExit):
        parser.parse_args(["mcp", "--progress-interval", "0"])
