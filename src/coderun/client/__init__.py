"""The coderun Python SDK (light install: kubernetes + pydantic, no kopf).

    from coderun.client import CodeRunClient
    result = CodeRunClient().run("print(6*7)")
    assert result.stdout == "42\\n"
"""
from .aio import AsyncCodeRunClient
from .errors import CodeRunError, PolicyDenied, RunNotFound, RunRejected, RunTimeout
from .request import RunRequest, file_input
from .result import RunResult
from .runtimes import RuntimeInfo
from .sync import CodeRunClient
from .waiting import WaitStats

__all__ = ["AsyncCodeRunClient", "CodeRunClient", "CodeRunError", "PolicyDenied", "RunNotFound", "RunRejected",
           "RunRequest", "RunResult", "RunTimeout", "RuntimeInfo", "WaitStats", "file_input"]
