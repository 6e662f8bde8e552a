"""Where a sandbox pod runs: its policy's spec.scheduling over the chart's defaults (sandboxScheduling values,
which reach the operator as CODERUN_SANDBOX_SCHEDULING, JSON), put on every sandbox pod in one place
(`pod_scheduling`, used by objects._sandbox_pod for cold, warm pool and session pods alike). Only the five
scheduling fields are written: the pod's hardening is the builder's and nothing here can reach it."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

from pydantic import ValidationError

from coderun.api.scheduling import Scheduling, effective_scheduling

SCHEDULING_VARIABLE = "CODERUN_SANDBOX_SCHEDULING"


def chart_defaults(env: Mapping[str, str]) -> Scheduling:
    """The chart's sandboxScheduling values, read by the same model as a policy's field (so the same checks hold);
    a value the model refuses stops the operator at start, naming it, rather than making pods the API server
    refuses one run at a time."""
    raw = env.get(SCHEDULING_VARIABLE) or "{}"
    try:
        return Scheduling.model_validate(json.loads(raw))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(["sandboxScheduling", *(str(p) for p in first["loc"])])
        raise SystemExit(f"{SCHEDULING_VARIABLE}: {where}: {first['msg']}; fix the chart's value") from None
    except ValueError as e:
        raise SystemExit(f"{SCHEDULING_VARIABLE} is not JSON ({e}); the chart writes it from sandboxScheduling"
                         ) from None


CHART_DEFAULTS = chart_defaults(os.environ)


def sandbox_scheduling(policy: Scheduling | None, defaults: Scheduling | None = None) -> Scheduling:
    """The scheduling a sandbox pod of this policy gets now: the policy's fields over the chart's defaults."""
    return effective_scheduling(policy, CHART_DEFAULTS if defaults is None else defaults)


def pod_scheduling(scheduling: Scheduling) -> dict[str, Any]:
    """The pod spec fields for `scheduling`, only those that say something: nodeSelector, tolerations, affinity,
    priorityClassName, imagePullSecrets (as the API server wants them: [{name}])."""
    fields: dict[str, Any] = {}
    if scheduling.node_selector:
        fields["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        fields["tolerations"] = [_pruned(t.model_dump(by_alias=True)) for t in scheduling.tolerations]
    affinity = _pruned(scheduling.affinity.model_dump(by_alias=True)) if scheduling.affinity else None
    if affinity:
        fields["affinity"] = affinity
    if scheduling.priority_class_name:
        fields["priorityClassName"] = scheduling.priority_class_name
    if scheduling.image_pull_secrets:
        fields["imagePullSecrets"] = [{"name": name} for name in scheduling.image_pull_secrets]
    return fields


def _pruned(value: Any) -> Any:
    """Without the empty: the API server leaves out an empty string, list or object (omitempty), so the pod reads
    back as built and a pool pod compares equal to what the pool builds."""
    if isinstance(value, dict):
        kept = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, "", [], {})}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def scheduling_digest(scheduling: Scheduling) -> str:
    """What tells two schedulings apart, for the warm pool's key: pods made under other scheduling are another
    pool's."""
    return json.dumps(pod_scheduling(scheduling), sort_keys=True, separators=(",", ":"))


def holds_scheduling(pod_spec: Mapping[str, Any], scheduling: Scheduling) -> bool:
    """The pod carries `scheduling`: every nodeSelector entry, toleration and pull secret it asks for, its
    affinity and priority class. Admission may add to the first three (the RuntimeClass's scheduling, the
    ServiceAccount's pull secrets, the default not-ready tolerations) and name the cluster's default priority
    class where none is asked, so those are compared as "at least"."""
    wanted = pod_scheduling(scheduling)
    have_selector = pod_spec.get("nodeSelector") or {}
    if any(have_selector.get(k) != v for k, v in (wanted.get("nodeSelector") or {}).items()):
        return False
    have_tolerations = _pruned(pod_spec.get("tolerations") or [])
    if any(t not in have_tolerations for t in wanted.get("tolerations") or ()):
        return False
    have_secrets = pod_spec.get("imagePullSecrets") or []
    if any(s not in have_secrets for s in wanted.get("imagePullSecrets") or ()):
        return False
    if "priorityClassName" in wanted and pod_spec.get("priorityClassName") != wanted["priorityClassName"]:
        return False
    return (_pruned(pod_spec.get("affinity") or {}) or None) == wanted.get("affinity")
