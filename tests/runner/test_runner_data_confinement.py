"""The data plane's inputs as the program sees them in the pod: the runner unprivileged and PID 1, the program in
its own namespaces, where the inputs dir is a read-only bind (confinement.bind_read_only) and the raw input, with
run.json and its grant, is hidden. Its inputs come from a stand-in data service on 127.0.0.1."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest

from support.data_standin import TOKEN, DataStandIn
from support.runner import NOBODY, SYSTEM_PYTHON, run_entries, run_session_runner, runner_in, session_stream

CSV = b"a,b\n1,2\n"
# Every way to change the input, each answered by its errno; the input read, and a file written in the work dir,
# are the positive controls.
TRIES = textwrap.dedent("""
    import errno, json, os
    target = os.path.realpath("in/data.csv")
    inputs = os.path.dirname(os.path.dirname(target))
    def attempt(action):
        try:
            action()
            return "allowed"
        except OSError as exc:
            return errno.errorcode[exc.errno]
    print(json.dumps({
        "read": open("in/data.csv", "rb").read().decode(),
        "open-for-write": attempt(lambda: open("in/data.csv", "r+b")),
        "truncate": attempt(lambda: os.truncate(target, 0)),
        "chmod": attempt(lambda: os.chmod(target, 0o666)),
        "unlink": attempt(lambda: os.unlink(target)),
        "rename": attempt(lambda: os.rename(target, target + ".moved")),
        "new-file": attempt(lambda: open(os.path.join(inputs, "planted"), "w")),
        "run.json": os.path.exists(os.path.join(INPUT_DIR, "run.json")),
        "work-write": attempt(lambda: open("mine.txt", "w").write("mine")),
    }))
""")
# Writing is refused by the file's mode 0444 first (EACCES); every change to the mode or the dir by the read-only mount.
EXPECTED = {"read": CSV.decode(), "open-for-write": "EACCES", "truncate": "EACCES", "chmod": "EROFS",
            "unlink": "EROFS", "rename": "EROFS", "new-file": "EROFS", "run.json": False, "work-write": "allowed"}


@pytest.fixture
def base(as_nobody, as_pid1, user_mounts):
    """A dir nobody owns, with its termination log, and the command prefix that runs the runner there as in the pod."""
    path = Path(tempfile.mkdtemp(prefix="coderun-data-"))
    os.chmod(path, 0o755)
    os.chown(path, NOBODY, NOBODY)
    (path / "termination-log").write_text("")
    os.chown(path / "termination-log", NOBODY, NOBODY)
    drop = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    try:
        yield path, (*as_pid1, *drop)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def tries(input_dir: Path) -> str:
    return f"INPUT_DIR = {str(input_dir)!r}\n" + TRIES


def test_in_the_pod_the_program_reads_its_input_and_cannot_change_it(base):
    path, wrapper = base
    with DataStandIn([CSV]) as service:
        run = runner_in(path, owner=NOBODY, interpreter=SYSTEM_PYTHON)(
            tries(path / "input"), wrapper=wrapper, data=service.data(["in/data.csv"]))
    assert run.frame["reason"] == "Completed", run.frame
    assert json.loads(run.frame["stdout"]) == EXPECTED
    assert (path / "inputs" / "in" / "data.csv").read_bytes() == CSV
    assert TOKEN not in run.raw_stdout.decode()


def test_in_a_session_with_forked_programs_the_inputs_stay_read_only_and_the_grant_hidden(base):
    path, wrapper = base
    input_dir = path / "input"
    with DataStandIn([CSV]) as service:
        entries = run_entries(tries(input_dir), data=service.data(["in/data.csv"]))
        settings = {k: v for k, v in json.loads(entries["run.json"]).items() if k not in ("files", "stdinKey")}
        stream = session_stream([("a" * 32, entries), ("b" * 32, entries)])
        run = run_session_runner(path, stream, wrapper=wrapper, interpreter=SYSTEM_PYTHON,
                                 mode=("--session", "--prestart", json.dumps(settings)))
    assert [f["reason"] for f in run.frames] == ["Completed", "Completed"], run.frames
    for frame in run.frames:
        assert json.loads(frame["stdout"]) == EXPECTED, frame
    assert service.gets() == ["/v1/inputs/0"]  # the second run kept the first run's input
    assert (path / "inputs" / "in" / "data.csv").read_bytes() == CSV
