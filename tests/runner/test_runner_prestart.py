"""A program run in a process started before its code came (a warm or session pod's `--prestart`) sees and ends
exactly as the same program started cold: argv, __file__, __name__, the path, tracebacks and the error's line,
exit codes and signals, stdin, atexit and threads, its fds; a run that sets a variable the interpreter reads at
start starts cold; and a process that never answers is given up for a cold start."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from coderun.sandbox.runner import prestart, protocol
from support.runner import (PROGRAMS, comparable, run_entries, run_session_runner, run_spec, runner_in, session_runs,
                            signed_document, warm_document)

NONCE = "0123456789abcdef" * 4


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_prestarted_program_ends_as_the_same_program_cold(tmp_path, name):
    frames = {}
    for mode, directory in (("cold", "a"), ("prestarted", "b")):  # paths of one length: byte counts compare
        (tmp_path / directory).mkdir()
        run = runner_in(tmp_path / directory)(PROGRAMS[name], stdin=b"from stdin", warm_nonce=NONCE,
                                              prestart=mode == "prestarted")
        frames[mode] = comparable(run.frame, str(tmp_path / directory))
        assert run.frame.get("prestarted", False) is (mode == "prestarted"), run.frame
    assert frames["prestarted"] == frames["cold"]
    if name == "view":
        view = json.loads(frames["prestarted"]["stdout"])
        assert view["coderun"] == [] and view["argv"] == ["main.py"] and view["orig"] == ["-u", "main.py"]
        assert view["fds"] == ["0", "1", "2", "3"] and view["stdin"] == "from stdin", view  # 3: listdir's own


def test_a_run_that_sets_a_startup_variable_starts_cold_and_sees_it(run_runner):
    run = run_runner("import sys\nprint(sys.path[1])", warm_nonce=NONCE, prestart=True,
                     env={"PYTHONPATH": "/from/the/run"})
    assert run.frame["stdout"] == "/from/the/run\n" and "prestarted" not in run.frame


def test_the_cpu_of_the_start_is_not_the_programs(run_runner):
    run = run_runner("print(1)", warm_nonce=NONCE, prestart=True)
    assert run.frame["prestarted"] is True
    # The start (interpreter and bootstrap) took tens of ms of CPU; the program's print takes next to none.
    assert run.frame["metrics"]["cpuMillis"] < 15, run.frame["metrics"]


@pytest.mark.parametrize("keep_state", [False, True], ids=["fresh-process", "keep-state"])
def test_a_pool_pods_runner_becomes_the_sandbox_of_the_session_that_claimed_it(tmp_path, keep_state):
    """Its first document carries the session's settings: it serves every later document of the session (their
    MACs checked), the work dir kept, and with keepState one interpreter (its prestarted program gives way)."""
    codes = ["open('kept.txt', 'w').write('from run 1'); x = 41", "print(open('kept.txt').read())",
             "print(globals().get('x', 'no x') if __name__ == '__main__' else '?')"]
    documents = [(f"{i:032x}", run_entries(code)) for i, code in enumerate(codes)]
    frames = session_runs(tmp_path, documents, keep_state=keep_state, pool=True)
    assert [(f["nonce"], f["reason"]) for f in frames] == [(n, "Completed") for n, _ in documents], frames
    assert frames[1]["stdout"] == "from run 1\n"
    assert frames[2]["stdout"] == ("41\n" if keep_state else "no x\n")
    if not keep_state:  # the pool's prestarted program takes the first run, as it would a warm run
        assert [f.get("prestarted", False) for f in frames] == [True] * 3


def test_a_pool_pods_runner_given_a_runs_document_runs_it_alone_and_reads_no_more(tmp_path):
    run, second = run_entries("print('the run')"), run_entries(f"open({str(tmp_path / 'second')!r}, 'w')")
    stream = warm_document(run, "a" * 32) + signed_document(1, "b" * 32, second)
    run = run_session_runner(tmp_path, stream, mode=("--input-stdin",))
    assert [(f["nonce"], f["stdout"]) for f in run.frames] == [("a" * 32, "the run\n")]
    assert not (tmp_path / "second").exists()


def test_each_session_run_is_prestarted_and_a_home_an_earlier_run_filled_makes_the_next_cold(tmp_path):
    (tmp_path / "log").write_text("")
    codes = ["open('kept.txt', 'w').write('from run 1'); x = 1",
             "print(open('kept.txt').read()); print('x' in globals())",
             "import os; os.makedirs(os.path.expanduser('~/.local/lib'))",
             "print('after a .local')"]
    documents = [(f"{i:032x}", run_entries(code)) for i, code in enumerate(codes)]
    frames = session_runs(tmp_path, documents)
    assert [f["reason"] for f in frames] == ["Completed"] * 4
    assert frames[1]["stdout"] == "from run 1\nFalse\n"  # files persist, variables do not (keepState false)
    # Packages (or a .pth) under ~/.local would run at an interpreter's start, outside any run's deadline.
    assert [f.get("prestarted", False) for f in frames] == [True, True, True, False]


def test_as_pid1_a_prestarted_run_is_confined_and_leaves_nothing_behind(tmp_path, as_pid1):
    (tmp_path / "log").write_text("")
    leave = "import subprocess\nsubprocess.Popen(['sleep', '300'])\nimport os\nprint(os.getpid())"
    count = "import os\nprint(sorted(p for p in os.listdir('/proc') if p.isdigit()))"
    documents = [(f"{i:032x}", run_entries(code)) for i, code in enumerate((leave, count))]
    frames = session_runs(tmp_path, documents, wrapper=as_pid1)
    assert [f.get("prestarted", False) for f in frames] == [True, True]
    # Its own PID namespace (the program is PID 2 under an init of ours), and the last run's sleep is gone.
    assert frames[0]["stdout"] == "2\n" and frames[1]["stdout"] == "['1', '2']\n", frames


def test_a_prestarted_process_that_never_answers_is_given_up(monkeypatch):
    monkeypatch.setattr(prestart, "ANSWER_SECONDS", 0.3)
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    ours, theirs = socket.socketpair()
    started = time.monotonic()
    try:
        answer = prestart.Prestarted({}, silent, ours).take({"PATH": "/bin"}, None, "main.py")
    finally:
        theirs.close()
    assert answer is None and silent.poll() is not None and time.monotonic() - started < 5


@pytest.mark.parametrize("settings, expected", [
    ({"language": "python", "command": ["python3", "-u", "main.py"], "codeFile": "main.py"}, True),
    ({"language": "python", "command": ["python3", "main.py"], "codeFile": "main.py"}, False),
    ({"language": "python", "command": ["python3", "-u", "app.py"], "codeFile": "main.py"}, False),
    ({"language": "javascript", "command": ["node", "main.js"], "codeFile": "main.js"}, True),
    ({"language": "javascript", "command": ["node", "--inspect", "main.js"], "codeFile": "main.js"}, False),
    ({"language": "javascript", "command": ["node", "src/main.js"], "codeFile": "src/main.js"}, False),
])
def test_only_the_commands_it_stands_in_for_are_prestarted(settings, expected):
    assert protocol.can_prestart(settings) is expected


def test_the_preloads_follow_the_memory_the_program_has():
    assert prestart.preloads_for(None) == [] and prestart.preloads_for(128 << 20) == []
    assert prestart.preloads_for(256 << 20) == ["numpy"] and prestart.preloads_for(1 << 30) == ["numpy", "pandas"]


def test_bad_settings_say_what_is_wrong():
    with pytest.raises(prestart.PrestartSettingsError, match="command"):
        prestart.parse_settings(json.dumps({"version": 1, "timeoutSeconds": 5}))
    with pytest.raises(prestart.PrestartSettingsError, match="not valid JSON|Expecting"):
        prestart.parse_settings("{")


def test_files_an_earlier_run_left_never_run_before_the_next_run_and_shadow_as_cold(tmp_path):
    """A session's run leaves resource.py (which the prestart's own imports would have found first on `-c`'s path)
    and json.py (which a cold start's `import json` finds in the work dir): the next run's process runs neither
    before its run, and a run whose files stand for a module already imported starts cold to see its own."""
    plant = ("open('resource.py', 'w').write('print(\"INJECTED\")')\n"
             "open('json.py', 'w').write('X = \"the run\\'s own json\"')\n")
    documents = [(f"{i:032x}", run_entries(code)) for i, code in enumerate(
        (plant, "import json\nprint(json.X)", "print('after')"))]
    frames = session_runs(tmp_path, documents)
    assert [f["stdout"] for f in frames] == ["", "the run's own json\n", "after\n"], frames
    assert "prestarted" not in frames[1]  # json.py shadows the json the prestart imported: it started cold


NODE = {"language": "javascript", "command": ["node", "main.js"], "codeFile": "main.js"}
NODE_PROGRAMS = {
    "view": "const fs = require('fs');\n"
            "console.log(JSON.stringify({argv: process.argv.slice(1), execArgv: process.execArgv,\n"
            "  env: Object.keys(process.env), cwd: process.cwd(), file: __filename, main: require.main === module,\n"
            "  cache: Object.keys(require.cache), fds: fs.readdirSync('/proc/self/fd').length,\n"
            "  paths: Object.keys(require('module')._pathCache).filter((k) => !k.includes('main.js')),\n"
            "  stdin: fs.readFileSync(0, 'utf8'), opened: fs.openSync('/dev/null')}));\n",
    "uncaught": "function inner() {\n  null.x;\n}\nfunction outer() { inner(); }\nouter();\n",
    "throw-later": "setTimeout(() => { throw new RangeError('later'); }, 10);\n",
    "rejection": "Promise.reject(new TypeError('rejected'));\n",
    "exit-code": "console.log('before');\nprocess.exitCode = 3;\n",
    "signal": "console.log('kept');\nprocess.kill(process.pid, 'SIGTERM');\nsetTimeout(() => {}, 1000);\n",
    "syntax-error": "const x = (;\n",
    "worker": "const { Worker } = require('worker_threads');\n"
              "new Worker(\"const { parentPort } = require('worker_threads');\\n"
              "console.log(JSON.stringify([process.execArgv, Object.keys(require.cache).length]));\", {eval: true});\n",
}


@pytest.mark.parametrize("name", sorted(NODE_PROGRAMS))
def test_a_prestarted_node_program_ends_as_the_same_program_cold(tmp_path, name):
    """The stack of an uncaught error (Node's own entry point runs main.js), argv, execArgv, the environment, the
    module cache, exit codes and signals, a worker (which runs the parent's preloads) as cold."""
    frames = {}
    for mode, directory in (("cold", "a"), ("prestarted", "b")):  # paths of one length: byte counts compare
        (tmp_path / directory).mkdir()
        run = runner_in(tmp_path / directory)(NODE_PROGRAMS[name], warm_nonce=NONCE, prestart=mode == "prestarted",
                                              **NODE)
        frames[mode] = comparable(run.frame, str(tmp_path / directory))
        assert run.frame.get("prestarted", False) is (mode == "prestarted"), run.frame
    assert frames["prestarted"] == frames["cold"]
    if name == "view":
        view = json.loads(frames["prestarted"]["stdout"])
        assert view["argv"] == ["<base>/scratch/work/main.js"] and view["execArgv"] == [] and view["main"], view
        assert view["cache"] == ["<base>/scratch/work/main.js"] and view["paths"] == [], view
        assert "CODERUN_PRESTART_FD" not in view["env"] and view["stdin"] == "", view
    if name == "uncaught":
        assert "at node:internal/main/run_main_module" in frames["cold"]["stderr"], frames["cold"]
        assert frames["cold"]["error"]["line"] == 2, frames["cold"]["error"]


def test_a_node_run_with_stdin_starts_cold_and_reads_it(run_runner):
    run = run_runner("process.stdout.write(require('fs').readFileSync(0, 'utf8'))", stdin=b"from stdin",
                     warm_nonce=NONCE, prestart=True, **NODE)
    assert run.frame["stdout"] == "from stdin" and "prestarted" not in run.frame, run.frame


def test_a_node_run_that_sets_a_startup_variable_starts_cold_and_sees_it(run_runner):
    run = run_runner("console.log(process.execArgv.length, process.env.NODE_OPTIONS)", warm_nonce=NONCE,
                     prestart=True, env={"NODE_OPTIONS": "--max-old-space-size=64"}, **NODE)
    assert run.frame["stdout"] == "0 --max-old-space-size=64\n" and "prestarted" not in run.frame, run.frame


def test_a_node_run_that_brings_a_package_json_runs_prestarted_and_loads_as_it_says(run_runner):
    """The prestarted node looks up main.js's package scope only once the run is in the work dir: a run's own
    package.json (here: ES modules) counts as in a cold start."""
    run = run_runner("console.log(typeof require)", input_files={"package.json": b'{"type": "module"}'},
                     warm_nonce=NONCE, prestart=True, **NODE)
    assert run.frame["stdout"] == "undefined\n" and run.frame["prestarted"] is True, run.frame


def test_a_node_session_runs_each_program_prestarted_and_a_package_json_an_earlier_run_left_counts(tmp_path):
    """A Node session (a fresh process per run): files persist, each run takes the node started as the last ended,
    and a package.json an earlier run left decides how the next run loads, as cold. A keepState Node session is not
    served: one interpreter for every run is Python's only."""
    codes = ["require('fs').writeFileSync('kept.txt', 'from run 1')",
             "console.log(require('fs').readFileSync('kept.txt', 'utf8'), typeof require)",
             "require('fs').writeFileSync('package.json', '{\"type\": \"module\"}')",
             "console.log(typeof require)"]
    documents = [(f"{i:032x}", run_entries(code, **NODE)) for i, code in enumerate(codes)]
    frames = session_runs(tmp_path, documents)
    assert [f["reason"] for f in frames] == ["Completed"] * 4, frames
    assert [f["stdout"] for f in frames[1:]] == ["from run 1 function\n", "", "undefined\n"], frames
    assert [f.get("prestarted", False) for f in frames] == [True] * 4
    assert not prestart.start_program({**run_spec(**NODE), "memoryBytes": None}, str(tmp_path), {"HOME": "/nowhere"},
                                      None, keep=True)


# A run that moves its work dir under a package.json of its own (the work dir a link to it) whose "exports" name a
# file of its own for any request: a node started with its working dir there would load that file as its preload,
# take the next run's word, and write that run's output (found in review). Started in /, it never looks there.
HIJACK = r"""
const fs = require('fs'), path = require('path');
const scratch = path.dirname(process.cwd());
fs.mkdirSync(scratch + '/a/b', {recursive: true});
fs.renameSync(scratch + '/work', scratch + '/a/b/c');
fs.symlinkSync(scratch + '/a/b/c', scratch + '/work');
fs.writeFileSync(scratch + '/a/package.json', JSON.stringify({name: '', exports: {'./*': './evil.js'}}));
fs.writeFileSync(scratch + '/a/evil.js', `
  const fs = require('fs');
  const fd = Number(process.env.CODERUN_PRESTART_FD);
  const buf = Buffer.alloc(1 << 20); const n = fs.readSync(fd, buf, 0, buf.length, null);
  fs.writeFileSync('${scratch}/stolen-word.json', buf.subarray(0, n));
  const word = JSON.parse(buf.subarray(0, n).toString());
  for (const k of Object.keys(process.env)) delete process.env[k];
  Object.assign(process.env, word.env);
  fs.writeSync(fd, '0.000001\n'); fs.closeSync(fd);
  const w = process.stdout.write.bind(process.stdout);
  process.stdout.write = (s, ...a) => w('FORGED ' + s, ...a);
`);
"""


def test_a_node_run_cannot_make_a_later_runs_node_load_a_file_of_its_own(tmp_path):
    codes = [HIJACK, "console.log('run 2')",
             "console.log(require('fs').existsSync(require('path').resolve('../../../stolen-word.json')))"]
    documents = [(f"{i:032x}", run_entries(code, **NODE)) for i, code in enumerate(codes)]
    frames = session_runs(tmp_path, documents)
    assert [(f["reason"], f["stdout"]) for f in frames] == [
        ("Completed", ""), ("Completed", "run 2\n"), ("Completed", "false\n")], frames
    assert [f.get("prestarted", False) for f in frames] == [True] * 3
    assert frames[1]["metrics"]["cpuMillis"] > 0, frames[1]["metrics"]  # no forged start of 1 µs


def test_a_worker_of_a_program_that_names_a_channel_reads_nothing_from_it(run_runner):
    """Only the main thread's preload takes the run's word: a program that sets the variable naming the channel
    (here, its own stdin) before it starts a worker gets a worker that starts as a cold run's would."""
    code = ("process.env.CODERUN_PRESTART_FD = '0';\n"
            "const { Worker } = require('worker_threads');\n"
            "new Worker(\"console.log('worker', process.execArgv.length)\", {eval: true})"
            ".on('exit', () => console.log('stdin', require('fs').readFileSync(0, 'utf8').length));\n")
    run = run_runner(code, warm_nonce=NONCE, prestart=True, **NODE)
    assert run.frame["stdout"] == "worker 0\nstdin 0\n" and run.frame["prestarted"] is True, run.frame
