"""keepState: every run of a session in one interpreter (kept_interpreter.py, prestarted.serve_runs). Variables
persist; each run's output, error line and exit are its own; what a run leaves running is gone before the next;
a run that hangs ends at its timeout and the session goes on when the interrupt stops it, and ends with why
(`interpreterLost`) when it cannot; a run cannot change how the interpreter starts."""

from __future__ import annotations

import json
import subprocess
import sys

from support.runner import SESSION_KEY, lay_out_runner, run_entries, session_runs, session_stream


def keep_state_runs(tmp_path, codes, wrapper=(), **overrides):
    documents = [(f"{i:032x}", run_entries(code, **overrides)) for i, code in enumerate(codes)]
    return session_runs(tmp_path, documents, wrapper, keep_state=True)


def test_variables_persist_and_each_run_has_its_own_output_error_line_and_exit(tmp_path):
    frames = keep_state_runs(tmp_path, [
        "import sys\ntotal = 40\nprint('first')",
        "total += 2\nprint(total, __name__)\nprint('to stderr', file=sys.stderr)",
        "def f():\n    return undefined_name\n\nf()\n",
        "import sys\nprint(total)\nsys.exit(4)",
    ])
    assert [f["reason"] for f in frames] == ["Completed", "Completed", "NonZeroExit", "NonZeroExit"], frames
    assert [f["stdout"] for f in frames] == ["first\n", "42 __main__\n", "", "42\n"]
    assert frames[1]["stderr"] == "to stderr\n"
    assert frames[2]["error"]["type"] == "NameError" and frames[2]["error"]["line"] == 2, frames[2]
    assert frames[3]["exitCode"] == 4 and all(f["prestarted"] for f in frames)
    assert not any("interpreterLost" in f for f in frames)


def test_a_hanging_run_ends_at_its_timeout_and_the_session_keeps_its_state(tmp_path):
    frames = keep_state_runs(tmp_path, ["x = 'kept'", "while True:\n    pass", "print(x)"], timeoutSeconds=1.0)
    assert [f["reason"] for f in frames] == ["Completed", "Timeout", "Completed"], frames
    assert frames[2]["stdout"] == "kept\n" and "interpreterLost" not in frames[1]


def test_a_run_that_cannot_be_interrupted_ends_the_session_saying_why(tmp_path):
    frames = keep_state_runs(tmp_path, [
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
        "print('never runs')"], timeoutSeconds=1.0)
    assert len(frames) == 1 and frames[0]["reason"] == "Timeout", frames
    assert "did not stop" in frames[0]["interpreterLost"]


def test_an_interpreter_that_exits_ends_the_session_with_the_runs_exit_code(tmp_path):
    frames = keep_state_runs(tmp_path, ["import os\nprint('bye', flush=True)\nos._exit(3)", "print('never runs')"])
    assert len(frames) == 1 and (frames[0]["exitCode"], frames[0]["stdout"]) == (3, "bye\n"), frames
    assert "ended" in frames[0]["interpreterLost"]


def test_what_a_run_leaves_running_is_gone_before_the_next_and_the_interpreter_stays(tmp_path, as_pid1):
    frames = keep_state_runs(tmp_path, [
        "import subprocess, os\nchild = subprocess.Popen(['sleep', '300'])\nme = os.getpid()",
        "import os\n"
        "def state(p):\n"
        "    return open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[0]\n"
        "alive = sorted(p for p in os.listdir('/proc') if p.isdigit() and state(p) != 'Z')\n"
        "print(me == os.getpid(), alive)"], as_pid1)
    assert [f["reason"] for f in frames] == ["Completed", "Completed"], frames
    # The namespace's init and the interpreter; the sleep is dead (a zombie until the program's Popen reaps it).
    assert frames[1]["stdout"] == "True ['1', '2']\n", frames


def test_a_run_that_would_change_the_interpreters_start_is_refused(tmp_path):
    frames = keep_state_runs(tmp_path, ["print(1)"], env={"PYTHONPATH": "/elsewhere"})
    assert frames[0]["reason"] == "InvalidInput" and "keepState" in frames[0]["message"], frames


def test_a_first_document_whose_keep_state_differs_from_the_pods_is_refused(tmp_path):
    root = tmp_path / "opt-coderun"
    lay_out_runner(root)
    (tmp_path / "log").write_text("")
    entries = run_entries("print(1)")
    settings = {k: v for k, v in json.loads(entries["run.json"]).items() if k not in ("files", "stdinKey")}
    proc = subprocess.run(
        [sys.executable, "-I", str(root), "--session", "--input", str(tmp_path / "input"),
         "--work", str(tmp_path / "s" / "work"), "--outputs", str(tmp_path / "s" / "outputs"),
         "--termination-log", str(tmp_path / "log"), "--prestart", json.dumps(settings), "--keep-state"],
        input=session_stream([("0" * 32, entries)], SESSION_KEY, False), capture_output=True, timeout=60)
    assert b"keepState must be true" in proc.stdout


def test_nothing_of_a_run_goes_on_between_runs(tmp_path, as_pid1):
    """A thread run 1 left keeps starting a shell that stamps a file: between runs the interpreter is stopped (its
    threads frozen) and the shell killed, so nothing is stamped while the session waits for run 2 (the runner
    reads run 2's document only once it is there: the harness sends both at once, so run 2 first sleeps)."""
    frames = keep_state_runs(tmp_path, [
        "import threading, subprocess, time\n"
        "def keep():\n"
        "    while True:\n"
        "        subprocess.run(['sh', '-c', 'while :; do date +%s.%N >> \"$TMPDIR/ghost\"; sleep 0.1; done'])\n"
        "threading.Thread(target=keep, daemon=True).start()\n"
        "time.sleep(0.5)\n"
        "print('stamped', len(open(__import__('os').environ['TMPDIR'] + '/ghost').read().split()) > 0)",
        "import os, time\nstamps = len(open(os.environ['TMPDIR'] + '/ghost').read().split())\n"
        "time.sleep(1)\nprint(len(open(os.environ['TMPDIR'] + '/ghost').read().split()) > stamps)"], as_pid1)
    assert [f["stdout"] for f in frames] == ["stamped True\n", "True\n"], frames  # it runs on during a run only


def test_an_interpreter_a_thread_ended_between_runs_takes_no_run_and_says_so(tmp_path):
    """A thread that ends the interpreter after its run's end: the next run never ran, and says so (never a
    success), and the session ends."""
    frames = keep_state_runs(tmp_path, [
        "import threading, os, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), os._exit(0)), daemon=True).start()\n"
        "time.sleep(0.6)\nprint('never printed')",
        "print('run 2')"])
    assert frames[0]["reason"] == "Completed" and frames[0]["interpreterLost"], frames
    assert len(frames) == 1 or frames[1]["reason"] == "RunnerError", frames


def test_a_run_that_closes_the_interpreters_output_ends_the_session_after_its_own_end(tmp_path):
    frames = keep_state_runs(tmp_path, ["import os, time\nprint('before', flush=True)\nos.close(1)\ntime.sleep(0.5)",
                                        "print('never runs')"])
    assert len(frames) == 1 and (frames[0]["reason"], frames[0]["stdout"]) == ("Completed", "before\n"), frames
    assert "closed the interpreter's stdout" in frames[0]["interpreterLost"]


def test_threads_flooding_the_output_cannot_hold_the_runner(tmp_path, as_pid1):
    """Four threads writing to stdout without end and a main thread asleep: the run ends at its output cap, the
    next run's frame comes too (the threads flood it as well: they are the session's), and the runner never
    stalls on the pipes."""
    flood = ("import threading, os, time\n"
             "def write():\n    chunk = b'x' * 65536\n    while True:\n        os.write(1, chunk)\n"
             "for _ in range(4):\n    threading.Thread(target=write, daemon=True).start()\n"
             "time.sleep(1000)\n")
    frames = keep_state_runs(tmp_path, [flood, "print('next')"], as_pid1, timeoutSeconds=1.0)
    assert len(frames) == 2 and frames[0]["reason"] == "OutputLimitExceeded", frames
