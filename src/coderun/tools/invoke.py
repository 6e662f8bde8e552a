"""A tool call answered: the model's arguments validated with RunRequest, the run made through the SDK, the
result rendered (render.py), so every framework's adapter gives a model the same text. The only I/O is the
client's own `submit` / `runtimes`; `call_tool` takes an AsyncCodeRunClient, `call_tool_sync` a CodeRunClient.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, NamedTuple

from pydantic import ValidationError

from ..client.errors import CodeRunError, RunNotFound, RunRejected, RunTimeout, describe_invalid
from ..client.request import RunRequest
from ..client.result import RunResult
from ..client.runtimes import RuntimeInfo
from .render import render_result, render_runtimes
from .schemas import LIST_RUNTIMES, RUN_CODE


class ToolReply(NamedTuple):
    """The text for the model, and whether it is an error the model cannot fix by editing the program
    (rejection, platform or API failure, invalid arguments); a program that failed is a normal reply."""
    text: str
    is_error: bool


class InvalidToolCall(ValueError):
    """An unknown tool, or arguments RunRequest refuses; the message says what to change."""


def parse_call(name: str, arguments: Mapping[str, Any] | str | None) -> RunRequest | None:
    """The RunRequest of a run_code call (arguments as a dict or the model's JSON text), None for
    list_runtimes."""
    if name == LIST_RUNTIMES:
        return None
    if name != RUN_CODE:
        raise InvalidToolCall(f"unknown tool {name!r}; the tools are {RUN_CODE} and {LIST_RUNTIMES}")
    try:
        request = RunRequest.model_validate(json.loads(arguments or "{}") if isinstance(arguments, str)
                                            else arguments or {})
        request.to_spec()  # what the request alone cannot check: code, stdin and files together must fit
        return request
    except json.JSONDecodeError as e:
        raise InvalidToolCall(f"invalid arguments: not a JSON object ({e})") from None
    except ValidationError as e:
        raise InvalidToolCall(f"invalid arguments: {describe_invalid(e)}") from None


def reply(request: RunRequest | None, outcome: RunResult | list[RuntimeInfo]) -> ToolReply:
    if isinstance(outcome, RunResult):
        return ToolReply(render_result(outcome, request.code if request else None), outcome.infrastructure_failure)
    return ToolReply(render_runtimes(outcome), False)


def error_reply(error: InvalidToolCall | CodeRunError, where: str | None = None) -> ToolReply:
    """`where`: the configuration the client was made from, named in an API failure (the MCP server's)."""
    if isinstance(error, RunRejected):
        if error.result is None:  # refused at creation by the namespace's policy: no run exists
            return ToolReply(f"refused by policy ({error.rule or error.reason}): {error.message}", True)
        return ToolReply(render_result(error.result), True)
    if isinstance(error, RunTimeout):
        return ToolReply(f"the run did not finish in time: {error}", True)
    if isinstance(error, RunNotFound):
        return ToolReply(f"the run is gone before it finished: {error}", True)
    if isinstance(error, CodeRunError):
        return ToolReply(unavailable(error, where), True)
    return ToolReply(str(error), True)


def unavailable(error: CodeRunError, where: str | None = None) -> str:
    """An API failure: the model's to fix when the API server refused the spec, else the Kubernetes side's, with
    what was tried and what to change."""
    if error.status == 422:
        return f"invalid arguments, refused by the API server: {error}"
    if where is None:
        return f"coderun is unavailable: {error}"
    if error.status is None:
        return (f"coderun is unavailable: {error} [tried {where}]. Nothing to change in the program: the MCP "
                f"server's configuration must point at a running cluster (env KUBECONFIG, or --kubeconfig and "
                f"--context in the server's args), then call again.")
    return f"coderun is unavailable: the Kubernetes API refused: {error} [tried {where}]"


async def call_tool(client: Any, name: str, arguments: Mapping[str, Any] | str | None) -> ToolReply:
    """Answer one call with an AsyncCodeRunClient (or anything with its awaitable submit and runtimes)."""
    try:
        request = parse_call(name, arguments)
        return reply(request, await (client.runtimes() if request is None else client.submit(request)))
    except (InvalidToolCall, CodeRunError) as e:
        return error_reply(e)


def call_tool_sync(client: Any, name: str, arguments: Mapping[str, Any] | str | None) -> ToolReply:
    """Answer one call with a CodeRunClient (or anything with its submit and runtimes)."""
    try:
        request = parse_call(name, arguments)
        return reply(request, client.runtimes() if request is None else client.submit(request))
    except (InvalidToolCall, CodeRunError) as e:
        return error_reply(e)
