"""coderun's tools for LangChain (`pip install 'coderun[langchain]'`, langchain-core):

    from coderun.client import CodeRunClient
    from coderun.tools.frameworks.langchain import coderun_tools
    tools = coderun_tools(CodeRunClient(namespace="agents"))
    model = ChatOpenAI(model="...").bind_tools(tools)    # strict=True: coderun_tools(client, strict=True)

The strictness is the binding's (`bind_tools(tools, strict=True)`), so pass the same to coderun_tools: the strict
schema has the optional arguments nullable, which LangChain's own strict conversion does not add. A CodeRunClient
serves `invoke` and `ainvoke` (in a worker thread); an AsyncCodeRunClient serves `ainvoke` only. What the model
cannot fix by editing the program (a refusal, a platform failure) comes back as a ToolMessage with status
"error".
"""
from __future__ import annotations

from typing import Any

from ..invoke import ToolReply, call_tool, call_tool_sync
from ..schemas import RUN_CODE, TOOL_NAMES, tool_description, tool_parameters
from . import Client, is_async, missing_framework


def coderun_tools(client: Client, *, strict: bool = False) -> list[Any]:
    """run_code and list_runtimes as StructuredTools whose args_schema is coderun's JSON schema."""
    return [structured_tool(client, name, strict=strict) for name in TOOL_NAMES]


def structured_tool(client: Client, name: str = RUN_CODE, *, strict: bool = False) -> Any:
    try:
        from langchain_core.tools import StructuredTool, ToolException
    except ImportError as e:
        raise missing_framework("langchain-core", "langchain") from e

    def text(reply: ToolReply) -> str:
        if reply.is_error:
            raise ToolException(reply.text)  # handle_tool_error: the text goes back as an error ToolMessage
        return reply.text

    def run(**arguments: Any) -> str:
        return text(call_tool_sync(client, name, arguments))

    async def arun(**arguments: Any) -> str:
        return text(await call_tool(client, name, arguments))

    asynchronous = is_async(client)
    return StructuredTool(name=name, description=tool_description(name),
                          args_schema=tool_parameters(name, strict=strict), func=None if asynchronous else run,
                          coroutine=arun if asynchronous else None, handle_tool_error=True)
