"""examples/sdk_sync.py and sdk_async.py in CI, with no cluster: each runs as its user runs it (a Python process,
the kubeconfig from KUBECONFIG) against the fake API server over HTTP. The fake plays the operator by running each
created program here and writing its result, so the examples print what the programs did. (On the real cluster:
e2e/test_examples.py.)"""
import contextlib
import io
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from unit.fake_api import FakeApiServer

EXAMPLES, SRC = (Path(__file__).parents[2] / d for d in ("examples", "src"))


def example(name: str, *args: str, kubeconfig) -> subprocess.CompletedProcess:
    """The example in a process of its own, importing this checkout's coderun (its `coderun mcp` too)."""
    path = os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                          env={**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": path}, timeout=60)


def ran(code: str) -> dict:
    """The status the operator would write for `code`, from running it here (trusted test programs only)."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, "main.py", "exec"), {})
    except Exception as e:
        line = traceback.extract_tb(sys.exc_info()[2])[-1].lineno
        return {"phase": "Failed", "reason": "NonZeroExit", "exitCode": 1, "stdout": out.getvalue(),
                "error": {"type": type(e).__name__, "message": str(e), "line": line}}
    return {"phase": "Succeeded", "reason": "Completed", "exitCode": 0, "stdout": out.getvalue()}


@pytest.fixture
def api(tmp_path):
    server = FakeApiServer().start()
    server.outcome = ran
    server.on_create = lambda obj: server.finish(obj["metadata"]["namespace"], obj["metadata"]["name"],
                                                 server.outcome(obj["spec"]["code"]))
    server.kubeconfig_path = server.kubeconfig(tmp_path / "kubeconfig", namespace="agents")
    yield server
    server.stop()


def test_sdk_sync_prints_each_result_from_the_kubeconfigs_namespace(api):
    done = example("sdk_sync.py", kubeconfig=api.kubeconfig_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "namespace: agents"
    assert lines[1].endswith(": Succeeded (Completed), exit code 0, stdout '42\\n'")
    assert lines[2].endswith(": Failed (NonZeroExit), exit code 1, error ZeroDivisionError at line 3")
    assert {ns for ns, _ in api.runs} == {"agents"}


def test_sdk_sync_fails_when_the_failing_program_reports_no_error(api):
    api.outcome = lambda code: {"phase": "Succeeded", "reason": "Completed", "exitCode": 0, "stdout": ""}
    done = example("sdk_sync.py", "-n", "team-a", kubeconfig=api.kubeconfig_path)
    assert done.returncode == 1 and done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0] == "namespace: team-a" and lines[2].endswith("exit code 0, error none")
    assert {ns for ns, _ in api.runs} == {"team-a"}


def test_sdk_sync_reports_an_unusable_kubeconfig_in_one_line(tmp_path):
    done = example("sdk_sync.py", kubeconfig=tmp_path / "missing")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error: no usable Kubernetes configuration") and done.stderr.count("\n") == 1


def test_sdk_async_runs_them_all(api):
    done = example("sdk_async.py", "-n", "team-a", "--runs", "6", kubeconfig=api.kubeconfig_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(" (")[0] for line in lines[1:7]] == [f"{n} ** 2 = {n * n}" for n in range(6)]
    assert lines[7].startswith("6 runs in ") and len(api.runs) == 6


def test_sdk_async_fails_when_a_run_failed(api):
    api.outcome = lambda code: ran(code if "3 **" not in code else "1 / 0")
    done = example("sdk_async.py", "--runs", "4", kubeconfig=api.kubeconfig_path)
    assert done.returncode == 1 and done.stderr == ""
    assert "3 ** 2 =  (" in done.stdout and ": Failed)" in done.stdout


def test_mcp_client_launches_the_server_and_runs_code(api):
    """examples/mcp_client.py starts `coderun mcp` (beside this Python) over stdio, as a host would."""
    done = example("mcp_client.py", "-n", "team-a", kubeconfig=api.kubeconfig_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "tools: run_code, list_runtimes"
    assert "exit code 0 (Completed)" in lines and lines[-1] == "namespace: team-a, exitCode: 0"
    assert [spec["spec"]["code"] for spec in api.runs.values()] == ["print(6*7)"]
