"""Generates the CodeRun, CodeRunPolicy and CodeRunSession CRDs from the pydantic models: `python -m coderun.api.crd crds`.

The API server wants a *structural* schema: no $ref, no anyOf for optional fields, no additionalProperties
beside properties. This module turns pydantic's JSON Schema into that form and adds the CRD envelope.
"""
from __future__ import annotations

import sys
from typing import Any

import yaml

from . import coderunpolicy, coderunsession, identity, models
from .schema import resolve

# `kubectl get coderun-all` lists CodeRuns and CodeRunPolicies. kubectl expands a category before it resolves a
# resource name, so a category named like a resource (`coderun`, the singular) breaks `kubectl get coderun NAME`.
CATEGORY = "coderun-all"

_DROPPED_KEYS = {"title", "default", "additionalProperties", "$defs"}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
    {"name": "Exit", "type": "integer", "jsonPath": ".status.exitCode"},
    {"name": "Duration-ms", "type": "integer", "jsonPath": ".status.metrics.totalMillis",
     "description": "CodeRun created -> result written"},
    {"name": "Language", "type": "string", "jsonPath": ".spec.language", "priority": 1},
    {"name": "Pod", "type": "string", "jsonPath": ".status.podName", "priority": 1},
    {"name": "Start", "type": "string", "jsonPath": ".status.startMode", "priority": 1,
     "description": "Warm (a pre-started pod of the policy's pool) or Cold"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline $refs, collapse Optional[X] to X, keep descriptions, CEL rules and bounds."""
    schema = resolve(schema, defs)
    if "anyOf" in schema:
        raise ValueError(f"cannot express a union in a structural schema: {schema}")
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            out[key] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = structural(value, defs)
        elif key == "required":
            out[key] = sorted(value)
        else:
            out[key] = value
    if out.get("x-kubernetes-preserve-unknown-fields"):
        # kept whole: its model's fields, and the CEL rules written against them, are not in this schema
        out = {k: v for k, v in out.items() if k not in {"properties", "required", "x-kubernetes-validations"}}
        out["type"] = "object"
    elif out.get("type") == "object" and "properties" not in out and isinstance(
            schema.get("additionalProperties"), dict):
        out["additionalProperties"] = structural(schema["additionalProperties"], defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


POLICY_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Accepted", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Accepted\")].status",
     "description": "True when the operator applies the policy; False: see the Accepted condition's message"},
    {"name": "Warm-Ready", "type": "integer", "jsonPath": ".status.warmPool.ready",
     "description": "Warm pool pods ready to be claimed"},
    {"name": "Warm-Size", "type": "integer", "jsonPath": ".status.warmPool.size", "priority": 1},
    {"name": "Admission", "type": "string", "jsonPath": ".spec.admission"},
    {"name": "Max-Concurrent", "type": "integer", "jsonPath": ".spec.maxConcurrentRuns"},
    {"name": "Approval", "type": "string", "jsonPath": ".spec.approval.required"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _schema_of(model: type[models.ApiModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
    return structural(raw, raw.get("$defs", {}))


def openapi_schema(root: type[models.ApiModel], spec: type[models.ApiModel],
                   status: type[models.ApiModel] | None) -> dict[str, Any]:
    properties = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                  "spec": _schema_of(spec)}
    if status is not None:
        properties["status"] = _schema_of(status)
    return {"type": "object", "description": root.__doc__, "required": ["spec"], "properties": properties}


def _crd(kind: str, plural: str, short_name: str, schema: dict[str, Any], columns: list[dict[str, Any]],
         with_status: bool) -> dict[str, Any]:
    version: dict[str, Any] = {"name": models.VERSION, "served": True, "storage": True}
    if with_status:
        version["subresources"] = {"status": {}}
    version["additionalPrinterColumns"] = columns
    version["schema"] = {"openAPIV3Schema": schema}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{models.GROUP}", "labels": {"app.kubernetes.io/part-of": "coderun"}},
        "spec": {
            "group": models.GROUP,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List",
                      "shortNames": [short_name], "categories": [CATEGORY]},
            "versions": [version],
        },
    }


def crd() -> dict[str, Any]:
    return _crd(models.KIND, models.PLURAL, models.SHORT_NAME,
                openapi_schema(models.CodeRun, models.CodeRunSpec, models.CodeRunStatus), PRINTER_COLUMNS, True)


def policy_crd() -> dict[str, Any]:
    return _crd(coderunpolicy.POLICY_KIND, coderunpolicy.POLICY_PLURAL, coderunpolicy.POLICY_SHORT_NAME,
                openapi_schema(coderunpolicy.CodeRunPolicy, coderunpolicy.CodeRunPolicySpec,
                               coderunpolicy.CodeRunPolicyStatus), POLICY_PRINTER_COLUMNS, True)


SESSION_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
    {"name": "Runs", "type": "integer", "jsonPath": ".status.runsDone", "description": "Runs ended in the session"},
    {"name": "Keep-State", "type": "boolean", "jsonPath": ".spec.keepState"},
    {"name": "Expires", "type": "string", "jsonPath": ".status.expiresAt", "priority": 1},
    {"name": "Pod", "type": "string", "jsonPath": ".status.podName", "priority": 1},
    {"name": "Creator", "type": "string", "jsonPath": ".status.creator", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def session_crd() -> dict[str, Any]:
    return _crd(coderunsession.SESSION_KIND, coderunsession.SESSION_PLURAL, coderunsession.SESSION_SHORT_NAME,
                openapi_schema(coderunsession.CodeRunSession, coderunsession.CodeRunSessionSpec,
                               coderunsession.CodeRunSessionStatus), SESSION_PRINTER_COLUMNS, True)


# file name under crds/ -> (generator, the module its models live in)
CRDS = {
    "coderun.io_coderuns.yaml": (crd, "src/coderun/api/models.py"),
    "coderun.io_coderunpolicies.yaml": (policy_crd, "src/coderun/api/coderunpolicy.py"),
    "coderun.io_coderunsessions.yaml": (session_crd, "src/coderun/api/coderunsession.py"),
}


def render(file_name: str = "coderun.io_coderuns.yaml") -> str:
    generate, source = CRDS[file_name]
    header = f"# Generated by `python -m coderun.api.crd DIR` from {source}. Do not edit.\n"
    return header + yaml.safe_dump(generate(), sort_keys=False, width=120)


ADMISSION_POLICIES_FILE = "coderun.io_admissionpolicies.yaml"
ADMISSION_POLICIES_TEMPLATE = "templates/admissionpolicies.yaml"
_PART_OF = "  labels:\n    app.kubernetes.io/part-of: coderun\n"


def render_admission_policies(chart: bool = False) -> str:
    """The approval's admission policies (identity.py): applied with the CRDs by `make up-host`, and always
    installed by the chart (approvals and policyRef are only trusted while they are there)."""
    docs = [yaml.safe_dump(obj, sort_keys=False, width=120) for obj in identity.admission_policies()]
    if not chart:
        return f"# Generated by `python -m coderun.api.crd DIR` from src/coderun/api/identity.py. Do not edit.\n---\n" \
            + "---\n".join(docs)
    docs = [d.replace("{{", '{{ "{{" }}').replace(_PART_OF, '  labels:\n    {{- include "coderun.labels" . | nindent 4 }}\n')
            for d in docs]
    return "{{- /* Generated by `make crds` (python -m coderun.api.crd) from src/coderun/api/identity.py. */}}\n" \
        + "---\n".join(docs)


CHART_TEMPLATE = "templates/crds.yaml"
_ANNOTATIONS_MARK = "__chart_annotations__"


def render_chart() -> str:
    """The same CRDs as a Helm template: behind `crds.enabled`, kept on uninstall with `crds.keep` (deleting a
    CRD deletes every CodeRun and CodeRunPolicy in the cluster), labelled as every object of the chart (no component:
    they are the API's, not the operator's)."""
    docs = []
    for generate, _ in CRDS.values():
        obj = generate()
        obj["metadata"]["annotations"] = _ANNOTATIONS_MARK
        body = yaml.safe_dump(obj, sort_keys=False, width=120).replace("{{", '{{ "{{" }}')
        body = body.replace(_PART_OF, '  labels:\n    {{- include "coderun.commonLabels" . | nindent 4 }}\n')
        docs.append(body.replace(f"  annotations: {_ANNOTATIONS_MARK}\n",
                                 "  annotations:\n    {{- if .Values.crds.keep }}\n"
                                 "    helm.sh/resource-policy: keep\n    {{- end }}\n"))
    header = ("{{- /* Generated by `make crds` (python -m coderun.api.crd) from the pydantic models. Do not edit. */}}\n"
              "{{- if .Values.crds.enabled }}\n")
    return header + "---\n".join(docs) + "{{- end }}\n"


if __name__ == "__main__":
    from pathlib import Path
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "crds")
    for name in CRDS:
        (out / name).write_text(render(name))
    (out / ADMISSION_POLICIES_FILE).write_text(render_admission_policies())
    if len(sys.argv) > 2:  # the chart's directory
        (Path(sys.argv[2]) / CHART_TEMPLATE).write_text(render_chart())
        (Path(sys.argv[2]) / ADMISSION_POLICIES_TEMPLATE).write_text(render_admission_policies(chart=True))
