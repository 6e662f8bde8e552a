"""Helpers to run the real sandbox runner on a ConfigMap-shaped input dir."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
FRAME_PREFIX = b"CODERUN-RESULT-V1 "
NOBODY = 65534
# The runner and the program run as nobody with this interpreter (the test's own may live under /root).
SYSTEM_PYTHON = "/usr/bin/python3"


def lay_out_runner(root: Path) -> Path:
    """root as a sandbox image's /opt/coderun (e2e/images/recipes/python.sh), its files linked to the source tree:
    the runner package with its parents' __init__.py, and the package's __main__.py beside them. The runner is
    run as in the pod: `python3 -I root`."""
    package = root / "coderun" / "sandbox" / "runner"
    package.parent.mkdir(parents=True)
    for relative in ("coderun/__init__.py", "coderun/sandbox/__init__.py", "coderun/sandbox/runner"):
        (root / relative).symlink_to(SRC / relative)
    (root / "__main__.py").symlink_to(SRC / "coderun/sandbox/runner/__main__.py")
    return root


@dataclasses.dataclass
class RunnerRun:
    frame: dict
    frame_json: bytes
    termination: dict
    raw_stdout: bytes
    returncode: int
    elapsed: float
    work: Path
    outputs: Path
    termination_log: Path

    @property
    def frame_text(self) -> str:
        return self.frame_json.decode()


def write_configmap_dir(input_dir: Path, entries: dict[str, bytes]) -> None:
    """Lay the keys out as the kubelet does: real files in a timestamped dir,
    `..data` pointing at it, and one symlink per key through `..data`."""
    version_dir = input_dir / "..2024_01_01_00_00_00.000000001"
    version_dir.mkdir(parents=True)
    for key, content in entries.items():
        (version_dir / key).write_bytes(content)
        (input_dir / key).symlink_to(Path("..data") / key)
    (input_dir / "..data").symlink_to(version_dir.name)


def run_spec(**overrides) -> dict:
    spec = {
        "version": 1,
        "language": "python",
        "command": ["python3", "-u", "main.py"],
        "codeFile": "main.py",
        "timeoutSeconds": 5.0,
        "outputBytes": 65536,
        "floodBytes": 1048576,
        "artifacts": {"maxFiles": 16, "maxFileBytes": 262144, "maxTotalBytes": 524288},
        "files": [],
        "stdinKey": None,
        "env": {},
    }
    spec.update(overrides)
    return spec


def last_frame_line(raw_stdout: bytes) -> bytes:
    frames = [line for line in raw_stdout.split(b"\n") if line.startswith(FRAME_PREFIX)]
    assert frames, f"no frame in runner stdout: {raw_stdout[-500:]!r}"
    return frames[-1][len(FRAME_PREFIX):]


def runner_in(tmp_path: Path, owner: int | None = None, interpreter: str = sys.executable):
    """A function run(code, input_files={path: bytes}, stdin=bytes, runner_env={}, raw_run_json=bytes,
    wrapper=(command prefix), cwd=(the runner's working directory), **run.json overrides) that runs the runner with
    everything under tmp_path.
    With owner (a uid), the termination log belongs to that uid, as the runner runs as it (see as_nobody)."""

    def run(code: str | bytes, *, input_files: dict[str, bytes] | None = None, stdin: bytes | None = None,
            runner_env: dict | None = None, raw_run_json: bytes | None = None, wrapper: tuple = (),
            subprocess_timeout: float = 60, warm_nonce: str | None = None, warm_stream: bytes | None = None,
            cwd: Path | None = None, prestart: bool = False,
            **overrides) -> RunnerRun:
        entries = {"code": code.encode() if isinstance(code, str) else code}
        file_refs = []
        for index, (path, content) in enumerate((input_files or {}).items()):
            entries[f"file-{index}"] = content
            file_refs.append({"path": path, "key": f"file-{index}"})
        if stdin is not None:
            entries["stdin"] = stdin
        spec = run_spec(files=file_refs, stdinKey="stdin" if stdin is not None else None)
        spec.update(overrides)
        entries["run.json"] = json.dumps(spec).encode() if raw_run_json is None else raw_run_json
        input_dir = tmp_path / "input"
        source, stream = ["--input", str(input_dir)], None
        if warm_nonce is None and warm_stream is None:
            write_configmap_dir(input_dir, entries)
        else:  # a warm pool pod: the same keys arrive on stdin
            source = ["--input-stdin", "--input", str(input_dir)]
            stream = warm_stream if warm_stream is not None else warm_document(entries, warm_nonce)
            if prestart:  # the pool pod's settings: the run's own run.json, less its program
                source += ["--prestart", json.dumps({k: v for k, v in spec.items() if k not in ("files", "stdinKey")})]
        work, outputs = tmp_path / "scratch" / "work", tmp_path / "scratch" / "outputs"
        termination_log = tmp_path / "termination-log"
        if not termination_log.exists():
            termination_log.write_text("")
            if owner is not None:
                os.chown(termination_log, owner, owner)
        runner_root = tmp_path / "opt-coderun"
        if not runner_root.exists():
            lay_out_runner(runner_root)
        started = time.monotonic()
        proc = subprocess.run(
            [*wrapper, interpreter, "-I", str(runner_root), *source, "--inputs", str(tmp_path / "inputs"),
             "--work", str(work), "--outputs", str(outputs), "--termination-log", str(termination_log)],
            capture_output=True, timeout=subprocess_timeout, input=stream, cwd=cwd,
            env={**os.environ, **(runner_env or {})},
        )
        elapsed = time.monotonic() - started
        frame_json = last_frame_line(proc.stdout)
        termination = json.loads(termination_log.read_bytes())
        return RunnerRun(json.loads(frame_json), frame_json, termination, proc.stdout,
                         proc.returncode, elapsed, work, outputs, termination_log)

    return run


def warm_document(entries: dict[str, bytes], nonce: str) -> bytes:
    """The warm pool's input stream for these ConfigMap keys: length line, then the JSON document."""
    data, binary = {}, {}
    for key, content in entries.items():
        try:
            data[key] = content.decode()
        except UnicodeDecodeError:
            binary[key] = base64.b64encode(content).decode()
    body = json.dumps({"nonce": nonce, "data": data, "binaryData": binary}).encode()
    return b"%d\n" % len(body) + body


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def process_alive(pid: int) -> bool:
    """True while pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.02) -> bool:
    """Poll a predicate with a deadline (no fixed sleeps as synchronisation)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def assert_nothing_after_the_frame(run) -> None:
    """The frame is the runner's last line: nothing the program left behind wrote after it."""
    after_frame = run.raw_stdout.rsplit(b"\nCODERUN-RESULT-V1 ", 1)[1].split(b"\n", 1)[1]
    assert after_frame == b"", after_frame[:200]


SESSION_KEY = bytes(range(32))


def session_stream(documents: list[tuple[str, dict[str, bytes]]], key: bytes = SESSION_KEY,
                   keep_state: bool = False) -> bytes:
    """A session pod's stdin for these (nonce, ConfigMap keys) runs: the first document carries the session's
    settings (its key, keepState), every later one the MAC of its sequence number and body."""
    (nonce, entries), rest = documents[0], documents[1:]
    settings = json.dumps({"key": key.hex(), "keepState": keep_state}).encode()
    return warm_document({**entries, "session.json": settings}, nonce) + b"".join(
        signed_document(sequence, nonce, entries, key) for sequence, (nonce, entries) in enumerate(rest, 1))


def signed_document(sequence: int, nonce: str, entries: dict[str, bytes], key: bytes = SESSION_KEY) -> bytes:
    """The session's sequence-th authenticated document: `<length> <sequence> <mac>`, a newline, the body."""
    from coderun.sandbox.runner.protocol import session_document_mac
    body = warm_document(entries, nonce).split(b"\n", 1)[1]
    return b"%d %d %s\n%s" % (len(body), sequence, session_document_mac(key, sequence, body).encode(), body)


def run_entries(code: str, input_files: dict[str, bytes] | None = None, **overrides) -> dict[str, bytes]:
    """The ConfigMap keys of one run, as runner_in lays them out."""
    entries = {"code": code.encode()}
    for index, (path, content) in enumerate((input_files or {}).items()):
        entries[f"file-{index}"] = content
    spec = run_spec(files=[{"path": p, "key": f"file-{i}"} for i, p in enumerate(input_files or {})])
    spec.update(overrides)
    entries["run.json"] = json.dumps(spec).encode()
    return entries


@dataclasses.dataclass
class SessionRunnerRun:
    frames: list[dict]  # every frame line printed, in order (a program's forgeries too: see `with_nonce`)
    raw_stdout: bytes
    termination: dict | None
    returncode: int
    work: Path

    def with_nonce(self, nonce: str) -> list[dict]:
        return [frame for frame in self.frames if frame.get("nonce") == nonce]


def run_session_runner(tmp_path: Path, stream: bytes, wrapper: tuple = (), interpreter: str = sys.executable,
                       subprocess_timeout: float = 60, mode: tuple = ("--session",)) -> SessionRunnerRun:
    """The real runner with `--session` (or `mode`: a pool pod's `--input-stdin`) on this stdin, everything under
    tmp_path; every frame it printed."""
    runner_root = tmp_path / "opt-coderun"
    if not runner_root.exists():
        lay_out_runner(runner_root)
    work, termination_log = tmp_path / "scratch" / "work", tmp_path / "termination-log"
    termination_log.write_text("")
    proc = subprocess.run(
        [*wrapper, interpreter, "-I", str(runner_root), *mode, "--input", str(tmp_path / "input"),
         "--inputs", str(tmp_path / "inputs"), "--work", str(work), "--outputs", str(tmp_path / "scratch" / "outputs"),
         "--termination-log", str(termination_log)],
        capture_output=True, timeout=subprocess_timeout, input=stream)
    frames = [json.loads(line[len(FRAME_PREFIX):]) for line in proc.stdout.split(b"\n")
              if line.startswith(FRAME_PREFIX)]
    text = termination_log.read_bytes()
    return SessionRunnerRun(frames, proc.stdout, json.loads(text) if text else None, proc.returncode, work)


# Programs a prestarted process must end exactly as a cold one does (test_runner_prestart, test_runner_forkserver).
PROGRAMS = {
    "view": "import json, os, sys\n"
            "print(json.dumps({'argv': sys.argv, 'name': __name__, 'file': os.path.basename(__file__),\n"
            "    'path0': sys.path[0] == os.getcwd(), 'orig': sys.orig_argv[1:], 'cwd': os.path.basename(os.getcwd()),\n"
            "    'env': sorted(os.environ), 'fds': sorted(os.listdir('/proc/self/fd')),\n"
            "    'coderun': [m for m in sys.modules if m.startswith('coderun')],\n"
            "    'main': sys.modules['__main__'].__dict__ is globals(), 'builtins': type(__builtins__).__name__,\n"
            "    'stdin': sys.stdin.read()}))\n",
    "traceback": "def f():\n    raise ValueError('bad value')\n\nf()\n",
    "exit-3": "import sys\nprint('before')\nsys.exit(3)\n",
    "exit-message": "raise SystemExit('a message')\n",
    "keyboard-interrupt": "raise KeyboardInterrupt\n",
    "os-exit": "import os\nprint('kept', flush=True)\nos._exit(7)\n",
    "atexit-and-thread": "import atexit, threading, time\natexit.register(lambda: print('atexit ran'))\n"
                         "threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()\n",
    "syntax-error": "x = (\n",
    "excepthook": "import sys\nsys.excepthook = lambda t, v, tb: print('hooked', t.__name__)\n1/0\n",
}
# What may differ: how long, that it ran prestarted, and the digests of output that names its own tmp dir (the
# output itself is compared, with that dir replaced).
NOT_THE_PROGRAMS = ("metrics", "startedAtMillis", "prestarted", "stdoutSha256", "stderrSha256")


def comparable(frame: dict, base: str) -> dict:
    return {k: (v.replace(base, "<base>") if isinstance(v, str) else v)
            for k, v in frame.items() if k not in NOT_THE_PROGRAMS}


def session_runs(tmp_path, documents, wrapper=(), keep_state=False, pool=False, interpreter=sys.executable):
    """The frames of a session pod's runner (prestarting, as the operator starts it) for these documents; `pool`:
    of a warm pool pod's runner (`--input-stdin`, started for one run) that a session claimed."""
    settings = {k: v for k, v in json.loads(documents[0][1]["run.json"]).items() if k not in ("files", "stdinKey")}
    mode = ("--input-stdin" if pool else "--session", "--prestart", json.dumps(settings),
            *(["--keep-state"] if keep_state and not pool else []))
    return run_session_runner(tmp_path, session_stream(documents, SESSION_KEY, keep_state), wrapper, interpreter,
                              mode=mode).frames
