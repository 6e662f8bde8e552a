"""One walker step shared by the CRD generator and the tool schemas: pydantic's JSON Schema node with its
local `$ref` inlined and `Optional[X]` (anyOf X | null) collapsed to X. Each caller then keeps and drops
keys its own way (the API server wants a structural schema; model tool APIs want no Kubernetes keys)."""
from __future__ import annotations

from typing import Any

_RULES = "x-kubernetes-validations"


def resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The node as it means: siblings of a `$ref` or an Optional win over the target, CEL rules of both are
    kept. A real union (more than one non-null option) is returned as it is, for the caller to judge."""
    while True:
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            node = _merge(target, {k: v for k, v in node.items() if k != "$ref"})
            continue
        options = [o for o in node.get("anyOf") or () if o.get("type") != "null"]
        if "anyOf" in node and len(options) == 1:
            node = _merge(options[0], {k: v for k, v in node.items() if k != "anyOf"})
            continue
        return node


def _merge(inner: dict[str, Any], outer: dict[str, Any]) -> dict[str, Any]:
    merged = {**inner, **outer}
    if _RULES in inner and _RULES in outer:
        merged[_RULES] = inner[_RULES] + outer[_RULES]
    return merged
