"""The coderun Python SDK (light install: kubernetes + pydantic, no kopf).

    from coderun.client import CodeRunClient
    result = CodeRunClient().run("print(6*7)")
    assert result.stdout == "42\\n"
"""
from typing import TYPE_CHECKING

from .errors import (ArtifactUnavailable, CodeRunError, InputTooLarge, PolicyDenied, RunNotFound, RunRejected,
                     RunTimeout, UploadFailed)
from .inputs import artifact_input
from .request import RunRequest, file_input
from .result import RunResult
from .runtimes import RuntimeInfo
from .sessions import SessionEnded, SessionInfo, SessionNotReady
from .sync import CodeRunClient, Session
from .waiting import WaitStats

if TYPE_CHECKING:
    from .aio import AsyncCodeRunClient


def __getattr__(name: str):
    # The async client loads aiohttp and kubernetes.aio (about a second): only for those who ask for it, not for
    # every `coderun` command.
    if name == "AsyncCodeRunClient":
        from .aio import AsyncCodeRunClient
        return AsyncCodeRunClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ArtifactUnavailable", "AsyncCodeRunClient", "CodeRunClient", "CodeRunError", "InputTooLarge",
           "PolicyDenied", "RunNotFound", "RunRejected", "RunRequest", "RunResult", "RunTimeout", "RuntimeInfo",
           "Session", "SessionEnded", "SessionInfo", "SessionNotReady", "UploadFailed", "WaitStats", "artifact_input",
           "file_input"]
