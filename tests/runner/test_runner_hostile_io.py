"""Hostile programs against the runner's plumbing: its stdout and stderr pipes, bytes that are not text, the
outputs dir, and signals. Each asserts what the frame says and that it is still the runner's frame."""
from __future__ import annotations

import base64
import json
import signal
import textwrap

import pytest

from coderun.sandbox.runner.artifacts import MAX_SKIPPED_LISTED
from coderun.sandbox.runner.inputs import DEFAULT_ARTIFACT_CAPS
from coderun.sandbox.runner.main import SHIELDED_SIGNALS
from support.runner import sha256_hex

SHIELDED = ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGPIPE"]


def program(source: str) -> str:
    return textwrap.dedent(source).lstrip()


def assert_runners_frame(run) -> None:
    """One frame line, ASCII, and the termination log's digest is over exactly the bytes printed."""
    assert run.returncode == 0
    assert run.raw_stdout.count(b"\nCODERUN-RESULT-V1 ") == 1
    assert run.raw_stdout.endswith(b"\nCODERUN-RESULT-V1 " + run.frame_json + b"\n")
    assert run.frame_json.isascii()
    assert run.termination["frameSha256"] == sha256_hex(run.frame_json)
    assert run.termination["reason"] == run.frame["reason"]


# ------------------------------------------------------------------ signals


def test_the_shielded_signals_are_exported():
    assert list(SHIELDED_SIGNALS) == SHIELDED


@pytest.mark.parametrize("name", SHIELDED)
def test_the_program_gets_default_dispositions_for_the_shielded_signals(run_runner, name):
    # A shell keeps the dispositions it was exec'ed with: killed by its own signal, unless the runner had passed
    # SIG_IGN on (Python itself ignores SIGPIPE, so a python program could not tell).
    run = run_runner(f"kill -{name[3:]} $$\necho survived\n", language="shell", command=["sh", "main.py"])
    assert_runners_frame(run)
    assert (run.frame["reason"], run.frame["signal"], run.frame["stdout"]) == (
        "Signaled", getattr(signal, name), ""), run.frame


def test_a_signal_flood_at_pid1_does_not_disturb_the_run(run_runner, as_pid1):
    code = program("""
        import os, signal, time
        if os.fork() == 0:
            while True:
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGPIPE, signal.SIGALRM):
                    os.kill(1, sig)
        time.sleep(0.5)
        print("done")
    """)
    run = run_runner(code, wrapper=as_pid1)
    assert_runners_frame(run)
    assert (run.frame["reason"], run.frame["stdout"]) == ("Completed", "done\n")


def test_a_program_that_stops_itself_still_times_out(run_runner):
    run = run_runner("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n", timeoutSeconds=1)
    assert (run.frame["reason"], run.frame["signal"]) == ("Timeout", signal.SIGKILL)
    assert run.elapsed < 4


# ------------------------------------------------------------------ stdout and stderr


def test_closing_stdout_and_stderr_does_not_end_the_run(run_runner):
    code = program("""
        import os, sys, time
        print("before", flush=True)
        os.close(1)
        os.close(2)
        time.sleep(0.3)  # the runner sees both pipes at EOF long before the program ends
        open("finished", "w").write("yes")
        os._exit(3)
    """)
    run = run_runner(code)
    assert_runners_frame(run)
    assert (run.frame["reason"], run.frame["exitCode"], run.frame["stdout"]) == ("NonZeroExit", 3, "before\n")
    assert (run.work / "finished").read_text() == "yes"


def test_stderr_duplicated_onto_stdout_is_captured_as_stdout(run_runner):
    code = program("""
        import os, sys
        os.dup2(1, 2)
        for fd in range(3, 40):
            os.dup2(1, fd)  # many copies of the pipe: all must be closed before the runner sees EOF
        os.write(2, b"to stderr\\n")
        os.write(39, b"to fd 39\\n")
    """)
    run = run_runner(code)
    assert_runners_frame(run)
    assert (run.frame["stdout"], run.frame["stderr"]) == ("to stderr\nto fd 39\n", "")


def test_nul_and_invalid_utf8_everywhere_keep_the_frame_valid(run_runner):
    code = program("""
        import os, sys
        sys.stdout.buffer.write(b"a\\x00b\\xff\\xfec\\n")
        sys.stderr.buffer.write(b"e\\x00\\xc3(\\n")
        sys.stderr.flush()
        out = os.environb[b"CODERUN_OUTPUT_DIR"]
        open(os.path.join(out, b"n\\xffame\\x01"), "wb").write(b"\\x00\\xff")
        raise ValueError("m\\x00sg \\udcff")
    """)
    run = run_runner(code)
    assert_runners_frame(run)
    frame = run.frame
    assert frame["stdout"] == "a\x00b\ufffd\ufffdc\n" and frame["stderr"].startswith("e\x00\ufffd(\n")
    assert frame["stdoutSha256"] == sha256_hex(b"a\x00b\xff\xfec\n")
    assert frame["error"]["type"] == "ValueError" and frame["error"]["message"].startswith("m\x00sg")
    assert [(a["name"], base64.b64decode(a["contentBase64"])) for a in frame["artifacts"]] == [
        ("n\ufffdame\x01", b"\x00\xff")]
    assert b"\\u0000" in run.frame_json
    # Strict JSON everywhere: no lone surrogate can reach the frame.
    json.loads(run.frame_json.decode("ascii"), parse_constant=pytest.fail)
    run.frame_json.decode("ascii").encode("utf-8")


def test_a_normal_frame_has_exactly_the_known_fields(run_runner):
    run = run_runner("print(1)\n", diskBytes=64 * 1024 * 1024)
    assert_runners_frame(run)
    assert set(run.frame) == {
        "version", "reason", "message", "exitCode", "signal", "oomKilled", "stdout", "stderr", "stdoutBytes",
        "stderrBytes", "stdoutTruncated", "stderrTruncated", "stdoutSha256", "stderrSha256", "error", "metrics",
        "artifacts", "artifactsSkipped", "artifactsSkippedUnlisted", "startedAtMillis"}
    assert (run.frame["message"], run.frame["artifactsSkippedUnlisted"]) == ("", 0)


# ------------------------------------------------------------------ the outputs dir


def test_symlinks_anywhere_in_the_outputs_dir_are_never_followed(run_runner, tmp_path):
    code = program(f"""
        import os
        out = os.environ["CODERUN_OUTPUT_DIR"]
        os.makedirs(os.path.join(out, "sub", "deeper"))
        os.symlink("/", os.path.join(out, "sub", "root"))
        os.symlink("loop", os.path.join(out, "sub", "loop"))
        os.symlink("/nonexistent", os.path.join(out, "dangling"))
        os.symlink({str(tmp_path / "termination-log")!r}, os.path.join(out, "sub", "deeper", "log"))
        os.symlink("../real.txt", os.path.join(out, "sub", "inside"))
        open(os.path.join(out, "real.txt"), "w").write("mine")
    """)
    run = run_runner(code)
    assert_runners_frame(run)
    assert [a["name"] for a in run.frame["artifacts"]] == ["real.txt"]
    assert sorted((s["name"], s["why"]) for s in run.frame["artifactsSkipped"]) == [
        ("dangling", "symlink"), ("sub/deeper/log", "symlink"), ("sub/inside", "symlink"),
        ("sub/loop", "symlink"), ("sub/root", "symlink")]


def test_thousands_of_small_output_files_give_a_bounded_frame(run_runner):
    code = program("""
        import os
        out = os.environ["CODERUN_OUTPUT_DIR"]
        for d in range(50):
            os.mkdir(os.path.join(out, f"d{d:02}"))
            for i in range(100):
                open(os.path.join(out, f"d{d:02}", f"f{i:03}"), "w").write("x")
    """)
    run = run_runner(code, timeoutSeconds=30)
    assert_runners_frame(run)
    frame = run.frame
    kept = DEFAULT_ARTIFACT_CAPS["maxFiles"]
    assert frame["reason"] == "Completed"
    assert [a["name"] for a in frame["artifacts"]] == [f"d00/f{i:03}" for i in range(kept)]
    assert len(frame["artifactsSkipped"]) == MAX_SKIPPED_LISTED
    assert {s["why"] for s in frame["artifactsSkipped"]} == {"too-many"}
    assert frame["artifactsSkippedUnlisted"] == 5000 - kept - MAX_SKIPPED_LISTED
    assert len(run.frame_json) < 20000
