"""A tool schema in OpenAI's strict mode (Structured Outputs: `"strict": true` on a function tool).

Strict mode makes the model's arguments always match the schema, on these terms: every object lists all its
properties in `required` and sets `additionalProperties: false`; an optional property is required but
nullable; and only a subset of JSON Schema is enforced (beside the structure: `enum`, `const`, `anyOf`;
strings `pattern` and `format`; numbers `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`,
`multipleOf`; arrays `minItems`, `maxItems`). Anything else (`default`, `minLength`, `maxLength`) is taken out
and said in the description, so the model still knows it. A null argument means what leaving it out means:
RunRequest takes null as "the default", and the policy's default applies.
"""
from __future__ import annotations

from typing import Any

# Schema keywords strict mode accepts (the structure, annotations, and the documented constraints).
STRICT_KEYWORDS = frozenset({
    "type", "description", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf",
    "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "minItems", "maxItems",
})


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` (self-contained: no $ref) made strict; a new dict, `schema` is left as it is."""
    return _strict(schema, nullable=False)


def _strict(node: dict[str, Any], nullable: bool) -> dict[str, Any]:
    notes = _unsupported_notes(node, nullable)
    strict = {key: value for key, value in node.items() if key in STRICT_KEYWORDS}
    if "properties" in node:
        optional = set(node["properties"]) - set(node.get("required", ()))
        strict["properties"] = {name: _strict(prop, name in optional) for name, prop in node["properties"].items()}
        strict["required"] = list(node["properties"])
        strict["additionalProperties"] = False
    if isinstance(node.get("items"), dict):
        strict["items"] = _strict(node["items"], nullable=False)
    if "anyOf" in node:
        strict["anyOf"] = [_strict(option, nullable=False) for option in node["anyOf"]]
    if nullable:
        strict = _with_null(strict)
    if notes:
        strict["description"] = " ".join([node.get("description", "").rstrip(), *notes]).strip()
    return strict


def _with_null(node: dict[str, Any]) -> dict[str, Any]:
    """The node also admitting null: `"type": [T, "null"]` (an enum lists null too), or a null branch."""
    if isinstance(node.get("type"), str):
        node = {**node, "type": [node["type"], "null"]}
        if "enum" in node:
            node["enum"] = [*node["enum"], None]
        return node
    if "anyOf" in node:
        return {**node, "anyOf": [*node["anyOf"], {"type": "null"}]}
    return {"anyOf": [node, {"type": "null"}]}


def _unsupported_notes(node: dict[str, Any], nullable: bool) -> list[str]:
    """What strict mode drops, in words for the description."""
    notes = []
    low, high = node.get("minLength"), node.get("maxLength")
    if low and high:
        notes.append(f"{low} to {high} characters.")
    elif high:
        notes.append(f"At most {high} characters.")
    elif low:
        notes.append(f"At least {low} characters.")
    if nullable:
        default = f" (default {node['default']})" if node.get("default") is not None else ""
        notes.append(f"null means not given{default}.")
    return notes
