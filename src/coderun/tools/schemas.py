"""Tool definitions for models, generated from the SDK's input model.

`run_code`'s parameters are RunRequest's JSON schema (the same model the SDK's `run` and the MCP server take),
cleaned for model APIs: `$ref`s inlined, titles and Kubernetes-only keys (CEL rules) dropped. `strict=True`
gives OpenAI's strict-mode variant of the same schema (strict.py): every property required, the optional ones
nullable, null meaning the default.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ..api.schema import resolve
from ..client.request import RunRequest
from .strict import strict_schema

RUN_CODE = "run_code"
LIST_RUNTIMES = "list_runtimes"


class ListRuntimesInput(BaseModel):
    """List the languages the sandbox offers, with their default and maximum limits."""


TOOL_INPUTS: dict[str, type[BaseModel]] = {RUN_CODE: RunRequest, LIST_RUNTIMES: ListRuntimesInput}
TOOL_NAMES = tuple(TOOL_INPUTS)


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """Resolve local $refs and Optional[X] (to a model, "X, not required": the null branch only adds noise),
    and drop what model tool APIs do not want (titles, x-kubernetes-* rules, a default of None)."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = resolve(node, defs)
    return {key: _inline(value, defs) for key, value in node.items()
            if key not in ("title", "$defs") and not key.startswith("x-kubernetes-")
            and not (key == "default" and value is None)}


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A self-contained JSON schema (no $defs) for a tool's arguments."""
    schema = model.model_json_schema(by_alias=True)
    cleaned = _inline(schema, schema.get("$defs", {}))
    cleaned.pop("description", None)  # it is the tool's description, not the arguments'
    cleaned.setdefault("properties", {})
    return cleaned


def tool_description(name: str) -> str:
    return " ".join((TOOL_INPUTS[name].__doc__ or "").split())


def tool_parameters(name: str, *, strict: bool = False) -> dict[str, Any]:
    """The tool's parameters schema, in OpenAI's strict form when `strict`."""
    schema = input_schema(TOOL_INPUTS[name])
    return strict_schema(schema) if strict else schema


def openai_tools(names: tuple[str, ...] = TOOL_NAMES, *, strict: bool = False) -> list[dict[str, Any]]:
    """For the Chat Completions `tools=` parameter (any OpenAI-compatible endpoint); `strict=True` for strict
    function calling (Structured Outputs)."""
    return [{"type": "function", "function": {"name": name, "description": tool_description(name),
                                              "parameters": tool_parameters(name, strict=strict),
                                              **({"strict": True} if strict else {})}}
            for name in names]


def responses_tools(names: tuple[str, ...] = TOOL_NAMES, *, strict: bool = False) -> list[dict[str, Any]]:
    """For the Responses API `tools=` parameter: flat, and `strict` always stated (a Responses function tool
    requires the field)."""
    return [{"type": "function", "name": name, "description": tool_description(name),
             "parameters": tool_parameters(name, strict=strict), "strict": strict}
            for name in names]


def anthropic_tools(names: tuple[str, ...] = TOOL_NAMES) -> list[dict[str, Any]]:
    """For the Anthropic Messages API `tools=` parameter."""
    return [{"name": name, "description": tool_description(name), "input_schema": input_schema(TOOL_INPUTS[name])}
            for name in names]
