"""coderun's tools for LlamaIndex (`pip install 'coderun[llamaindex]'`, llama-index-core):

    from llama_index.core.agent.workflow import FunctionAgent
    from coderun.client import AsyncCodeRunClient
    from coderun.tools.frameworks.llama_index import coderun_tools
    agent = FunctionAgent(tools=coderun_tools(AsyncCodeRunClient(namespace="agents")), llm=...)

Each FunctionTool's fn_schema yields coderun's schema (strict=True: the strict variant, for an LLM created with
strict=True). LlamaIndex sends the schema's type, properties and required; a strict LLM adds
`additionalProperties: false` at the top, and RunRequest refuses unknown arguments either way.
"""
from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from ..schemas import RUN_CODE, TOOL_NAMES, tool_description, tool_parameters
from ..invoke import call_tool_sync
from . import Client, answer, is_async, missing_framework


def coderun_tools(client: Client, *, strict: bool = False) -> list[Any]:
    """run_code and list_runtimes as FunctionTools, running through `client` (an AsyncCodeRunClient serves the
    agents' acall; a CodeRunClient serves call and acall)."""
    return [function_tool(client, name, strict=strict) for name in TOOL_NAMES]


def function_tool(client: Client, name: str = RUN_CODE, *, strict: bool = False) -> Any:
    try:
        from llama_index.core.tools import FunctionTool, ToolMetadata
    except ImportError as e:
        raise missing_framework("llama-index-core", "llamaindex") from e

    def run(**arguments: Any) -> str:
        return call_tool_sync(client, name, arguments).text

    async def arun(**arguments: Any) -> str:
        return (await answer(client, name, arguments)).text

    metadata = ToolMetadata(name=name, description=tool_description(name),
                            fn_schema=schema_model(name, tool_parameters(name, strict=strict)))
    return FunctionTool(fn=None if is_async(client) else run, async_fn=arun, metadata=metadata)


def schema_model(name: str, schema: dict[str, Any]) -> type[BaseModel]:
    """A model class whose JSON schema is `schema`: LlamaIndex reads a tool's parameters from fn_schema."""
    def model_json_schema(cls: type[BaseModel], *args: Any, **kwargs: Any) -> dict[str, Any]:
        return copy.deepcopy(schema)

    return type(f"{name}_arguments", (BaseModel,), {"model_json_schema": classmethod(model_json_schema)})
