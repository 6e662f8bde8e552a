"""`coderun mcp`: the run_code and list_runtimes tools over MCP (stdio, or streamable HTTP).

Built on the MCP SDK's low-level Server so each tool's input schema is exactly the one coderun.tools generates
from RunRequest (the SDK's input model), rather than one re-derived from a function signature.
"""
from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from pydantic import ValidationError

from . import __version__
from .client import AsyncCodeRunClient, CodeRunError, RunRejected, RunRequest, RunTimeout
from .client.errors import describe_invalid
from .tools import LIST_RUNTIMES, RUN_CODE, TOOL_INPUTS, input_schema, render_result, render_runtimes, \
    tool_description

INSTRUCTIONS = ("Runs code in an isolated gVisor sandbox on Kubernetes: no network, no secrets, bounded CPU, "
                "memory and time. Call run_code with a complete program that prints what you need; read the exit "
                "code, the error type and line, and fix the program when it fails.")


async def call_tool(client: AsyncCodeRunClient, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    """(text for the model, is_error). A program that failed is a normal result the model reads and fixes;
    is_error marks what the model cannot fix by editing the program: rejection, platform or API failure."""
    if name == LIST_RUNTIMES:
        return render_runtimes(await client.runtimes()), False
    if name != RUN_CODE:
        return f"unknown tool {name!r}; the tools are {RUN_CODE} and {LIST_RUNTIMES}", True
    try:
        request = RunRequest.model_validate(arguments)
    except ValidationError as e:
        return f"invalid arguments: {describe_invalid(e)}", True
    try:
        result = await client.submit(request)
    except RunRejected as e:
        if e.result is None:  # refused at creation by the namespace's policy: no run exists
            return f"refused by policy ({e.rule}): {e.message}", True
        return render_result(e.result), True
    except RunTimeout as e:
        return f"the run did not finish in time: {e}", True
    except CodeRunError as e:
        return f"coderun is unavailable: {e}", True
    return render_result(result, request.code), result.infrastructure_failure


def build_server(client: AsyncCodeRunClient) -> Server:
    schemas = {name: input_schema(model) for name, model in TOOL_INPUTS.items()}
    tools = [types.Tool(name=name, description=tool_description(name), input_schema=schema)
             for name, schema in schemas.items()]

    async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        text, is_error = await call_tool(client, params.name, params.arguments or {})
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=is_error)

    return Server("coderun", version=__version__, instructions=INSTRUCTIONS, on_list_tools=on_list_tools,
                  on_call_tool=on_call_tool, get_tool_input_schema=schemas.get)


def serve(transport: str = "stdio", host: str = "127.0.0.1", port: int = 8000, namespace: str | None = None,
          kubeconfig: str | None = None, context: str | None = None) -> None:
    client = AsyncCodeRunClient(namespace, kubeconfig=kubeconfig, context=context, client_name="mcp")
    server = build_server(client)
    if transport == "stdio":
        async def run_stdio() -> None:
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())
        anyio.run(run_stdio)
    else:
        import uvicorn
        uvicorn.run(server.streamable_http_app(host=host), host=host, port=port, log_level="warning")
