"""charts/coderun/values.schema.json, generated from the annotated charts/coderun/values.yaml, as cert-manager
generates its chart's schema: one source for the values, their descriptions and their constraints (`make
values-schema` writes it; tests/unit/test_chart.py fails when it is stale).

Each key's schema comes from values.yaml: its type from its default, its description from the comment above it
(readme.py reads both for the README's table), and its constraints from that comment's `@schema` lines, each a
YAML flow mapping of JSON-schema keywords (`# @schema {minimum: 1, maximum: 5}`) added to the inferred schema;
one that names a `type` or a `$ref` replaces it. A mapping whose keys are commented is an object that refuses any
other key (a typo fails the install); one whose keys are not (`defaultPolicy.spec`) is one value, any object
unless annotated. DEFINITIONS holds the shapes several keys share, named by `$ref`.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import yaml

from coderun.api.scheduling import Scheduling
from readme import CHART, Key, value_keys

QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
RESOURCE_LIST = {"type": "object", "additionalProperties": False,
                 "properties": {name: {"$ref": "#/definitions/quantity"}
                                for name in ("cpu", "memory", "ephemeral-storage")}}
TOPOLOGY_SPREAD_CONSTRAINT = {
    "type": "object", "additionalProperties": False, "required": ["maxSkew", "topologyKey", "whenUnsatisfiable"],
    "properties": {
        "maxSkew": {"type": "integer", "minimum": 1},
        "topologyKey": {"type": "string", "minLength": 1},
        "whenUnsatisfiable": {"enum": ["DoNotSchedule", "ScheduleAnyway"]},
        "labelSelector": {"type": "object"},
        "matchLabelKeys": {"type": "array", "items": {"type": "string"}},
        "minDomains": {"type": "integer", "minimum": 1},
        "nodeAffinityPolicy": {"enum": ["Honor", "Ignore"]},
        "nodeTaintsPolicy": {"enum": ["Honor", "Ignore"]},
    },
}
DEFINITIONS: dict[str, Any] = {
    "quantity": {"type": ["string", "number"], "pattern": QUANTITY_PATTERN,
                 "description": "A Kubernetes quantity: 500m, 1, 128Mi, 2Gi."},
    "resourceList": RESOURCE_LIST,
    "resources": {"type": "object", "additionalProperties": False,
                  "properties": {"requests": {"$ref": "#/definitions/resourceList"},
                                 "limits": {"$ref": "#/definitions/resourceList"}}},
    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    "quantities": {"type": "object", "additionalProperties": {"$ref": "#/definitions/quantity"},
                   "description": "Resource names to quantities: {cpu: 500m, memory: 1Gi}."},
    "topologySpreadConstraints": {
        "type": "array", "items": TOPOLOGY_SPREAD_CONSTRAINT,
        "description": "Pod topology spread constraints (a missing labelSelector selects the component's pods)."},
}


def _scheduling_definitions() -> dict[str, Any]:
    """Toleration, Affinity and what they are made of, from the policy's own model (coderun.api.scheduling): the
    chart's sandboxScheduling and a CodeRunPolicy's spec.scheduling are checked alike."""
    schema = Scheduling.model_json_schema(by_alias=True, ref_template="#/definitions/{model}")
    return {name: _untitled(definition) for name, definition in schema["$defs"].items()}


def _untitled(node: Any) -> Any:
    """Without pydantic's titles and null defaults (noise in a values schema) and Kubernetes' CEL rules (JSON
    schema has no such keyword; the operator's model checks them at start)."""
    if isinstance(node, dict):
        return {k: _untitled(v) for k, v in node.items()
                if k not in ("title", "x-kubernetes-validations") and not (k == "default" and v is None)}
    if isinstance(node, list):
        return [_untitled(v) for v in node]
    return node


DEFINITIONS.update(_scheduling_definitions())


def _merged(into: dict[str, Any], keywords: dict[str, Any]) -> dict[str, Any]:
    """`keywords` added to `into`, mappings merged key by key (so a long annotation can take two lines)."""
    merged = dict(into)
    for name, value in keywords.items():
        both_mappings = isinstance(value, dict) and isinstance(merged.get(name), dict)
        merged[name] = _merged(merged[name], value) if both_mappings else value
    return merged


def _annotation(key: Key) -> dict[str, Any]:
    """The key's `@schema` lines, merged."""
    annotation: dict[str, Any] = {}
    for line in key.schema:
        keywords = yaml.safe_load(line)
        if not isinstance(keywords, dict):
            raise ValueError(f"values.yaml `{'.'.join(key.path)}`: @schema {line!r} is not a mapping")
        annotation = _merged(annotation, keywords)
    return annotation


def _inferred(key: Key, default: Any) -> dict[str, Any]:
    if isinstance(default, bool):  # before int: a bool is an int in Python
        return {"type": "boolean"}
    if isinstance(default, int):
        return {"type": "integer"}
    if isinstance(default, float):
        return {"type": "number"}
    if isinstance(default, str):
        return {"type": "string"}
    if isinstance(default, list):
        return {"type": "array"}
    if isinstance(default, dict) and key.has_commented_descendant():
        return {"type": "object", "additionalProperties": False, "properties": _properties(key.children, default)}
    if isinstance(default, dict):
        return {"type": "object"}
    raise ValueError(f"values.yaml `{'.'.join(key.path)}`: no type for the default {default!r}")


def _schema(key: Key, default: Any) -> dict[str, Any]:
    annotation = _annotation(key)
    schema = {} if "type" in annotation or "$ref" in annotation else _inferred(key, default)
    if key.comment:
        schema["description"] = " ".join(key.comment)
    return {**schema, **annotation}


def _properties(keys: list[Key], values: dict[str, Any]) -> dict[str, Any]:
    return {key.path[-1]: _schema(key, values[key.path[-1]]) for key in keys}


def values_schema(values_yaml: str) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft-07/schema#",
        "title": "coderun chart values",
        "type": "object",
        "additionalProperties": False,
        "definitions": DEFINITIONS,
        "properties": _properties(value_keys(values_yaml), yaml.safe_load(values_yaml)),
    }


def render(values_yaml: str) -> str:
    return json.dumps(values_schema(values_yaml), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    target = CHART / "values.schema.json"
    target.write_text(render((CHART / "values.yaml").read_text()))
    print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
