"""The real runner as a subprocess on real programs (runner tier)."""

from __future__ import annotations

import base64
import json
import os
import signal
import textwrap
import time

import pytest

from coderun.sandbox.runner.artifacts import MAX_SKIPPED_LISTED
from support.runner import process_alive, runner_in, sha256_hex, wait_until

EMPTY_SHA256 = sha256_hex(b"")


def program(source: str) -> str:
    return textwrap.dedent(source).lstrip()


def assert_well_formed(run) -> None:
    """Every run: exit 0, one frame line, digest matches the termination log."""
    assert run.returncode == 0
    assert run.termination["v"] == 1
    assert run.termination["frameSha256"] == sha256_hex(run.frame_json)
    assert run.termination["reason"] == run.frame["reason"]
    assert run.termination["exitCode"] == run.frame["exitCode"]
    assert len(run.termination_log.read_bytes()) < 4096
    assert run.raw_stdout.endswith(b"\n")
    assert run.raw_stdout.count(b"\nCODERUN-RESULT-V1 ") == 1


# ------------------------------------------------------------------ outcomes

OUTCOMES = [
    pytest.param(
        "print(6 * 7)\n", {},
        {"reason": "Completed", "exitCode": 0, "signal": None, "stdout": "42\n", "stderr": "", "error": None},
        id="success"),
    pytest.param(
        "import sys\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n", {},
        {"reason": "NonZeroExit", "exitCode": 3, "stderr": "to stderr\n", "error": None},
        id="non-zero-exit-keeps-stderr"),
    pytest.param(
        "x = 1\ny = 0\nprint(x / y)\n", {},
        {"reason": "NonZeroExit", "exitCode": 1,
         "error": {"type": "ZeroDivisionError", "message": "division by zero", "line": 3}},
        id="exception-parsed"),
    pytest.param(
        "import json\n\n\ndef load():\n    return json.loads('nope')\n\n\nload()\n", {},
        {"reason": "NonZeroExit",
         "error": {"type": "json.decoder.JSONDecodeError", "message": "Expecting value: line 1 column 1 (char 0)",
                   "line": 5}},
        id="dotted-exception-type"),
    pytest.param(
        "print('fine')\nprint('broken'\n", {},
        {"reason": "NonZeroExit", "exitCode": 1, "stdout": "",
         "error": {"type": "SyntaxError", "message": "'(' was never closed", "line": 2}},
        id="syntax-error"),
    pytest.param(
        "if True:\nprint(1)\n", {},
        {"reason": "NonZeroExit", "error": {"type": "IndentationError",
                                             "message": "expected an indented block after 'if' statement on line 1",
                                             "line": 2}},
        id="indentation-error"),
    pytest.param(
        "try:\n    {}['k']\nexcept KeyError:\n    raise ValueError('bad\\nsecond line')\n", {},
        {"reason": "NonZeroExit", "error": {"type": "ValueError", "message": "bad", "line": 4}},
        id="chained-multiline-last-wins"),
    pytest.param(
        "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n", {},
        {"reason": "Signaled", "exitCode": None, "signal": signal.SIGTERM, "oomKilled": False},
        id="killed-by-own-signal"),
    pytest.param(
        "print(1)\n", {"command": ["no-such-interpreter-xyz", "main.py"]},
        {"reason": "RunnerError", "exitCode": None},
        id="missing-interpreter-is-runner-error"),
    pytest.param(
        "import os\nprint(os.environ['GREETING'], os.environ['PATH'], os.environ['HOME'].endswith('/home'))\n",
        {"env": {"GREETING": "hi"}},
        {"reason": "Completed", "stdout": "hi /usr/local/bin:/usr/bin:/bin True\n"},
        id="run-json-env-and-fixed-path"),
]


@pytest.mark.parametrize("code, spec, expected", OUTCOMES)
def test_outcome(run_runner, code, spec, expected):
    run = run_runner(code, **spec)
    assert_well_formed(run)
    for field, value in expected.items():
        assert run.frame[field] == value, (field, run.frame)
    # The operator writes the words; the frame carries facts, and details only when the runner itself failed.
    assert bool(run.frame["message"]) == (run.frame["reason"] in ("RunnerError", "InvalidInput"))


def test_non_zero_exit_reports_the_error_as_data(run_runner):
    run = run_runner("x = 1\ny = 0\nprint(x / y)\n")
    assert run.frame["error"] == {"type": "ZeroDivisionError", "message": "division by zero", "line": 3}


def test_a_handled_traceback_of_a_successful_run_is_no_error(run_runner, tmp_path):
    code = ("import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    traceback.print_exc()\n"
            "print('recovered')\n")
    run = run_runner(code)
    assert (run.frame["reason"], run.frame["exitCode"], run.frame["stdout"]) == ("Completed", 0, "recovered\n")
    assert "ZeroDivisionError" in run.frame["stderr"] and run.frame["error"] is None
    # The same report from a program that then fails is its error.
    run = runner_in(tmp_path / "failing")(code + "raise SystemExit(2)\n")
    assert run.frame["reason"] == "NonZeroExit" and run.frame["error"]["type"] == "ZeroDivisionError"


def test_runner_environment_does_not_leak_into_the_program(run_runner):
    run = run_runner("import os\nprint(sorted(os.environ))\n",
                     runner_env={"CODERUN_TEST_SECRET": "hunter2", "KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    names = json.loads(run.frame["stdout"].replace("'", '"'))
    assert "CODERUN_TEST_SECRET" not in names and "KUBERNETES_SERVICE_HOST" not in names
    assert {"PATH", "HOME", "TMPDIR", "LANG", "MPLBACKEND", "MPLCONFIGDIR", "CODERUN_OUTPUT_DIR"} <= set(names)


def test_the_runner_imports_nothing_from_its_working_directory_or_pythonpath(run_runner, tmp_path):
    # `python3 -I <dir>`, as in the images: a json.py in the cwd or on PYTHONPATH is not the runner's json.
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "json.py").write_text("raise SystemExit('the runner imported a json.py it was handed')\n")
    run = run_runner("import os\nprint(os.environ.get('PYTHONPATH'))\n", runner_env={"PYTHONPATH": str(shadow)},
                     cwd=shadow)
    assert (run.frame["reason"], run.frame["stdout"]) == ("Completed", "None\n"), run.frame  # nor the program's


def test_program_runs_in_the_work_dir_with_its_own_session(run_runner):
    run = run_runner("import os\nprint(os.getcwd())\nprint(os.getsid(0) == os.getpid())\n")
    cwd, own_session = run.frame["stdout"].splitlines()
    assert os.path.realpath(cwd) == os.path.realpath(run.work)
    assert own_session == "True"


# ------------------------------------------------------------------ time limit and escaped processes

def test_infinite_loop_times_out(run_runner):
    run = run_runner("while True:\n    pass\n", timeoutSeconds=1.0)
    assert_well_formed(run)
    assert run.frame["reason"] == "Timeout"
    assert run.frame["signal"] == signal.SIGKILL and run.frame["exitCode"] is None
    assert run.elapsed < 1.0 + 2.0
    assert 900 <= run.frame["metrics"]["wallMillis"] < 2500


def test_as_pid1_a_program_ended_at_its_timeout_keeps_its_cpu(tmp_path, as_pid1):
    """The namespace's init dies with the program it would have reaped (and auto-reaps it as it dies), so its CPU is
    read when it is killed: before, such a run showed 1-6 ms about half the time. (Its share of a busy machine's
    CPU in its second is not known here.)"""
    for attempt in range(3):
        (tmp_path / str(attempt)).mkdir()
        run = runner_in(tmp_path / str(attempt))("while True:\n    pass\n", timeoutSeconds=1.0, wrapper=as_pid1)
        assert run.frame["reason"] == "Timeout" and run.frame["metrics"]["cpuMillis"] >= 50, run.frame["metrics"]


ESCAPING_GRANDCHILD = """
import os, sys, time
if os.fork() == 0:
    os.setsid()  # leaves the process group the runner kills
    with open("grandchild.pid", "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(60)  # still holding the inherited stdout/stderr pipes
    os._exit(0)
while not os.path.exists("grandchild.pid"):
    time.sleep(0.01)
print("parent done", flush=True)
{parent_tail}
"""


@pytest.mark.parametrize("parent_tail, reason", [
    pytest.param("", "Completed", id="parent-exits"),
    pytest.param("while True:\n    pass", "Timeout", id="parent-loops"),
])
def test_setsid_grandchild_holding_the_pipes_does_not_keep_the_runner_alive(run_runner, parent_tail, reason):
    run = run_runner(program(ESCAPING_GRANDCHILD.format(parent_tail=parent_tail)), timeoutSeconds=1.5)
    grandchild = int((run.work / "grandchild.pid").read_text())
    try:
        # On a host the runner is not PID 1, so it must leave the escaped
        # grandchild alone; it is alive and still holds the pipes, which
        # proves the runner stopped waiting for them.
        assert process_alive(grandchild)
        assert run.frame["reason"] == reason
        assert run.frame["stdout"] == "parent done\n"
        assert run.elapsed < 1.5 + 2.0
    finally:
        os.kill(grandchild, signal.SIGKILL)


LATE_WRITER = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    try:
        runner_stdout = open("/proc/1/fd/1", "w")  # PID 1 of the program's namespace is not the runner
    except OSError as exc:
        open("writer.txt", "w").write(f"refused {{type(exc).__name__}}")
        os._exit(0)
    open("writer.txt", "w").write("opened")
    while True:
        runner_stdout.write("LATE\\n")
        runner_stdout.flush()
        time.sleep(0.002)
time.sleep(0.3)
print("parent done", flush=True)
{parent_tail}
"""


@pytest.mark.parametrize("parent_tail, reason, exit_code, signal_number", [
    pytest.param("", "Completed", 0, None, id="parent-exits"),
    pytest.param("sys.exit(3)", "NonZeroExit", 3, None, id="parent-fails"),
    pytest.param("while True:\n    pass", "Timeout", None, signal.SIGKILL, id="parent-loops"),
])
def test_as_pid1_an_escaped_process_cannot_reach_the_runners_stdout(run_runner, as_pid1, parent_tail, reason,
                                                                    exit_code, signal_number):
    """The program lives in a PID namespace of its own, so /proc/1 is its own init (ours, not dumpable), never
    the runner, and nothing it leaves behind can write into or after the frame."""
    run = run_runner(program(LATE_WRITER.format(parent_tail=parent_tail)), timeoutSeconds=1.5, wrapper=as_pid1)
    assert_well_formed(run)
    assert (run.frame["reason"], run.frame["exitCode"], run.frame["signal"]) == (reason, exit_code, signal_number)
    assert run.frame["stdout"] == "parent done\n"
    assert (run.work / "writer.txt").read_text().startswith("refused")
    assert b"LATE" not in run.raw_stdout
    assert run.elapsed < 1.5 + 2.0


def test_processes_left_in_the_program_group_are_killed(run_runner):
    code = program("""
        import subprocess
        background = subprocess.Popen(["sleep", "60"])
        print(background.pid)
    """)
    run = run_runner(code)
    sleeper = int(run.frame["stdout"])
    assert run.frame["reason"] == "Completed"
    assert wait_until(lambda: not process_alive(sleeper))


# ------------------------------------------------------------------ output caps

def test_stdout_flood_is_stopped_quickly_and_reported(run_runner):
    code = program("""
        import sys
        chunk = b"x" * 65536
        for _ in range(800):  # 50 MiB
            sys.stdout.buffer.write(chunk)
        print("never reached", file=sys.stderr)
    """)
    run = run_runner(code, outputBytes=4096, floodBytes=1048576, timeoutSeconds=30)
    assert_well_formed(run)
    frame = run.frame
    assert frame["reason"] == "OutputLimitExceeded"
    assert frame["stdoutTruncated"] is True and frame["stdout"] == "x" * 4096
    assert 1048576 < frame["stdoutBytes"] < 1048576 + 4 * 65536
    assert frame["stderr"] == ""
    assert run.elapsed < 5
    assert len(run.raw_stdout) < 20000


def test_stderr_counts_towards_the_flood_limit(run_runner):
    code = "import sys\nfor _ in range(100):\n    sys.stderr.write('e' * 20000)\n"
    run = run_runner(code, outputBytes=100, floodBytes=500000)
    assert run.frame["reason"] == "OutputLimitExceeded"
    assert run.frame["stderrTruncated"] is True and run.frame["stderrBytes"] > 500000


def test_truncated_stream_reports_full_size_and_hash(run_runner):
    run = run_runner("print('abcdefghij' * 10, end='')\n", outputBytes=25)
    frame = run.frame
    assert frame["reason"] == "Completed"
    assert frame["stdout"] == ("abcdefghij" * 10)[:25]
    assert frame["stdoutBytes"] == 100 and frame["stdoutTruncated"] is True
    assert frame["stdoutSha256"] == sha256_hex(b"abcdefghij" * 10)
    assert frame["stderrSha256"] == EMPTY_SHA256


def test_traceback_after_a_long_stderr_is_still_parsed(run_runner):
    code = "import sys\nsys.stderr.write('w' * 100000 + '\\n')\nraise KeyError('late')\n"
    run = run_runner(code, outputBytes=1000)
    assert run.frame["stderrTruncated"] is True
    assert run.frame["error"] == {"type": "KeyError", "message": "'late'", "line": 3}


@pytest.mark.parametrize("code, output_bytes, stdout", [
    pytest.param(r"import sys; sys.stdout.buffer.write(b'ok \xff\xfe bad\n')", 65536, "ok \ufffd\ufffd bad\n",
                 id="invalid-utf8-replaced"),
    pytest.param("print('a\u00e9\u20ac', end='')", 4, "a\u00e9", id="cut-character-dropped-at-cap"),
    pytest.param("print('a\u00e9\u20ac', end='')", 6, "a\u00e9\u20ac", id="whole-characters-kept"),
])
def test_output_decoding(run_runner, code, output_bytes, stdout):
    run = run_runner(code, outputBytes=output_bytes)
    assert_well_formed(run)
    assert run.frame["stdout"] == stdout


# ------------------------------------------------------------------ inputs

def test_stdin_and_files_reach_the_program(run_runner):
    binary = bytes(range(256))
    code = program("""
        import hashlib, sys
        print(sys.stdin.read().upper())
        print(open("data/x.csv").read().strip())
        print(hashlib.sha256(open("deep/er/blob.bin", "rb").read()).hexdigest())
    """)
    run = run_runner(code, stdin=b"hello stdin", input_files={"data/x.csv": b"a,b\n1,2\n", "deep/er/blob.bin": binary})
    assert run.frame["reason"] == "Completed", run.frame
    assert run.frame["stdout"].splitlines() == ["HELLO STDIN", "a,b", "1,2", sha256_hex(binary)]


def test_without_stdin_the_program_reads_eof(run_runner):
    run = run_runner("import sys\nprint(repr(sys.stdin.read()))\n")
    assert run.frame["stdout"] == "''\n"


@pytest.mark.parametrize("spec, says", [
    pytest.param({"files": [{"path": "../escape.txt", "key": "file-0"}]}, "'..'", id="dotdot"),
    pytest.param({"files": [{"path": "a/../../escape.txt", "key": "file-0"}]}, "'..'", id="nested-dotdot"),
    pytest.param({"files": [{"path": "/tmp/escape.txt", "key": "file-0"}]}, "absolute", id="absolute"),
    pytest.param({"files": [{"path": "ok.txt", "key": "../run.json"}]}, "ConfigMap key", id="key-outside-input"),
    pytest.param({"files": [{"path": "ok.txt", "key": "missing-key"}]}, "missing", id="missing-key"),
    pytest.param({"files": [{"path": "main.py", "key": "file-0"}]}, "used twice", id="overwrites-code"),
    pytest.param({"files": [{"path": "a", "key": "file-0"}, {"path": "a/b", "key": "file-0"}]}, "cannot create",
                 id="file-used-as-dir"),
    pytest.param({"codeFile": "../main.py"}, "'..'", id="code-file-dotdot"),
    pytest.param({"command": []}, "command", id="empty-command"),
    pytest.param({"version": 2}, "version", id="unknown-version"),
    pytest.param({"timeoutSeconds": -1}, "timeoutSeconds", id="negative-timeout"),
    pytest.param({"env": {"A=B": "c"}}, "env", id="bad-env-name"),
])
def test_invalid_input_is_refused_before_running(run_runner, tmp_path, spec, says):
    run = run_runner("open('ran.txt', 'w')\nprint('ran')\n", input_files={"ignored": b"x"}, **spec)
    assert_well_formed(run)
    assert run.frame["reason"] == "InvalidInput", run.frame
    assert says in run.frame["message"]
    assert run.frame["stdout"] == "" and run.frame["exitCode"] is None
    assert not (run.work / "ran.txt").exists()
    assert not list(tmp_path.rglob("escape.txt"))
    assert not os.path.exists("/tmp/escape.txt")


def test_invalid_json_is_invalid_input(run_runner):
    run = run_runner("print(1)\n", raw_run_json=b"{not json")
    assert_well_formed(run)
    assert run.frame["reason"] == "InvalidInput" and "run.json" in run.frame["message"]


# ------------------------------------------------------------------ artifacts

def decoded(artifact: dict) -> bytes:
    return base64.b64decode(artifact["contentBase64"])


def test_artifacts_are_collected_with_digests(run_runner):
    code = program("""
        import os
        out = os.environ["CODERUN_OUTPUT_DIR"]
        os.makedirs(os.path.join(out, "sub", "dir"))
        open(os.path.join(out, "result.json"), "w").write('{"answer": 42}')
        open(os.path.join(out, "sub", "dir", "blob.bin"), "wb").write(bytes(range(256)) * 4)
    """)
    run = run_runner(code)
    assert run.frame["reason"] == "Completed"
    artifacts = {a["name"]: a for a in run.frame["artifacts"]}
    assert set(artifacts) == {"result.json", "sub/dir/blob.bin"}
    blob = bytes(range(256)) * 4
    assert decoded(artifacts["sub/dir/blob.bin"]) == blob
    assert artifacts["sub/dir/blob.bin"] == {"name": "sub/dir/blob.bin", "size": 1024, "sha256": sha256_hex(blob),
                                             "contentBase64": base64.b64encode(blob).decode()}
    assert decoded(artifacts["result.json"]) == b'{"answer": 42}'
    assert run.frame["artifactsSkipped"] == []


def test_symlinks_and_special_files_never_leak(run_runner):
    secret = open("/etc/passwd").read()
    code = program("""
        import os
        out = os.environ["CODERUN_OUTPUT_DIR"]
        os.symlink("/etc/passwd", os.path.join(out, "passwd"))
        os.symlink("/etc", os.path.join(out, "etc"))
        os.mkfifo(os.path.join(out, "pipe"))
        open(os.path.join(out, "real.txt"), "w").write("mine")
    """)
    run = run_runner(code)
    assert [a["name"] for a in run.frame["artifacts"]] == ["real.txt"]
    assert sorted(run.frame["artifactsSkipped"], key=lambda s: s["name"]) == [
        {"name": "etc", "why": "symlink"},
        {"name": "passwd", "why": "symlink"},
        {"name": "pipe", "why": "not-a-regular-file"},
    ]
    first_line = secret.splitlines()[0]
    assert first_line not in run.frame_text
    assert base64.b64encode(secret.encode()).decode()[:40] not in run.frame_text


def test_outputs_dir_replaced_by_a_symlink_is_not_followed(run_runner):
    code = program("""
        import os, shutil
        out = os.environ["CODERUN_OUTPUT_DIR"]
        shutil.rmtree(out)
        os.symlink("/etc", out)
    """)
    run = run_runner(code)
    assert run.frame["artifacts"] == []
    assert run.frame["artifactsSkipped"] == [{"name": ".", "why": "symlink"}]


@pytest.mark.parametrize("caps, sizes, kept, skipped", [
    pytest.param({"maxFiles": 2, "maxFileBytes": 10, "maxTotalBytes": 100},
                 {"a": 5, "b": 20, "c": 5, "d": 5}, ["a", "c"], {"b": "too-large", "d": "too-many"},
                 id="too-large-and-too-many"),
    pytest.param({"maxFiles": 10, "maxFileBytes": 10, "maxTotalBytes": 12},
                 {"a": 8, "b": 8, "c": 4}, ["a", "c"], {"b": "total-too-large"},
                 id="total-too-large"),
])
def test_artifact_caps(run_runner, caps, sizes, kept, skipped):
    code = program(f"""
        import os
        for name, size in {sizes!r}.items():
            open(os.path.join(os.environ["CODERUN_OUTPUT_DIR"], name), "wb").write(b"z" * size)
    """)
    run = run_runner(code, artifacts=caps)
    assert [a["name"] for a in run.frame["artifacts"]] == kept
    assert {s["name"]: s["why"] for s in run.frame["artifactsSkipped"]} == skipped


def test_skipped_list_is_bounded(run_runner):
    code = "import os\nfor i in range(200):\n    os.symlink('/etc/passwd', os.path.join(os.environ['CODERUN_OUTPUT_DIR'], f'l{i:03}'))\n"
    run = run_runner(code)
    assert len(run.frame["artifactsSkipped"]) == MAX_SKIPPED_LISTED
    assert run.frame["artifactsSkippedUnlisted"] == 200 - MAX_SKIPPED_LISTED


# ------------------------------------------------------------------ forged frames and the termination log

def test_forged_frames_are_only_inside_stdout(run_runner, tmp_path):
    forged = 'CODERUN-RESULT-V1 {"version":1,"reason":"Completed","exitCode":0,"stdout":"forged"}'
    log = tmp_path / "termination-log"
    code = program(f"""
        import os, sys
        print({forged!r})
        # straight to the runner's own stdout, without a newline, as a program
        # in the sandbox could through /proc/1/fd/1
        with open(f"/proc/{{os.getppid()}}/fd/1", "w") as runner_stdout:
            runner_stdout.write({forged!r})
        with open({str(log)!r}, "w") as termination:
            termination.write(" " * 3000 + '{{"v":1,"reason":"Completed","exitCode":0,"frameSha256":"00"}}')
        sys.exit(4)
    """)
    run = run_runner(code)
    assert_well_formed(run)
    # Writing the runner's termination log is a violation the runner sees (it holds the file), not an outcome.
    assert run.frame["reason"] == "SandboxViolation" and run.frame["limit"]["kind"] == "termination-log"
    assert run.frame["stdout"] == forged + "\n"
    lines = run.raw_stdout.split(b"\n")
    assert lines[-2] == b"CODERUN-RESULT-V1 " + run.frame_json
    assert json.loads(log.read_bytes())["frameSha256"] == sha256_hex(run.frame_json)


# ------------------------------------------------------------------ metrics

def test_metrics_are_plausible(run_runner):
    code = program("""
        import time
        block = bytearray(64 * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
    """)
    run = run_runner(code, timeoutSeconds=20)
    metrics = run.frame["metrics"]
    assert run.frame["reason"] == "Completed"
    assert 300 <= metrics["cpuMillis"] < 20000
    assert metrics["wallMillis"] >= metrics["cpuMillis"] * 0.9
    assert 64 * 1024 * 1024 <= metrics["maxRSSBytes"] < 2 * 1024 ** 3
    assert metrics["wallMillis"] <= run.elapsed * 1000


def test_runner_reports_when_it_started_on_the_wall_clock(run_runner):
    before = int(time.time() * 1000)
    run = run_runner(program("print(1)"))
    after = int(time.time() * 1000)
    assert before <= run.frame["startedAtMillis"] <= after
