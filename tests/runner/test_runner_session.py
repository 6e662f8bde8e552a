"""A session's runs: the stream of input documents one per run (input_stream.py), and keepState's persistent
interpreter (interpreter.py) against a cold run of the real runner: the same program fails with the same stderr,
error type, message and line, exit code or signal, whatever ran before it in the session."""

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from coderun.sandbox.runner.child import BASE_PATH
from coderun.sandbox.runner.errors import parse_python_error
from coderun.sandbox.runner.inputs import InputIncomplete
from coderun.sandbox.runner.input_stream import MAX_SESSION_DOCUMENT_BYTES, read_session_inputs
from support.runner import (NOBODY, SESSION_KEY, SRC, SYSTEM_PYTHON, run_entries, run_session_runner, runner_in,
                            session_stream, signed_document, warm_document)

NONCE_A, NONCE_B, NONCE_C = "a" * 32, "b" * 64, "c" * 32


def document(nonce=NONCE_A, **keys) -> bytes:
    return warm_document({k: v.encode() for k, v in (keys or {"code": "print(1)"}).items()}, nonce)


def raw(body: bytes) -> bytes:
    return b"%d\n%s" % (len(body), body)


def read_all(stream: bytes):
    return list(read_session_inputs(io.BufferedReader(io.BytesIO(stream))))


# The stream of documents


def test_each_document_is_one_run_with_its_own_nonce_and_keys():
    runs = read_all(document(NONCE_A, code="x = 1") + document(NONCE_B, code="print(x)", stdin="in"))
    assert [(r.nonce, r.entries, r.error) for r in runs] == [
        (NONCE_A, {"code": b"x = 1"}, None), (NONCE_B, {"code": b"print(x)", "stdin": b"in"}, None)]


def test_garbage_costs_its_run_an_invalid_input_and_the_next_document_still_runs():
    bad_json, no_nonce = raw(b'{"nonce": "' + NONCE_A.encode() + b'", "data": [1]}'), raw(b'{"data": {}}')
    stream = (b"not a length\n" + bad_json + b"0\n" + raw(b"[1, 2]") + no_nonce + b"9" * 120 + b"\n"
              + raw(b"\xff\xfe") + document(NONCE_B, code="print(2)"))
    runs = read_all(stream)
    assert [r.error is None for r in runs] == [False] * 7 + [True]
    assert runs[-1].nonce == NONCE_B and runs[-1].entries == {"code": b"print(2)"}
    # A bad document that carries a well-formed nonce is still answered to that run; the others to no one.
    assert [r.nonce for r in runs[:-1]] == [None, NONCE_A, None, None, None, None, None]
    assert "data and binaryData must be objects" in runs[1].error
    assert all(r.error for r in runs[:-1])


def test_the_stream_ending_between_documents_ends_the_session_quietly():
    assert read_all(b"") == []
    assert len(read_all(document() + document(NONCE_B))) == 2


@pytest.mark.parametrize("cut", [3, 10, -1])
def test_a_stream_ending_inside_a_document_breaks_the_session(cut):
    stream = document() + document(NONCE_B)
    reader = read_session_inputs(io.BufferedReader(io.BytesIO(stream[:len(document()) + (cut % len(document()))])))
    assert next(reader).nonce == NONCE_A
    with pytest.raises(InputIncomplete):
        next(reader)


def test_a_document_larger_than_any_run_breaks_the_stream_rather_than_waiting_for_it():
    reader = read_session_inputs(io.BufferedReader(io.BytesIO(b"%d\n" % (MAX_SESSION_DOCUMENT_BYTES + 1))))
    with pytest.raises(InputIncomplete, match="out of step"):
        next(reader)


def test_a_document_with_a_key_in_data_and_binary_data_is_refused():
    body = json.dumps({"nonce": NONCE_A, "data": {"code": "1"}, "binaryData": {"code": "MQ=="}}).encode()
    (run,) = read_all(raw(body))
    assert run.nonce == NONCE_A and "both data and binaryData" in run.error


# keepState: one interpreter, each run as a file main.py of its own

# Runs the programs one after another in one interpreter, each with its own stdout and stderr (files here; the
# session runner hands each run fresh pipes), and prints their return codes as JSON.
DRIVER = textwrap.dedent("""
    import json, os, sys
    sys.path.append(sys.argv[1])
    from coderun.sandbox.runner.interpreter import main_module, run_as_main
    work, programs = sys.argv[2], json.loads(sys.stdin.read())
    saved = os.dup(1), os.dup(2)
    module, codes = main_module(os.path.join(work, "main.py")), []
    for index, code in enumerate(programs):
        with open(os.path.join(work, "main.py"), "w") as f:
            f.write(code)
        out = os.open(os.path.join(work, f"../out-{index}"), os.O_WRONLY | os.O_CREAT, 0o600)
        err = os.open(os.path.join(work, f"../err-{index}"), os.O_WRONLY | os.O_CREAT, 0o600)
        os.dup2(out, 1); os.dup2(err, 2)
        codes.append(run_as_main(module, work))
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(saved[0], 1); os.dup2(saved[1], 2)
    print(json.dumps(codes))
""")


def run_session(tmp_path, programs: list[str]) -> list[dict]:
    """Each program's (stdout, stderr, exitCode, signal, error) after running them in order in one interpreter,
    started as the cold runner starts the program (python3 -u, from the work dir)."""
    work = tmp_path / "session" / "work"
    work.mkdir(parents=True)
    python = shutil.which("python3", path=BASE_PATH)
    proc = subprocess.run([python, "-u", "-c", DRIVER, str(SRC), str(work)], input=json.dumps(programs),
                          capture_output=True, text=True, cwd=work, timeout=60,
                          env={"PATH": BASE_PATH, "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
                               "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0, proc.stderr
    results = []
    for index, returncode in enumerate(json.loads(proc.stdout.splitlines()[-1])):
        stderr = (work.parent / f"err-{index}").read_text().replace(str(work), "<work>")
        results.append({"stdout": (work.parent / f"out-{index}").read_text().replace(str(work), "<work>"),
                        "stderr": stderr, "exitCode": returncode if returncode >= 0 else None,
                        "signal": -returncode if returncode < 0 else None,
                        "error": parse_python_error(stderr, "main.py") if returncode else None})
    return results


def run_cold(tmp_path, code: str) -> dict:
    base = tmp_path / f"cold-{abs(hash(code))}"
    base.mkdir()
    frame = runner_in(base)(code).frame
    work = str(base / "scratch" / "work")
    return {"stdout": frame["stdout"].replace(work, "<work>"), "stderr": frame["stderr"].replace(work, "<work>"),
            "exitCode": frame["exitCode"], "signal": frame["signal"], "error": frame["error"]}


PROGRAMS = {
    "zero-division": "a = 1\nb = 0\nprint(a / b)\n",
    "in-a-function": "def f(n):\n    return {}[n]\n\n\nprint('before')\nf('key')\n",
    "through-the-stdlib": "import json\n\njson.loads('{not json')\n",
    "chained": "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise ValueError('bad') from e\n",
    "syntax-error": "x = 1\ndef (:\n",
    "indentation": "if True:\nprint(1)\n",
    "name-error": "print('ok')\nundefined_name\n",
    "exit-3": "import sys\nprint('leaving')\nsys.exit(3)\n",
    "exit-message": "import sys\nsys.exit('fatal: no input')\n",
    "exit-none": "raise SystemExit\n",
    "exit-263": "import sys\nsys.exit(263)\n",
    "exit-negative": "import sys\nsys.exit(-1)\n",
    "keyboard-interrupt": "raise KeyboardInterrupt\n",
    "what-it-sees": ('"""The docstring."""\nimport os, sys\nprint(__name__, __file__, sys.argv, sys.path[0], os.getcwd(),'
                     ' __doc__, __spec__, __package__, type(__loader__).__name__)\n'),
    "atexit": "import atexit\natexit.register(print, 'at exit')\nprint('body')\n",
    "atexit-after-error": "import atexit\natexit.register(print, 'at exit')\nraise RuntimeError('x')\n",
    "thread": ("import threading, time\n"
               "threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()\nprint('main done')\n"),
    "excepthook": ("import sys\nsys.excepthook = lambda t, v, tb: print('hooked', t.__name__, tb.tb_lineno, "
                   "file=sys.stderr)\nraise TypeError('t')\n"),
    "ok": "print(6 * 7)\n",
}
# Run first in the session, so every program above runs in an interpreter that has already run something
# (and that left state behind: a global, an import, an atexit handler already run, a changed cwd).
PRELUDE = "import os, sys\nleft_behind = 1\nos.chdir('/')\nsys.argv.append('stale')\nraise ValueError('prelude')\n"


def test_a_session_run_ends_as_the_same_program_cold(tmp_path):
    names = list(PROGRAMS)
    session = run_session(tmp_path, [PRELUDE, *(PROGRAMS[n] for n in names)])
    assert session[0]["error"] == {"type": "ValueError", "message": "prelude", "line": 5}
    mismatches = {}
    for name, got in zip(names, session[1:]):
        cold = run_cold(tmp_path, PROGRAMS[name])
        if got != cold:
            mismatches[name] = {"cold": cold, "session": got}
    assert mismatches == {}, json.dumps(mismatches, indent=1)
    # The table covers what it says: an error with its line, exits, a signal.
    assert session[1 + names.index("in-a-function")]["error"] == {"type": "KeyError", "message": "'key'", "line": 2}
    assert session[1 + names.index("exit-263")]["exitCode"] == 7
    assert session[1 + names.index("keyboard-interrupt")]["signal"] == 2


def test_variables_imports_and_functions_persist_and_a_later_error_names_its_own_line(tmp_path):
    first, second, third, fourth = run_session(tmp_path, [
        "import math\ntotal = 40\ndef grow(n):\n    return n + 2\n",
        "total = grow(total)\nprint(total, math.pi > 3)\n",
        "import sys\nprint('exiting')\nsys.exit(5)\n",
        "print(total)\n\n\nmissing[0]\n",
    ])
    assert first["exitCode"] == 0 and first["stdout"] == ""
    assert second["stdout"] == "42 True\n"
    assert third["exitCode"] == 5  # a run's sys.exit ends the run, not the session
    assert fourth["stdout"] == "42\n"
    assert fourth["error"] == {"type": "NameError", "message": "name 'missing' is not defined", "line": 4}
    assert "interpreter.py" not in fourth["stderr"]


def test_atexit_handlers_run_once_at_the_end_of_the_run_that_registered_them(tmp_path):
    runs = run_session(tmp_path, ["import atexit\natexit.register(print, 'bye')\n", "print('next')\n"])
    assert [r["stdout"] for r in runs] == ["bye\n", "next\n"]


def test_once_the_session_has_its_key_only_its_documents_are_read_in_their_order():
    from coderun.sandbox.runner.protocol import session_document_mac as mac
    from coderun.sandbox.runner.input_stream import SessionInputs
    key = b"k" * 32
    first, second, third, fourth = (json.dumps({"nonce": n, "data": {"code": c}}).encode()
                                    for n, c in ((NONCE_A, "a"), (NONCE_B, "b"), ("c" * 32, "c"), ("d" * 32, "d")))

    def signed(sequence, body, with_key=key, claimed=None):
        return b"%d %d %s\n%s" % (len(body), sequence if claimed is None else claimed,
                                   mac(with_key, sequence, body).encode(), body)

    stream = (raw(first)                      # before the key: read as it is (the claim vouches for it)
              + signed(1, second, b"x" * 32)  # another key: dropped
              + raw(second)                   # no MAC: dropped
              + signed(1, second)             # the first signed document
              + signed(1, third)              # a replayed sequence number: dropped
              + signed(2, third, claimed=3)   # a MAC for one number, claiming another: dropped
              + signed(3, third)              # a gap (2 was numbered, never sent): read
              + signed(2, fourth))            # then an earlier number: out of order, dropped
    inputs = SessionInputs(io.BufferedReader(io.BytesIO(stream)))
    runs = []
    for run in inputs:
        runs.append(run)
        inputs.key = key  # the runner takes the key from the first document
    assert [(r.nonce, r.entries and r.entries["code"]) for r in runs] == [
        (NONCE_A, b"a"), (None, None), (None, None), (NONCE_B, b"b"), (None, None), (None, None), ("c" * 32, b"c"),
        (None, None)]
    assert all("no valid MAC" in runs[i].error for i in (1, 2, 4, 5, 7))
    assert inputs.sequence == 3


# The runner's session mode (`--session`, keepState false): a fresh process per run, the work dir kept


def accepted_digest(nonce: str) -> str:
    return "CODERUN-ACCEPTED " + hashlib.sha256(nonce.encode()).hexdigest()[:16]


def test_a_file_one_run_writes_is_read_by_the_next_and_each_run_has_its_own_frame_and_outputs(tmp_path):
    first = ("import os\nopen('state.txt', 'w').write('from run 1')\n"
             "open(os.path.join(os.environ['CODERUN_OUTPUT_DIR'], 'one.txt'), 'w').write('artifact')\nprint('one')\n")
    second = "import os\nprint(open('state.txt').read(), sorted(os.listdir(os.environ['CODERUN_OUTPUT_DIR'])))\n"
    run = run_session_runner(tmp_path, session_stream([(NONCE_A, run_entries(first)), (NONCE_B, run_entries(second))]))
    assert run.returncode == 0
    assert [(f["nonce"], f["reason"], f["stdout"]) for f in run.frames] == [
        (NONCE_A, "Completed", "one\n"), (NONCE_B, "Completed", "from run 1 []\n")]
    assert [a["name"] for a in run.frames[0]["artifacts"]] == ["one.txt"] and run.frames[1]["artifacts"] == []
    lines = run.raw_stdout.decode().split("\n")
    assert [line for line in lines if line.startswith("CODERUN-ACCEPTED ")] == [
        accepted_digest(NONCE_A), accepted_digest(NONCE_B)]
    first_frame = next(i for i, line in enumerate(lines) if line.startswith("CODERUN-RESULT-V1 "))
    assert lines.index(accepted_digest(NONCE_B)) > first_frame
    # The key never reaches the program's input; the termination log vouches for the last frame.
    assert SESSION_KEY.hex() not in run.raw_stdout.decode()
    assert run.termination["reason"] == "Completed"


def test_a_program_killed_by_a_sigkill_the_runner_did_not_send_ends_the_session_after_its_frame(tmp_path):
    """What gVisor does when the sandbox's memory runs out; a SIGTERM (or any other signal) leaves the session."""
    killed = "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    terminated = "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n"
    run = run_session_runner(tmp_path, session_stream([(NONCE_A, run_entries(terminated)),
                                                       (NONCE_B, run_entries(killed)),
                                                       (NONCE_C, run_entries("print('never')\n"))]))
    assert run.returncode == 0
    assert [(f["nonce"], f["reason"], f["signal"], f["stdout"]) for f in run.frames] == [
        (NONCE_A, "Signaled", 15, ""), (NONCE_B, "Signaled", 9, "before\n")]
    assert run.termination["reason"] == "Signaled"


# Run 1 leaves a process behind: it holds a lock on a file of the work dir (the kernel drops it only when the
# process is gone) and, every few milliseconds, prints a forged frame for run 2 wherever it can reach the
# runner's stdout (/proc/1 is the runner's or, in the program's own PID namespace, its init's). Run 1 ends once
# the process holds the lock.
LEFTOVER = """
import fcntl, os, time
held = open("lock", "w")
fcntl.flock(held, fcntl.LOCK_EX)
forged = b'\\nCODERUN-RESULT-V1 {"version": 1, "reason": "Completed", "nonce": "NONCE", "stdout": "forged"}\\n'
while True:
    for path in ("/proc/1/fd/1", "/proc/self/fd/1"):
        try:
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, forged)
            os.close(fd)
        except OSError:
            pass
    time.sleep(0.005)
"""
LEAVES_A_PROCESS = """import fcntl, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", LEFTOVER], start_new_session=True)
probe = open("lock", "a")
for _ in range(1000):
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(probe, fcntl.LOCK_UN)
        time.sleep(0.01)
    except BlockingIOError:
        print("the leftover holds the lock")
        break
"""
LOCK_IS_FREE = """import fcntl
try:
    fcntl.flock(open("lock", "a"), fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("free")
except BlockingIOError:
    print("held by a process of an earlier run")
"""


def test_what_a_run_leaves_running_is_gone_before_the_next_run_and_never_prints_into_its_frame(tmp_path, as_pid1):
    leaves = f"LEFTOVER = {LEFTOVER.replace('NONCE', NONCE_B)!r}\n" + LEAVES_A_PROCESS
    stream = session_stream([(NONCE_A, run_entries(leaves)), (NONCE_B, run_entries(LOCK_IS_FREE))])
    run = run_session_runner(tmp_path, stream, wrapper=as_pid1)
    first, second = run.frames[0], run.frames[-1]
    # Run 1's own stdout may hold the leftover's lines (they went to run 1's pipe): that is run 1's output.
    assert first["nonce"] == NONCE_A and "the leftover holds the lock\n" in first["stdout"], first
    assert second["nonce"] == NONCE_B and second["stdout"] == "free\n", second
    # Nothing the leftover wrote reached the runner's stdout once run 2 was accepted: its only frame is its own.
    assert b"forged" not in run.raw_stdout.split(accepted_digest(NONCE_B).encode())[1]
    assert [f["stdout"] for f in run.with_nonce(NONCE_B)] == ["free\n"]


def test_a_symlink_planted_by_a_run_never_redirects_a_later_runs_input(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("original")
    plant = (f"import os\nos.symlink({str(victim)!r}, 'data.txt')\nos.remove('main.py')\n"
             f"os.symlink({str(victim)!r}, 'main.py')\nos.symlink({str(outside)!r}, 'sub')\n")
    stream = session_stream([
        (NONCE_A, run_entries(plant)),
        (NONCE_B, run_entries("print(open('data.txt').read())", {"data.txt": b"run 2's data"})),
        (NONCE_C, run_entries("print('unused')", {"sub/x.txt": b"into the link"})),
    ])
    run = run_session_runner(tmp_path, stream)
    assert [f["nonce"] for f in run.frames] == [NONCE_A, NONCE_B, NONCE_C]
    assert run.frames[0]["reason"] == "Completed", run.frames[0]
    assert (run.frames[1]["reason"], run.frames[1]["stdout"]) == ("Completed", "run 2's data\n")
    assert not (run.work / "data.txt").is_symlink() and not (run.work / "main.py").is_symlink()
    # A directory link to outside the work dir is refused, not written through.
    assert run.frames[2]["reason"] == "InvalidInput" and "outside the work dir" in run.frames[2]["message"]
    assert victim.read_text() == "original" and sorted(p.name for p in outside.iterdir()) == ["victim.txt"]


def test_a_bad_document_costs_its_run_an_invalid_input_and_the_session_goes_on(tmp_path):
    ok = run_entries("print(open('kept.txt').read())")
    stream = (session_stream([(NONCE_A, run_entries("open('kept.txt', 'w').write('kept')"))])
              + b"not a length\n"                                              # garbage
              + signed_document(1, NONCE_B, ok, key=b"x" * 32)                 # another key's
              + signed_document(1, NONCE_B, {**ok, "run.json": b"{not json"})  # the session's, bad run.json
              + signed_document(2, NONCE_C, ok))
    run = run_session_runner(tmp_path, stream)
    assert [(f.get("nonce"), f["reason"]) for f in run.frames] == [
        (NONCE_A, "Completed"), (None, "InvalidInput"), (None, "InvalidInput"), (NONCE_B, "InvalidInput"),
        (NONCE_C, "Completed")]
    assert "no valid MAC" in run.frames[2]["message"] and "run.json" in run.frames[3]["message"]
    assert run.frames[-1]["stdout"] == "kept\n"


@pytest.mark.parametrize("settings, words", [
    (None, "no session.json"),
    (b'{"key": "00"}', "key must be"),
    (json.dumps({"key": SESSION_KEY.hex(), "keepState": True}).encode(), "keepState"),
], ids=["none", "short-key", "keep-state"])
def test_a_first_document_without_the_sessions_key_ends_the_session_unrun(tmp_path, settings, words):
    first = run_entries(f"open({str(tmp_path / 'ran')!r}, 'w')")
    if settings is not None:
        first["session.json"] = settings
    stream = warm_document(first, NONCE_A) + signed_document(1, NONCE_B, run_entries("print(1)"))
    run = run_session_runner(tmp_path, stream)
    assert [(f["nonce"], f["reason"]) for f in run.frames] == [(NONCE_A, "InvalidInput")]
    assert words in run.frames[0]["message"] and not (tmp_path / "ran").exists()


COLD_EQUAL = {
    "ok": "print(6 * 7)\n",
    "in-a-function": "import sys\ndef f(n):\n    return {}[n]\n\n\nprint('before', file=sys.stderr)\nf('key')\n",
    "syntax-error": "x = 1\ndef (:\n",
    "exit-3": "import sys\nprint('leaving')\nsys.exit(3)\n",
    "signal": "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n",
    "reads-stdin": "import sys\nprint(sys.stdin.read() or 'no stdin')\n",
}


def test_each_session_run_ends_as_the_same_program_cold(tmp_path):
    (tmp_path / "session").mkdir()
    names = list(COLD_EQUAL)
    nonces = [f"{index:032x}" for index in range(1, len(names) + 1)]
    run = run_session_runner(tmp_path / "session", session_stream(
        [(nonce, run_entries(COLD_EQUAL[name])) for nonce, name in zip(nonces, names)]))
    fields = ("reason", "exitCode", "signal", "stdout", "stderr", "error", "stdoutTruncated", "stderrTruncated")
    mismatches = {}
    for name, nonce in zip(names, nonces):
        (frame,) = run.with_nonce(nonce)
        (tmp_path / name).mkdir()
        cold = runner_in(tmp_path / name)(COLD_EQUAL[name]).frame
        got = {f: frame[f] for f in fields}
        want = {f: cold[f] for f in fields}
        got["stderr"] = got["stderr"].replace(str(tmp_path / "session"), "<base>")
        want["stderr"] = want["stderr"].replace(str(tmp_path / name), "<base>")
        if got != want:
            mismatches[name] = {"cold": want, "session": got}
    assert mismatches == {}, json.dumps(mismatches, indent=1)
    assert run.with_nonce(nonces[names.index("in-a-function")])[0]["error"]["line"] == 3


def test_as_in_the_pod_the_scratch_tmpfs_is_mounted_once_and_keeps_the_sessions_files(as_pid1, user_mounts):
    """Unprivileged, PID 1, the scratch dir a capped tmpfs of the runner's: mounted before the first program only
    (a mount per run would hide what earlier runs wrote), so run 2 finds run 1's file and counts it."""
    base = Path(tempfile.mkdtemp(prefix="coderun-session-"))
    try:
        os.chmod(base, 0o755)
        os.chown(base, NOBODY, NOBODY)
        (base / "termination-log").write_text("")
        os.chown(base / "termination-log", NOBODY, NOBODY)
        caps = {"scratchTmpfs": True, "diskBytes": 1 << 20, "maxInodes": 100}
        stream = session_stream([
            (NONCE_A, run_entries("import os\nopen('kept.bin', 'wb').write(b'k' * 300_000)\nprint(os.getuid())\n",
                                  **caps)),
            (NONCE_B, run_entries("import os\ns = os.statvfs('.')\nprint(len(open('kept.bin', 'rb').read()), "
                                  "(s.f_blocks - s.f_bfree) * s.f_frsize >= 300_000)\n", **caps)),
        ])
        drop = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
        run = run_session_runner(base, stream, wrapper=(*as_pid1, *drop), interpreter=SYSTEM_PYTHON)
        assert [(f["nonce"], f["reason"], f["stdout"]) for f in run.frames] == [
            (NONCE_A, "Completed", f"{NOBODY}\n"), (NONCE_B, "Completed", "300000 True\n")], run.frames
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_run_that_writes_the_termination_log_breaks_the_rule_alone(tmp_path):
    log = tmp_path / "termination-log"
    stream = session_stream([(NONCE_A, run_entries(f"open({str(log)!r}, 'w').write('forged summary')")),
                             (NONCE_B, run_entries("print('next')"))])
    run = run_session_runner(tmp_path, stream)
    assert [(f["nonce"], f["reason"]) for f in run.frames] == [(NONCE_A, "SandboxViolation"), (NONCE_B, "Completed")]
    assert run.frames[0]["limit"]["kind"] == "termination-log"
    assert run.termination["reason"] == "Completed"  # the last frame's summary, not the program's text
