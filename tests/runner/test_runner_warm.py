"""The runner as a warm pool pod runs it (`--input-stdin`): the input arrives on stdin after the runner started,
the runner says it accepted it, and its frame carries the operator's nonce. A short or malformed stream never
runs the program."""

import hashlib
import json

import pytest

from support.runner import last_frame_line, runner_in, warm_document

NONCE = "0123456789abcdef" * 4


def test_the_input_on_stdin_runs_like_a_mounted_configmap(run_runner, tmp_path):
    (tmp_path / "cold").mkdir()
    cold = runner_in(tmp_path / "cold")("import sys; print(open('data.txt').read(), sys.stdin.read())",
                      input_files={"data.txt": b"from a file"}, stdin=b"from stdin")
    warm = run_runner("import sys; print(open('data.txt').read(), sys.stdin.read())",
                      input_files={"data.txt": b"from a file"}, stdin=b"from stdin", warm_nonce=NONCE)
    assert warm.frame["stdout"] == cold.frame["stdout"] == "from a file from stdin\n"
    assert warm.frame["reason"] == cold.frame["reason"] == "Completed"
    assert warm.frame["nonce"] == NONCE and "nonce" not in cold.frame
    # The digest in the termination message still vouches for the frame (the durable path).
    assert warm.termination["frameSha256"] == hashlib.sha256(warm.frame_json).hexdigest()


def test_the_runner_announces_the_accepted_input_before_the_program_runs(run_runner):
    run = run_runner("print('program output')", warm_nonce=NONCE)
    lines = run.raw_stdout.decode().split("\n")
    accepted = [i for i, line in enumerate(lines) if line.startswith("CODERUN-ACCEPTED ")]
    frame = [i for i, line in enumerate(lines) if line.startswith("CODERUN-RESULT-V1 ")]
    assert accepted and frame and accepted[0] < frame[0]
    # Only a hash of the nonce appears before the frame: nothing printed early can be replayed as a frame.
    assert lines[accepted[0]] == "CODERUN-ACCEPTED " + hashlib.sha256(NONCE.encode()).hexdigest()[:16]


def test_the_program_cannot_read_the_nonce(run_runner):
    """Everything the program can read of its input, its scratch and its environment: no nonce."""
    code = ("import os\n"
            "for root, _, files in os.walk(os.path.dirname(os.path.dirname(os.getcwd()))):\n"
            "    for f in files:\n"
            "        try: print(open(os.path.join(root, f), errors='replace').read())\n"
            "        except OSError: pass\n"
            "print(os.environ)\n")
    run = run_runner(code, warm_nonce=NONCE, input_files={"data.txt": b"FILE-CONTENT"})
    assert "FILE-CONTENT" in run.frame["stdout"] and "version" in run.frame["stdout"]
    assert NONCE not in run.frame["stdout"] and NONCE[:16] not in run.frame["stdout"]


def test_a_stream_cut_short_never_runs_the_program(run_runner, tmp_path):
    marker = tmp_path / "ran"
    full = warm_document({"code": f"open({str(marker)!r}, 'w')".encode(),
                          "run.json": json.dumps({"version": 1}).encode()}, NONCE)
    for cut in (b"", full[:3], full[:len(full) // 2], full[:-1]):
        run = run_runner("unused", warm_stream=cut)
        assert run.frame["reason"] == "InputIncomplete", (cut[:20], run.frame)
        assert "nonce" not in run.frame and b"CODERUN-ACCEPTED" not in run.raw_stdout
    assert not marker.exists()


def test_a_malformed_stream_is_invalid_input_naming_the_problem(run_runner):
    body = json.dumps({"nonce": "not-hex", "data": {}}).encode()
    cases = {
        b"12x\n{}": "length line",
        b"99999999999\n": "larger than",
        b"%d\n%s" % (len(body), body): "nonce",
        b"5\n[1,2]": "JSON object",
        b"6\n{\"a\":1": "not valid JSON",
    }
    for stream, words in cases.items():
        run = run_runner("unused", warm_stream=stream)
        assert run.frame["reason"] == "InvalidInput" and words in run.frame["message"], (stream, run.frame)


def test_a_bad_key_in_the_document_is_refused(run_runner):
    body = json.dumps({"nonce": NONCE, "data": {"../escape": "x"}}).encode()
    run = run_runner("unused", warm_stream=b"%d\n%s" % (len(body), body))
    assert run.frame["reason"] == "InvalidInput" and "ConfigMap key" in run.frame["message"]
    assert last_frame_line(run.raw_stdout)


# The program's view of where it runs: its scratch dir, its work dir, its environment and its rlimits.
VIEW = """import json, os, resource
print(json.dumps({"scratch": sorted(os.listdir("..")), "work": sorted(os.listdir(".")), "env": dict(os.environ),
                  "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource)
                              if n.startswith("RLIMIT_")}}))
"""


def test_a_warm_program_sees_what_a_cold_one_sees_and_its_input_counts_once(tmp_path):
    """Two 250 KB input files and 400 KB written under a 1 MiB disk limit: within it, warm or cold (the warm
    input is not a second copy under the scratch dir the limit measures)."""
    code = VIEW + "open('out.bin', 'wb').write(b'w' * 400_000)\n"
    files = {"data/a.bin": b"a" * 250_000, "data/b.bin": b"b" * 250_000}
    runs = {}
    for mode, nonce in (("cold", None), ("warm", NONCE)):
        (tmp_path / mode).mkdir()
        runs[mode] = runner_in(tmp_path / mode)(code, input_files=files, diskBytes=1 << 20, warm_nonce=nonce)
        assert runs[mode].frame["reason"] == "Completed", (mode, runs[mode].frame)
    warm, cold = (json.loads(runs[m].frame["stdout"].replace(str(tmp_path / m), "<base>")) for m in ("warm", "cold"))
    assert warm == cold and warm["scratch"] == ["home", "outputs", "work"] and warm["work"] == ["data", "main.py"]
    # The warm runner wrote its input where it was told (a pool pod's own volume at the ConfigMap's path), one file
    # per key as the ConfigMap mount has them.
    assert sorted(p.name for p in (tmp_path / "warm" / "input").iterdir()) == ["code", "file-0", "file-1", "run.json"]


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_as_pid1_the_program_can_neither_list_nor_change_the_raw_input(run_runner, as_pid1, tmp_path, warm):
    code = f"""import os
input_dir = {str(tmp_path / "input")!r}
print(sorted(os.listdir(input_dir)))
try:
    open(os.path.join(input_dir, "planted"), "w")
    print("written")
except OSError as e:
    print(type(e).__name__, e.errno)
print(open("data.txt").read())
"""
    run = run_runner(code, input_files={"data.txt": b"laid out"}, stdin=b"", wrapper=as_pid1,
                     warm_nonce=NONCE if warm else None)
    assert run.frame["stdout"].splitlines() == ["[]", "OSError 30", "laid out"], run.frame  # EROFS
    assert not (tmp_path / "input" / "planted").exists()
