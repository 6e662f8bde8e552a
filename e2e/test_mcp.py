"""`coderun mcp` through a real MCP client session over stdio, against the real cluster."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from coderun.client import RunRequest
from coderun.tools import input_schema
from conftest import KUBECONFIG, wait_for

CODERUN = str(Path(sys.executable).parent / "coderun")


def in_session(namespace, steps):
    """Start `coderun mcp` as an MCP client would (command + env), run `steps(session)`, return its value."""
    params = StdioServerParameters(command=CODERUN, args=["mcp", "-n", namespace],
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
    assert tools["run_code"].input_schema == input_schema(RunRequest)
    assert "sandbox" in tools["run_code"].description


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
    assert ok.content[0].text == "exit code 0 (Completed)\nstdout (3 bytes):\n42"
    text = broken.content[0].text
    assert not broken.is_error  # a failing program is a result the model fixes, not a tool error
    assert text.splitlines()[:3] == ["exit code 1 (NonZeroExit)", "error: KeyError at line 2: 'b'",
                                     "failing line 2: print(data['b'])"]
    assert denied.is_error and "policy rule runtimes" in denied.content[0].text
    assert runtimes.content[0].text.startswith("javascript: image coderun.local/sandbox-node:v2")
    assert "python: image coderun.local/sandbox-python:v2" in runtimes.content[0].text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_streamable_http_transport_serves_the_same_tools(operator, namespace):
    port = _free_port()
    server = subprocess.Popen([CODERUN, "mcp", "-n", namespace, "--transport", "streamable-http", "--port", str(port)],
                              env={**os.environ, "KUBECONFIG": str(KUBECONFIG)}, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _listening(port) or server.poll() is not None, 30, "coderun mcp to listen")
        assert server.poll() is None, server.stderr.read()

        async def session_main():
            async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    names = {tool.name for tool in (await session.list_tools()).tools}
                    return names, await session.call_tool("run_code", {"code": "print(2**10)"})
        names, ran = anyio.run(session_main)
        assert names == {"run_code", "list_runtimes"}
        assert ran.content[0].text == "exit code 0 (Completed)\nstdout (5 bytes):\n1024"
    finally:
        server.terminate()
        server.wait(timeout=30)
