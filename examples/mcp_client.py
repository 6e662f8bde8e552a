"""Talk to `coderun mcp` as an MCP host does: the official MCP Python client launches it over stdio, lists its
tools and calls run_code.

    pip install '.[mcp]'                           # from a checkout: the SDK, the CLI and `coderun mcp`
    python examples/mcp_client.py                  # the kubeconfig's namespace (KUBECONFIG, or ~/.kube/config)
    python examples/mcp_client.py -n agents

It starts the `coderun` installed beside this Python (else the one on PATH), with this environment (KUBECONFIG
included), as a desktop host does from examples/mcp-client-config.json. Prints the tools, then run_code's text
result and structured exit code; exits 0 when the program ran and printed 42.
"""
import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


def coderun_command() -> str:
    beside = Path(sys.executable).parent / "coderun"
    return str(beside) if beside.exists() else (shutil.which("coderun") or "coderun")


async def session(namespace: str | None) -> int:
    args = ["mcp", *(["--namespace", namespace] if namespace else [])]
    server = StdioServerParameters(command=coderun_command(), args=args, env=dict(os.environ))
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as client:
            await client.initialize()
            tools = (await client.list_tools()).tools
            print("tools:", ", ".join(tool.name for tool in tools))
            result = await client.call_tool("run_code", {"code": "print(6*7)"})
            text = "\n".join(part.text for part in result.content if part.type == "text")
            print(f"run_code (is_error={result.is_error}):\n{text}")
            structured = result.structured_content or {}
            print(f"namespace: {structured.get('namespace')}, exitCode: {structured.get('exitCode')}")
            return 0 if not result.is_error and structured.get("stdout") == "42\n" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Launch `coderun mcp` over stdio and call run_code.")
    parser.add_argument("-n", "--namespace", help="where runs go (default: the kubeconfig's namespace)")
    return asyncio.run(session(parser.parse_args(argv).namespace))


if __name__ == "__main__":
    sys.exit(main())
