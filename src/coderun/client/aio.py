"""AsyncCodeRunClient: the sync client's calls run in worker threads (asyncio.to_thread).

Why not a native async client: the kubernetes package is synchronous, and a second API stack
(kubernetes_asyncio) would double the SDK's dependencies for no gain in a call that mostly waits on a
watch. Each call holds one thread while it waits; cancelling the awaiting task returns at once, and the
thread ends with its current watch request (at most `watch_seconds`, default 60 s).
"""
from __future__ import annotations

import asyncio
from typing import Any, Mapping

from ..api.models import CodeRunSpec
from .request import RunRequest
from .result import RunResult
from .runtimes import RuntimeInfo
from .sync import CodeRunClient


class AsyncCodeRunClient:
    """The same API as CodeRunClient, awaitable. Construct with the same arguments, or wrap a client."""

    def __init__(self, *args: Any, sync_client: CodeRunClient | None = None, **kwargs: Any):
        self.sync = sync_client or CodeRunClient(*args, **kwargs)

    @property
    def namespace(self) -> str:
        return self.sync.namespace

    async def run(self, code: str, language: str = "python", **kwargs: Any) -> RunResult:
        return await asyncio.to_thread(self.sync.run, code, language, **kwargs)

    async def submit(self, request: RunRequest, **kwargs: Any) -> RunResult:
        return await asyncio.to_thread(self.sync.submit, request, **kwargs)

    async def create(self, spec: CodeRunSpec | RunRequest, **kwargs: Any) -> RunResult:
        return await asyncio.to_thread(self.sync.create, spec, **kwargs)

    async def get(self, name: str, **kwargs: Any) -> RunResult:
        return await asyncio.to_thread(self.sync.get, name, **kwargs)

    async def wait(self, name: str, **kwargs: Any) -> RunResult:
        return await asyncio.to_thread(self.sync.wait, name, **kwargs)

    async def list(self, **kwargs: Any) -> list[RunResult]:
        return await asyncio.to_thread(self.sync.list, **kwargs)

    async def delete(self, name: str, **kwargs: Any) -> bool:
        return await asyncio.to_thread(self.sync.delete, name, **kwargs)

    async def artifact(self, result: RunResult, name: str) -> bytes:
        return await asyncio.to_thread(self.sync.artifact, result, name)

    async def artifacts(self, result: RunResult) -> Mapping[str, bytes]:
        return await asyncio.to_thread(self.sync.artifacts, result)

    async def runtimes(self, namespace: str | None = None, policy: str | None = None) -> list[RuntimeInfo]:
        return await asyncio.to_thread(self.sync.runtimes, namespace, policy)
