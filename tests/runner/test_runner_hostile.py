"""Hostile programs against the real runner: its own limits, signals to PID 1, and what the program controls
in the frame (lengths, numbers, line separators)."""
from __future__ import annotations

import json
import textwrap

import pytest


def program(source: str) -> str:
    return textwrap.dedent(source).lstrip()


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM",
                                  "SIGPIPE"])
def test_signals_to_pid1_leave_the_runner_standing(run_runner, as_pid1, name):
    code = program(f"""
        import os, signal
        for _ in range(3):
            os.kill(1, signal.{name})
        print("still here")
    """)
    run = run_runner(code, wrapper=as_pid1)
    assert (run.frame["reason"], run.frame["exitCode"], run.frame["stdout"]) == ("Completed", 0, "still here\n")


def test_the_program_keeps_default_signal_dispositions(run_runner, as_pid1):
    # The runner's no-op handlers reset at exec: SIGTERM still ends the program (SIG_IGN would be inherited).
    run = run_runner("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n", wrapper=as_pid1)
    assert (run.frame["reason"], run.frame["signal"]) == ("Signaled", 15)


def test_filling_scratch_past_the_disk_limit_ends_the_run_promptly(run_runner):
    code = program("""
        import os
        with open("fill", "wb") as f:
            while True:
                f.write(b"x" * 65536)
                f.flush()
    """)
    run = run_runner(code, diskBytes=4 * 1024 * 1024, timeoutSeconds=20)
    assert run.frame["reason"] == "DiskLimitExceeded" and run.frame["limit"]["kind"] == "disk"
    assert run.frame["limit"]["limit"] == 4 * 1024 * 1024 and run.elapsed < 5


def test_many_small_files_count_against_the_inode_cap(run_runner):
    code = "import os\nfor i in range(100000):\n    open(f'f{i}', 'w').close()\n"
    run = run_runner(code, maxInodes=500, timeoutSeconds=20)
    assert run.frame["reason"] == "DiskLimitExceeded" and run.frame["limit"]["kind"] == "inodes"
    assert run.frame["limit"]["observed"] > 500 and run.elapsed < 10


def test_a_fork_bomb_meets_the_process_cap_and_nothing_survives(run_runner, as_pid1):
    code = program("""
        import os, time
        while True:
            try:
                os.fork()
            except OSError:
                time.sleep(0.01)
    """)
    run = run_runner(code, maxProcesses=40, timeoutSeconds=20, wrapper=as_pid1)
    assert run.frame["reason"] == "ProcessLimitExceeded" and run.frame["limit"]["limit"] == 40
    assert run.elapsed < 10  # the runner (PID 1) killed every process before it reported: it returned


def test_writing_the_termination_log_is_a_violation_and_the_runner_writes_last(run_runner):
    code = program("""
        import sys
        with open(sys.argv[0].replace("main.py", "") + "../../termination-log", "w") as log:
            log.write("x" * 100000)
        import time; time.sleep(5)
    """)
    run = run_runner(code, timeoutSeconds=10)
    assert run.frame["reason"] == "SandboxViolation" and run.frame["limit"]["kind"] == "termination-log"
    assert run.elapsed < 4
    assert set(run.termination) == {"v", "reason", "exitCode", "frameSha256"}  # only the runner's summary


def test_the_disk_limit_bounds_any_single_file(run_runner):
    # RLIMIT_FSIZE: the write fails at the limit even between two checks; the run still says why.
    code = "open('big', 'wb').write(b'x' * (64 * 1024 * 1024))\n"
    run = run_runner(code, diskBytes=1024 * 1024)
    assert run.frame["reason"] == "DiskLimitExceeded"
    assert (run.work / "big").stat().st_size <= 1024 * 1024 + 4096


def test_what_the_program_controls_is_capped_in_the_frame(run_runner):
    code = program("""
        import os
        os.makedirs(os.environ["CODERUN_OUTPUT_DIR"], exist_ok=True)
        name = "n" * 200
        path = os.path.join(os.environ["CODERUN_OUTPUT_DIR"], *([name] * 8))
        os.makedirs(os.path.dirname(path))
        open(path, "w").write("deep")
        raise type("E" * 400, (Exception,), {})("m" * 10000)
    """)
    run = run_runner(code)
    error = run.frame["error"]
    assert run.frame["reason"] == "NonZeroExit"
    assert len(error["type"]) == 256 and error["type"].endswith("\u2026") and len(error["message"]) == 4096
    names = [a["name"] for a in run.frame["artifacts"] + run.frame["artifactsSkipped"]]
    assert names and all(len(n) <= 1024 for n in names)


def test_a_line_number_beyond_any_integer_is_null_not_a_crash(run_runner):
    code = program("""
        import sys
        sys.stderr.write('Traceback (most recent call last):\\n  File "main.py", line ' + "9" * 5000 +
                         ', in <module>\\nValueError: forged\\n')
        sys.exit(1)
    """)
    run = run_runner(code)
    assert run.frame["reason"] == "NonZeroExit" and run.frame["error"] == {
        "type": "ValueError", "message": "forged", "line": None}


def test_line_separators_stay_inside_the_frame(run_runner):
    code = program("""
        import os, sys
        sep = "\\u2028\\u2029\\x85"
        print("out" + sep)
        print("err" + sep, file=sys.stderr)
        os.makedirs(os.environ["CODERUN_OUTPUT_DIR"], exist_ok=True)
        open(os.path.join(os.environ["CODERUN_OUTPUT_DIR"], "a" + sep), "w").write("x")
        raise ValueError("msg" + sep)
    """)
    run = run_runner(code)
    sep = "\u2028\u2029\x85"
    assert run.frame_json.isascii() and b"\n" not in run.frame_json
    assert run.frame["stdout"] == f"out{sep}\n" and run.frame["error"]["message"] == f"msg{sep}"
    assert [a["name"] for a in run.frame["artifacts"]] == [f"a{sep}"]
    assert json.loads(run.frame_json) == run.frame


def test_a_normal_run_reports_no_limit(run_runner):
    run = run_runner("print(1)\n", diskBytes=64 * 1024 * 1024)
    assert run.frame["reason"] == "Completed" and "limit" not in run.frame
    assert run.frame["artifactsSkippedUnlisted"] == 0


def test_the_program_yields_the_cpu_to_the_runner(run_runner):
    run = run_runner("import os\nprint(os.nice(0))\n")
    assert run.frame["stdout"] == "10\n"  # the runner stays at 0, so a fork bomb cannot starve its checks
