"""The Python SDK against the real cluster and operator: typed results, typed errors, a watch that drops."""
import asyncio
import time

import pytest

from coderun.client import (AsyncCodeRunClient, CodeRunClient, PolicyDenied, RunNotFound, RunRequest, RunTimeout,
                            WaitStats)
from conftest import KUBECONFIG, wait_for


@pytest.fixture
def client(operator, namespace) -> CodeRunClient:
    return CodeRunClient(namespace, kubeconfig=str(KUBECONFIG), client_name="e2e-sdk")


def test_run_returns_the_typed_result(client, namespace):
    result = client.run("print(6*7)", labels={"agent": "alice"})
    assert result.stdout == "42\n"
    assert (result.phase, result.reason, result.exit_code) == ("Succeeded", "Completed", 0)
    assert result.namespace == namespace and result.name.startswith("run-")
    # queue and total are measured from the SDK's millisecond created-at annotation
    assert result.metrics.queue_millis is not None and result.metrics.total_millis >= result.metrics.wall_millis
    mine = client.list(mine=True, labels={"agent": "alice"})
    assert [r.name for r in mine] == [result.name]
    assert mine[0].labels["coderun.io/client"] == "e2e-sdk"
    assert client.list(labels={"agent": "bob"}) == []


@pytest.mark.parametrize("kwargs,rule,hint", [
    ({"language": "ruby"}, "runtimes", "use one of: javascript, python"),
    ({"limits": {"memory": "4Gi"}}, "maximums.memory", "ask for at most 2Gi"),
])
def test_a_policy_denial_raises_with_the_rule(client, kwargs, rule, hint):
    with pytest.raises(PolicyDenied) as denied:
        client.run("print(1)", **kwargs)
    assert denied.value.rule == rule and hint in denied.value.message
    assert denied.value.result.phase == "Rejected" and denied.value.result.pod_name is None


def test_a_failing_program_is_a_result_with_the_error_line(client):
    result = client.run("rows = [1, 2]\ntotal = sum(rows)\nprint(total / 0)\n")
    assert (result.phase, result.reason, result.exit_code) == ("Failed", "NonZeroExit", 1)
    assert (result.error.type, result.error.line) == ("ZeroDivisionError", 3)
    assert "ZeroDivisionError" in result.stderr


def test_the_programs_own_timeout_is_a_result_but_the_callers_wait_raises(client):
    timed_out = client.run("import time\ntime.sleep(30)", timeout=1)
    assert timed_out.timed_out and timed_out.phase == "Failed"

    started = time.monotonic()
    with pytest.raises(RunTimeout) as waited:
        client.run("import time\ntime.sleep(30)", timeout=20, wait_timeout=2)
    assert time.monotonic() - started < 10
    assert waited.value.last is not None and not waited.value.last.finished
    assert client.delete(waited.value.name) is True
    wait_for(lambda: _gone(client, waited.value.name), 60, f"{waited.value.name} to be deleted")
    assert client.delete(waited.value.name) is False  # already gone is not an error


def _gone(client, name) -> bool:
    try:
        client.get(name)
        return False
    except RunNotFound:
        return True


def test_a_watch_that_drops_is_survived(operator, namespace):
    # Every watch request ends server-side after 1 s, so a 3 s program outlives several of them.
    client = CodeRunClient(namespace, kubeconfig=str(KUBECONFIG), watch_seconds=1)
    created = client.create(RunRequest(code="import time\ntime.sleep(3)\nprint('survived')"))
    stats = WaitStats()
    result = client.wait(created.name, timeout=90, stats=stats)
    assert result.stdout == "survived\n"
    assert stats.watches >= 3 and stats.lists >= stats.watches  # each ended watch: list again, watch again
    # It saw the run unfinished before it saw it end. Whether "Running" shows in between depends on how soon
    # the operator sees the pod start on a loaded node, so it is not asserted.
    assert stats.phases[-1] == "Succeeded" and stats.phases[-2] in ("", "Pending", "Running")


def test_files_stdin_and_artifact_bytes(client):
    code = ("import os, sys\n"
            "rows = open('in/data.csv').read().splitlines()[1:]\n"
            "name = sys.stdin.read().strip()\n"
            "out = os.path.join(os.environ['CODERUN_OUTPUT_DIR'], 'blob.bin')\n"
            "open(out, 'wb').write(bytes(range(256)) + name.encode())\n"
            "print(len(rows), name)\n")
    result = client.run(code, files={"in/data.csv": "x\n1\n2\n3\n"}, stdin="ada\n")
    assert result.stdout == "3 ada\n"
    assert [a.name for a in result.artifacts] == ["blob.bin"]
    assert client.artifact(result, "blob.bin") == bytes(range(256)) + b"ada"
    assert client.artifacts(result) == {"blob.bin": bytes(range(256)) + b"ada"}


def test_the_async_client_runs_concurrently_reads_artifacts_and_cancels_a_wait(operator, namespace):
    artifact = "import os; open(os.environ['CODERUN_OUTPUT_DIR'] + '/out.txt', 'w').write('async')"

    async def scenario():
        async with AsyncCodeRunClient(namespace, kubeconfig=str(KUBECONFIG)) as client:
            results = await asyncio.gather(*(client.run(f"print({n} * 2)", limits={"cpu": "500m"}) for n in (3, 4)),
                                           client.run(artifact))
            files = await client.artifacts(results[2])
            slow = await client.run("import time; time.sleep(60)", timeout=90, wait=False)
            seen = asyncio.Event()
            waiting = asyncio.create_task(client.wait(slow.name, timeout=120, on_update=lambda r: seen.set()))
            await asyncio.wait_for(seen.wait(), 30)  # it has listed the run and goes on to watch it
            cancelled_at = asyncio.get_running_loop().time()
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            cancel_seconds = asyncio.get_running_loop().time() - cancelled_at
            assert await client.delete(slow.name)
            return results, files, cancel_seconds

    results, files, cancel_seconds = asyncio.run(scenario())
    assert [r.stdout for r in results[:2]] == ["6\n", "8\n"]
    assert len({r.name for r in results}) == 3
    assert files == {"out.txt": b"async"}
    assert cancel_seconds < 1

def test_the_agent_role_example_is_all_an_agents_service_account_needs(cluster, operator, namespace):
    """examples/agent-rbac.yaml applied as docs/operations.md says, the SDK authenticated as that ServiceAccount
    (its own token, not the admin's): a run, its wait, its artifact, the policy's runtimes, list and delete all
    work; listing ConfigMaps, writing a policy or the run's status do not."""
    import copy

    from kubernetes import client as kubernetes_client

    from conftest import REPO
    cluster.kubectl("apply", "-n", namespace, "-f", str(REPO / "examples" / "agent-rbac.yaml"))
    token = cluster.kubectl("create", "token", "coderun-agent", "-n", namespace).stdout.strip()
    configuration = copy.deepcopy(cluster.api.configuration)
    configuration.cert_file = configuration.key_file = None
    configuration.api_key = {"authorization": f"Bearer {token}"}
    agent = CodeRunClient(namespace, api_client=kubernetes_client.ApiClient(configuration), client_name="e2e-agent")
    result = agent.run("import os\nopen(os.path.join(os.environ['CODERUN_OUTPUT_DIR'], 'a.txt'), 'w').write('hi')\n"
                       "print(6 * 7)")
    assert (result.phase, result.stdout) == ("Succeeded", "42\n"), result.message
    assert agent.artifact(result, "a.txt") == b"hi"
    assert {r.language for r in agent.runtimes()} and [r.name for r in agent.list(mine=True)] == [result.name]
    assert agent.delete(result.name)
    account = f"system:serviceaccount:{namespace}:coderun-agent"
    for verb, resource, *subresource in [("list", "configmaps"), ("create", "coderunpolicies.coderun.io"),
                                         ("patch", "coderuns.coderun.io", "--subresource=status"),
                                         ("approve", "coderuns.coderun.io")]:
        answer = cluster.kubectl("auth", "can-i", verb, resource, *subresource, "-n", namespace, "--as", account,
                                 check=False)
        assert answer.stdout.strip() == "no", (verb, resource, subresource)
