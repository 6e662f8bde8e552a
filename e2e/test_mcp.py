"""`coderun mcp` through a real MCP client session over stdio and streamable HTTP, against the real cluster:
the policy-shaped tool list, structured results, an image artifact, progress through a long run, and a cancelled
call's run deleted. (No kubeconfig and a dead API server are tests/unit/test_mcp_server.py's: no cluster needed.)"""
import base64
import os
import time

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from coderun.api.coderunpolicy import POLICY_PLURAL
from coderun.api.models import GROUP, VERSION
from coderun.client import CodeRunClient, RunRequest
from coderun.mcp_server import STATIC_SCHEMAS
from coderun.tools import input_schema
from coderun.tools.policy_schema import policy_input_schema
from conftest import KUBECONFIG, wait_for
from framework.mcp import CODERUN, streamable_http_server

# A PNG written by hand (no matplotlib): a 4x4 red square, to $CODERUN_OUTPUT_DIR/plot without a suffix, so
# only its bytes say it is an image.
PNG_PROGRAM = """import os, struct, zlib
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
rows = b"".join(b"\\x00" + b"\\xff\\x00\\x00" * 4 for _ in range(4))
png = (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 4, 8, 2, 0, 0, 0))
       + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
open(os.path.join(os.environ["CODERUN_OUTPUT_DIR"], "plot"), "wb").write(png)
print(len(png))
"""


def in_session(namespace, steps, *extra_args):
    """Start `coderun mcp` as an MCP client would (command + env), run `steps(session)`, return its value."""
    params = StdioServerParameters(command=CODERUN, args=["mcp", "-n", namespace, *extra_args],
                                   env={"KUBECONFIG": str(KUBECONFIG), "PATH": os.environ["PATH"]})

    async def session_main():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await steps(session)
    return anyio.run(session_main)


def test_the_session_lists_the_tools_with_the_sdk_schema(operator, namespace):
    async def steps(session):
        return (await session.list_tools()).tools
    tools = {tool.name: tool for tool in in_session(namespace, steps)}
    assert set(tools) == {"run_code", "list_runtimes"}
    runtimes = CodeRunClient(namespace, kubeconfig=str(KUBECONFIG)).runtimes()
    expected = policy_input_schema(input_schema(RunRequest), runtimes)
    expected["properties"]["session"] = STATIC_SCHEMAS["run_code"]["properties"]["session"]  # MCP's own argument
    assert tools["run_code"].input_schema == expected
    assert "sandbox" in tools["run_code"].description
    assert tools["run_code"].title and tools["run_code"].output_schema["properties"]["exitCode"]
    assert tools["list_runtimes"].annotations.read_only_hint


@pytest.mark.cold_only  # its own `default` policy; a warm namespace has one already
def test_the_run_code_schema_takes_the_namespaces_policy(operator, cluster, namespace):
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy", "metadata": {"name": "default"},
        "spec": {"defaults": {"timeoutSeconds": 30, "memory": "384Mi"}, "maximums": {"timeoutSeconds": 90}}})

    async def steps(session):
        return next(t for t in (await session.list_tools()).tools if t.name == "run_code")
    run_code = in_session(namespace, steps)
    properties = run_code.input_schema["properties"]
    assert (properties["timeout"]["default"], properties["timeout"]["maximum"]) == (30, 90)
    assert properties["memory"]["default"] == "384Mi" and "Policy default:" in run_code.description


def test_the_session_runs_code_and_reports_failures_compactly(operator, namespace):
    async def steps(session):
        ok = await session.call_tool("run_code", {
            "code": "import csv\nprint(sum(int(r['n']) for r in csv.DictReader(open('d.csv'))))",
            "files": [{"path": "d.csv", "content": "n\n19\n23\n"}]})
        broken = await session.call_tool("run_code", {"code": "data = {'a': 1}\nprint(data['b'])\n"})
        denied = await session.call_tool("run_code", {"code": "print(1)", "language": "ruby"})
        runtimes = await session.call_tool("list_runtimes", {})
        return ok, broken, denied, runtimes
    ok, broken, denied, runtimes = in_session(namespace, steps)

    assert not ok.is_error
    # What the program read (the CSV) comes back to the model beside its output (status.audit).
    assert ok.content[0].text == "exit code 0 (Completed)\nstdout (3 bytes):\n42\n" \
                                 "touched: 2 files read (main.py, d.csv), 1 process"
    assert [f["path"] for f in ok.structured_content["audit"]["filesRead"]] == ["main.py", "d.csv"]
    assert (ok.structured_content["exitCode"], ok.structured_content["stdout"]) == (0, "42\n")
    assert ok.structured_content["metrics"]["totalMillis"] > 0
    text = broken.content[0].text
    assert not broken.is_error  # a failing program is a result the model fixes, not a tool error
    assert broken.structured_content["error"] == {"type": "KeyError", "message": "'b'", "line": 2}
    assert text.splitlines()[:3] == ["exit code 1 (NonZeroExit)", "error: KeyError at line 2: 'b'",
                                     "failing line 2: print(data['b'])"]
    assert denied.is_error and "policy rule runtimes" in denied.content[0].text
    assert runtimes.content[0].text.startswith("javascript: image coderun.local/sandbox-node:v2")
    assert "python: image coderun.local/sandbox-python:v2" in runtimes.content[0].text


def test_the_streamable_http_transport_serves_the_same_tools(operator, namespace):
    with streamable_http_server(namespace) as (_, url):
        async def session_main():
            async with streamable_http_client(url) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    names = {tool.name for tool in (await session.list_tools()).tools}
                    return names, await session.call_tool("run_code", {"code": "print(2**10)"})
        names, ran = anyio.run(session_main)
    assert names == {"run_code", "list_runtimes"}
    assert ran.content[0].text == "exit code 0 (Completed)\nstdout (5 bytes):\n1024\n" \
                                  "touched: 1 file read (main.py), 1 process"


def test_an_image_the_program_writes_comes_back_as_an_image(operator, namespace, tmp_path, monkeypatch):
    async def steps(session):
        return await session.call_tool("run_code", {"code": PNG_PROGRAM})
    result = in_session(namespace, steps)
    monkeypatch.setenv("CODERUN_OUTPUT_DIR", str(tmp_path))  # the same program here gives the bytes to expect
    exec(PNG_PROGRAM, {})
    expected = (tmp_path / "plot").read_bytes()
    assert not result.is_error, result.content[0].text
    images = [block for block in result.content if block.type == "image"]
    assert [(image.mime_type, base64.b64decode(image.data)) for image in images] == [("image/png", expected)]
    [listed] = result.structured_content["artifacts"]
    assert {k: v for k, v in listed.items() if k != "uri"} == \
        {"name": "plot", "size": len(expected), "mimeType": "image/png", "shown": "image"}
    # every artifact, inline or stored, is a resource the server reads back (resources/read)
    assert listed["uri"].startswith(f"coderun://runs/{namespace}/") and listed["uri"].endswith("/artifacts/plot")


def test_a_long_run_sends_progress_all_along(operator, namespace):
    """A 20 s program with progress every 2 s: a host that times out without progress keeps waiting."""
    arrivals = []

    async def on_progress(progress, total, message):
        arrivals.append((time.monotonic(), progress, message))

    async def steps(session):
        return await session.call_tool("run_code", {"code": "import time\ntime.sleep(20)\nprint('done')",
                                                    "timeout": 60}, progress_callback=on_progress)
    result = in_session(namespace, steps, "--progress-interval", "2")
    assert not result.is_error and result.structured_content["stdout"] == "done\n"
    times = [t for t, _, _ in arrivals]
    assert max(b - a for a, b in zip(times, times[1:])) < 5, arrivals  # never silent much past the interval
    messages = [message for _, _, message in arrivals]
    assert messages[0].startswith("Creating the run") and sum(m.startswith("Running (") for m in messages) >= 5, \
        messages
    progress = [p for _, p, _ in arrivals]
    assert progress == sorted(progress) and len(set(progress)) == len(progress)


def test_a_cancelled_call_deletes_its_run(operator, cluster, namespace):
    async def steps(session):
        running = anyio.Event()

        async def on_progress(progress, total, message):
            if message.startswith("Running"):
                running.set()

        async with anyio.create_task_group() as group:
            async def call():
                await session.call_tool("run_code", {"code": "import time\ntime.sleep(60)", "timeout": 90},
                                        progress_callback=on_progress)
            group.start_soon(call)
            await running.wait()
            assert len(cluster.run_names(namespace)) == 1
            group.cancel_scope.cancel()  # the client sends notifications/cancelled
        # Still in the session: the server deletes the run on the cancellation, not because stdin closed.
        await anyio.to_thread.run_sync(wait_for, lambda: not cluster.run_names(namespace), 30,
                                       "the cancelled call's run to be deleted")
    in_session(namespace, steps, "--progress-interval", "2")


@pytest.mark.cold_only  # its own `default` policy; a warm namespace has one already
def test_session_calls_keep_the_conversations_files_and_the_session_goes_with_the_server(operator, cluster,
                                                                                         namespace):
    cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy", "metadata": {"name": "default"},
        # a quarter of a core each: the session's pod and a plain run's fit the node side by side
        "spec": {"sessions": {"allowed": True}, "defaults": {"cpu": "250m", "memory": "256Mi"}}})

    async def steps(session):
        wrote = await session.call_tool("run_code", {"code": "open('notes.txt', 'w').write('kept')\nprint('ok')",
                                                     "session": True})
        read = await session.call_tool("run_code", {"code": "print(open('notes.txt').read())", "session": True})
        alone = await session.call_tool("run_code", {"code": "import os\nprint(os.path.exists('notes.txt'))"})
        sessions = cluster.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "coderunsessions")
        return wrote, read, alone, [s["metadata"]["name"] for s in sessions["items"]]
    wrote, read, alone, alive = in_session(namespace, steps)
    assert not (wrote.is_error or read.is_error or alone.is_error), (wrote.content, read.content, alone.content)
    assert read.structured_content["stdout"] == "kept\n" and alone.structured_content["stdout"] == "False\n"
    assert len(alive) == 1
    wait_for(lambda: not cluster.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "coderunsessions")["items"], 30, "the conversation's session deleted")
