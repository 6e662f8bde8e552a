"""coderun's tools for the OpenAI Agents SDK (`pip install 'coderun[openai-agents]'`):

    from agents import Agent
    from coderun.client import AsyncCodeRunClient
    from coderun.tools.frameworks.openai_agents import coderun_tools
    agent = Agent(name="analyst", tools=coderun_tools(AsyncCodeRunClient(namespace="agents")))

Strict by default, as the SDK recommends: the schema is coderun's strict variant (optional arguments nullable,
null meaning the policy's default), not the SDK's own strict conversion of the plain one, which would make every
argument required and non-null.
"""
from __future__ import annotations

from typing import Any

from ..schemas import RUN_CODE, TOOL_NAMES, tool_description, tool_parameters
from . import Client, answer, missing_framework


def coderun_tools(client: Client, *, strict: bool = True) -> list[Any]:
    """run_code and list_runtimes as FunctionTools, running through `client` (AsyncCodeRunClient or
    CodeRunClient)."""
    return [function_tool(client, name, strict=strict) for name in TOOL_NAMES]


def function_tool(client: Client, name: str = RUN_CODE, *, strict: bool = True) -> Any:
    try:
        from agents import FunctionTool
    except ImportError as e:
        raise missing_framework("openai-agents", "openai-agents") from e

    async def invoke(context: Any, arguments: str) -> str:
        return (await answer(client, name, arguments)).text

    return FunctionTool(name=name, description=tool_description(name),
                        params_json_schema=tool_parameters(name, strict=strict), on_invoke_tool=invoke,
                        strict_json_schema=strict)
