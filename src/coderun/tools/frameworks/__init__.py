"""Adapters that give agent frameworks coderun's tools: the OpenAI Agents SDK (`openai_agents`), LangChain
(`langchain`) and LlamaIndex (`llama_index`). Each imports its framework only when called, and says which extra
to install when it is missing; each sends the schema coderun.tools generates and answers with invoke.py, so
every framework's model reads the same text."""
from __future__ import annotations

import asyncio
import inspect
from typing import Any, Mapping

from ...client import AsyncCodeRunClient, CodeRunClient
from ..invoke import ToolReply, call_tool, call_tool_sync

# What an adapter runs through: the SDK's client, sync or async.
Client = CodeRunClient | AsyncCodeRunClient


def missing_framework(package: str, extra: str) -> ImportError:
    return ImportError(f"{package} is not installed; install it with coderun's extra: pip install 'coderun[{extra}]'")


def is_async(client: Client) -> bool:
    """An AsyncCodeRunClient (awaitable submit), rather than a CodeRunClient."""
    return inspect.iscoroutinefunction(client.submit)


async def answer(client: Client, name: str, arguments: Mapping[str, Any] | str | None) -> ToolReply:
    """One call from an async framework, with either client (a CodeRunClient's wait runs in a worker thread)."""
    if is_async(client):
        return await call_tool(client, name, arguments)
    return await asyncio.to_thread(call_tool_sync, client, name, arguments)
