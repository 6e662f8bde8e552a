"""Every example in examples/ run as its user runs it, against the real cluster: a subprocess with this venv's
Python (or bash and kubectl), KUBECONFIG pointing at the cluster and a fresh test namespace, given as an argument
or as the kubeconfig context's namespace; each test reads what the example printed.

The framework examples (openai_agents_agent.py, langchain_tools.py, llamaindex_agent.py) need a model's API key:
here they run against the cluster with a scripted model, in the frameworks' venv (tests/frameworks/on_cluster.py),
and tests/frameworks/test_examples.py drives them against the fake API server. agent-rbac.yaml is applied and
used as a ServiceAccount by e2e/test_sdk.py (test_the_agent_role_example_is_all_an_agents_service_account_needs)."""
import hashlib
import json
import os
import subprocess
import sys

import anyio
import yaml
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from coderun.client.result import result_from_object
from coderun.tools import render_result
from conftest import KUBECONFIG, REPO

EXAMPLES = REPO / "examples"
CODERUN = os.path.join(os.path.dirname(sys.executable), "coderun")


# The frameworks' own venv (the Makefile's FRAMEWORKS_VENV, made by make test-frameworks), whose Python runs
# tests/frameworks/on_cluster.py: the e2e tier's venv has no agent framework.
FRAMEWORKS_PYTHON = os.environ.get("CODERUN_FRAMEWORKS_PYTHON", "")


def run_example(*command: str, kubeconfig=KUBECONFIG, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), capture_output=True, text=True, cwd=cwd, timeout=300,
                          env={**os.environ, "KUBECONFIG": str(kubeconfig), **(env or {})})


def python_example(name: str, *args: str, **kw) -> subprocess.CompletedProcess:
    return run_example(sys.executable, str(EXAMPLES / name), *args, **kw)


def kubeconfig_in(namespace: str, tmp_path) -> str:
    """A copy of the cluster's kubeconfig whose current context names `namespace`, as `kubectl config
    set-context --current --namespace` leaves it."""
    config = yaml.safe_load(KUBECONFIG.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    context["context"]["namespace"] = namespace
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_sdk_sync_takes_the_kubeconfigs_namespace(operator, namespace, tmp_path):
    done = python_example("sdk_sync.py", kubeconfig=kubeconfig_in(namespace, tmp_path))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"namespace: {namespace}"
    assert lines[1].startswith("run-") and lines[1].endswith(": Succeeded (Completed), exit code 0, stdout '42\\n'")
    assert lines[2].endswith(": Failed (NonZeroExit), exit code 1, error ZeroDivisionError at line 3")


def test_sdk_async_runs_them_together(operator, namespace):
    done = python_example("sdk_async.py", "-n", namespace, "--runs", "4")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"namespace: {namespace}"
    assert [line.split(" (")[0] for line in lines[1:5]] == [f"{n} ** 2 = {n * n}" for n in range(4)]
    assert all(line.endswith(": Succeeded)") for line in lines[1:5]) and lines[5].startswith("4 runs in ")


def test_plot_artifact_saves_the_runs_png(operator, cluster, namespace, tmp_path):
    done = python_example("plot_artifact.py", "-n", namespace, "-o", "chart.png", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    saved = tmp_path / "chart.png"
    png = saved.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert lines[-1] == f"saved {saved} ({len(png)} bytes)"
    run = lines[1].split(":")[0]
    artifacts = cluster.get_run(namespace, run)["status"]["artifacts"]
    assert [(a["name"], a["size"], a["sha256"]) for a in artifacts] == [
        ("plot.png", len(png), hashlib.sha256(png).hexdigest())]


def test_mcp_client_lists_the_tools_and_runs_code(operator, namespace):
    done = python_example("mcp_client.py", "-n", namespace)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "tools: run_code, list_runtimes"
    assert "exit code 0 (Completed)" in lines and lines[-1] == f"namespace: {namespace}, exitCode: 0"


def test_the_mcp_host_config_starts_a_working_server(operator, namespace):
    """examples/mcp-client-config.json as a desktop host reads it: its command, args and env, with the
    placeholders (the install path, the namespace `agents`, the kubeconfig) replaced by this machine's."""
    server = json.loads((EXAMPLES / "mcp-client-config.json").read_text())["mcpServers"]["coderun"]
    args = [namespace if arg == "agents" else arg for arg in server["args"]]
    assert args != server["args"], "the example names the namespace agents"
    params = StdioServerParameters(command=CODERUN, args=args,
                                   env={**server["env"], "KUBECONFIG": str(KUBECONFIG)})

    async def session_main():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await session.call_tool("run_code", {"code": "print(6*7)"})
    result = anyio.run(session_main)
    assert not result.is_error, result.content
    assert (result.structured_content["namespace"], result.structured_content["stdout"]) == (namespace, "42\n")


def test_demo_sh_waits_for_finished_with_kubectl(operator, cluster, namespace):
    """demo.sh applies coderun.yaml and waits with `kubectl wait --for=condition=Finished`, as the README's first
    kubectl run does."""
    done = run_example("bash", str(EXAMPLES / "demo.sh"), cluster.kubectl_bin, namespace)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "phase:     Succeeded (Completed), exit code 0" in done.stdout
    assert "average conversion rate: 3.13%" in done.stdout
    status = cluster.get_run(namespace, "conversion-rate")["status"]
    finished = next(c for c in status["conditions"] if c["type"] == "Finished")
    assert finished["status"] == "True"


def test_the_framework_examples_answer_from_the_runs_the_cluster_made(operator, cluster, namespace):
    """Each framework's agent (a scripted model: it calls run_code with print(6*7), then answers with what the tool
    returned) hands the model exactly the rendering of the CodeRun the cluster ran for it."""
    assert os.path.isfile(FRAMEWORKS_PYTHON), (
        "CODERUN_FRAMEWORKS_PYTHON names no Python: run this through make (test, test-e2e-chart or test-e2e), "
        "which makes the frameworks' venv and sets it")
    # The clone's src first (the venv holds a copy of coderun), and scripted.py beside the driver.
    path = os.pathsep.join([str(REPO / "src"), str(REPO / "tests" / "frameworks")])
    done = run_example(FRAMEWORKS_PYTHON, str(REPO / "tests" / "frameworks" / "on_cluster.py"), namespace,
                       env={"PYTHONPATH": path})
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.splitlines()[-1])
    runs = json.loads(cluster.kubectl("get", "coderuns", "-n", namespace, "-o", "json").stdout)["items"]
    assert [(r["spec"]["code"], r["status"]["phase"]) for r in runs] == [("print(6*7)", "Succeeded")] * 3
    renderings = {render_result(result_from_object(run)) for run in runs}
    assert set(answers) == {"openai-agents", "langchain", "llamaindex"}
    for framework, answer in answers.items():
        assert answer in renderings and "42" in answer, (framework, answer)
