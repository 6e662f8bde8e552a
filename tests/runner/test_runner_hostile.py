"""Hostile programs against the real runner: its own limits, signals to PID 1, and what the program controls
in the frame (lengths, numbers, line separators)."""
from __future__ import annotations

import hashlib
import json
import resource
import textwrap
import time

import pytest

from coderun.sandbox.runner.limits import scratch_usage
from support.runner import assert_nothing_after_the_frame


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


@pytest.mark.parametrize("where", ["../fill", "../home/fill", "fill"], ids=["scratch", "home", "work"])
def test_filling_scratch_past_the_disk_limit_ends_the_run_promptly(run_runner, where):
    # Files below the single-file limit, written forever (errors ignored): only the runner's walk can stop it.
    # The program says when it has passed the limit; the runner's termination log is written after the kill.
    code = program(f"""
        import itertools, time
        for i in itertools.count():
            try:
                with open("{where}" + str(i), "wb") as f:
                    f.write(b"x" * 262144)
            except OSError:
                time.sleep(0.01)
            if i == 16:  # 17 files of 256 KiB: past 4 MiB
                print(time.time(), flush=True)
    """)
    run = run_runner(code, diskBytes=4 * 1024 * 1024, timeoutSeconds=20)
    assert (run.frame["reason"], run.frame["signal"]) == ("DiskLimitExceeded", 9), run.frame
    assert run.frame["limit"]["kind"] == "disk" and run.frame["limit"]["limit"] == 4 * 1024 * 1024
    assert run.frame["limit"]["observed"] > 4 * 1024 * 1024
    assert run.termination_log.stat().st_mtime - float(run.frame["stdout"]) < 2.0


def test_the_walk_of_a_big_tree_backs_off(run_runner):
    # 15000 entries (under the default inode cap) and a byte limit: a walk costs tens of ms, so one every 0.2 s
    # would take about a fifth of a core; the runner paces them to about 1/20 of its CPU time.
    code = program("""
        import os, time
        for d in range(30):
            os.mkdir(f"../t{d}")
            for i in range(500):
                open(f"../t{d}/f{i}", "w").close()
        time.sleep(5)
    """)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = run_runner(code, diskBytes=1 << 30, timeoutSeconds=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert run.frame["reason"] == "Completed", run.frame
    # Everything the runner reaped is in cpuMillis; the rest of what this test reaped is the runner's own CPU.
    runner_cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
                  - run.frame["metrics"]["cpuMillis"] / 1000)
    walk = time.process_time()
    assert scratch_usage(str(run.work.parent), 16384)[1] > 15000
    walk = time.process_time() - walk
    # Start-up, the final walk and the artifacts cost a fixed amount; the checks at most ~1/20 of the run.
    assert runner_cpu < 0.3 + 3 * walk + 0.08 * run.frame["metrics"]["wallMillis"] / 1000, (runner_cpu, walk)


def test_many_small_files_count_against_the_inode_cap(run_runner):
    code = program("""
        import itertools, os
        for i in itertools.count():  # directories in /tmp and files in the work dir: both are inodes
            os.mkdir(f"../d{i}") if i % 2 else open(f"f{i}", "w").close()
    """)
    run = run_runner(code, maxInodes=500, timeoutSeconds=20)
    assert (run.frame["reason"], run.frame["signal"]) == ("DiskLimitExceeded", 9), run.frame
    assert run.frame["limit"]["kind"] == "inodes" and run.frame["limit"]["limit"] == 500
    assert run.frame["limit"]["observed"] > 500
    assert run.frame["metrics"]["wallMillis"] < 2000 and run.elapsed < 4


def test_a_fork_bomb_meets_the_process_cap_and_nothing_survives(run_runner, as_pid1):
    # Every process of the bomb keeps writing to the runner's own stdout (it is PID 1): nothing may write after
    # the frame, so every one of them was dead before the runner reported (the kernel's own teardown of the
    # PID namespace only comes after the runner has exited).
    code = program("""
        import os, time
        try:
            runner_stdout = os.open("/proc/1/fd/1", os.O_WRONLY)
        except OSError:  # PID 1 of the program's own namespace is not the runner: its own stdout, then
            runner_stdout = 1
        while True:
            try:
                os.fork()
            except OSError:
                pass
            os.write(runner_stdout, b"LATE\\n")
            time.sleep(0.005)
    """)
    run = run_runner(code, maxProcesses=40, timeoutSeconds=20, wrapper=as_pid1)
    assert run.frame["reason"] == "ProcessLimitExceeded", run.frame
    assert run.frame["limit"]["kind"] == "processes" and run.frame["limit"]["limit"] == 40
    assert run.frame["limit"]["observed"] >= 40 and run.elapsed < 10
    assert "LATE" in run.frame["stdout"]
    assert_nothing_after_the_frame(run)


@pytest.mark.parametrize("then", ["import time; time.sleep(5)", "pass"], ids=["keeps-running", "exits-at-once"])
def test_writing_the_termination_log_is_a_violation_and_the_runner_writes_last(run_runner, then):
    code = program(f"""
        import os
        with open(os.path.join(os.getcwd(), "../../termination-log"), "w") as log:
            log.write("x" * 100000)
        {then}
    """)
    run = run_runner(code, timeoutSeconds=10)
    assert run.frame["reason"] == "SandboxViolation", run.frame
    assert run.frame["limit"] == {"kind": "termination-log", "limit": 0, "observed": 100000}
    assert run.elapsed < 4
    # Only the runner's summary, byte for byte: the program's 100000 bytes are gone.
    assert run.termination_log.read_bytes() == json.dumps(
        {"v": 1, "reason": "SandboxViolation", "exitCode": run.frame["exitCode"],
         "frameSha256": hashlib.sha256(run.frame_json).hexdigest()}, separators=(",", ":")).encode()


def test_the_disk_limit_bounds_any_single_file(run_runner):
    # RLIMIT_FSIZE: the write fails at the limit even between two checks; the run still says why.
    code = "open('big', 'wb').write(b'x' * (64 * 1024 * 1024))\n"
    run = run_runner(code, diskBytes=1024 * 1024)
    assert run.frame["reason"] == "DiskLimitExceeded"
    assert (run.work / "big").stat().st_size == 1024 * 1024  # cut at the limit, not past it


def test_what_the_program_controls_is_capped_in_the_frame(run_runner):
    code = program("""
        import os
        os.makedirs(os.environ["CODERUN_OUTPUT_DIR"], exist_ok=True)
        name = "n" * 200
        path = os.path.join(os.environ["CODERUN_OUTPUT_DIR"], *([name] * 12))
        os.makedirs(os.path.dirname(path))
        open(path, "w").write("deep")
        raise type("E" * 2000, (Exception,), {})("m" * 10000)
    """)
    run = run_runner(code)
    error = run.frame["error"]
    assert run.frame["reason"] == "NonZeroExit"
    # The status's caps (256, 4096, 1024) plus the 1024-character margin the operator redacts before cutting.
    assert len(error["type"]) == 1280 and error["type"].endswith("\u2026") and len(error["message"]) == 5120
    names = [a["name"] for a in run.frame["artifacts"] + run.frame["artifactsSkipped"]]
    assert names and all(len(n) <= 2048 for n in names)
    deep = "/".join(["n" * 200] * 12)
    assert [a["name"] for a in run.frame["artifacts"]] == [deep[:2047] + "\u2026"]


def test_a_skipped_entry_name_is_capped_too(run_runner):
    code = program("""
        import os
        out = os.environ["CODERUN_OUTPUT_DIR"]
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, *(["s" * 250] * 10))
        os.makedirs(os.path.dirname(path))
        os.symlink("/etc/passwd", path)
    """)
    run = run_runner(code)
    assert run.frame["artifacts"] == []
    [skipped] = run.frame["artifactsSkipped"]
    assert skipped["why"] == "symlink" and len(skipped["name"]) == 2048
    assert skipped["name"] == "/".join(["s" * 250] * 10)[:2047] + "\u2026"


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


@pytest.mark.parametrize("digits, line", [
    ("99999999999999999999999", None), ("0", None), (str(2**31), None), (str(2**31 - 1), 2**31 - 1),
    ("0012", 12),
])
def test_a_forged_line_number_outside_1_to_2_31_is_null(run_runner, digits, line):
    code = ("import sys\nsys.stderr.write('Traceback (most recent call last):\\n  File \"main.py\", line "
            + digits + ", in <module>\\nValueError: forged\\n')\nsys.exit(1)\n")
    run = run_runner(code)
    assert run.frame["error"] == {"type": "ValueError", "message": "forged", "line": line}, run.frame


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
    assert run.frame_json.isascii() and b"\n" not in run.frame_json and b"\r" not in run.frame_json
    for raw in (s.encode() for s in sep):  # not even as UTF-8 bytes: the frame line is ASCII
        assert raw not in run.raw_stdout.rsplit(b"\nCODERUN-RESULT-V1 ", 1)[1]
    assert run.raw_stdout.endswith(b"\nCODERUN-RESULT-V1 " + run.frame_json + b"\n")
    assert run.termination["frameSha256"] == hashlib.sha256(run.frame_json).hexdigest()
    assert run.frame["stdout"] == f"out{sep}\n" and run.frame["error"]["message"] == f"msg{sep}"
    assert run.frame["stderr"].startswith(f"err{sep}\n")
    assert [a["name"] for a in run.frame["artifacts"]] == [f"a{sep}"]
    assert json.loads(run.frame_json) == run.frame


def test_a_normal_run_reports_no_limit(run_runner):
    run = run_runner("print(1)\n", diskBytes=64 * 1024 * 1024)
    assert run.frame["reason"] == "Completed" and "limit" not in run.frame
    assert run.frame["artifactsSkippedUnlisted"] == 0


def test_the_program_yields_the_cpu_to_the_runner(run_runner):
    run = run_runner("import os\nprint(os.nice(0))\n")
    assert run.frame["stdout"] == "10\n"  # the runner stays at 0, so a fork bomb cannot starve its checks
