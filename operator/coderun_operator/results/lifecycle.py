"""When a finished run is deleted, pure: its ttlSecondsAfterFinished, else its policy's default; and when an ended
session is, after its policy's."""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Mapping, TypeGuard

from ..policy import DEFAULT_POLICY, Denial, select_policy
from .status import parse_time


def ttl_seconds(run: Mapping[str, Any], policies: Mapping[str, Any]) -> int:
    """The run's own TTL, within its policy's maxTtlSecondsAfterFinished (a run refused for asking more is not
    kept longer either); else the default of the policy that decided it, as recorded at admission; else (a run
    refused before any decision) that of the policy it selects now."""
    status, spec = run.get("status") or {}, run.get("spec") or {}
    policy_ref = spec.get("policyRef")
    policy = select_policy(policy_ref if isinstance(policy_ref, str) else None, policies)
    policy = DEFAULT_POLICY if isinstance(policy, Denial) else policy
    ttl = spec.get("ttlSecondsAfterFinished")
    if _is_ttl(ttl):
        return min(ttl, policy.max_ttl_seconds_after_finished)
    recorded = (status.get("decision") or {}).get("ttlSecondsAfterFinished")
    return recorded if _is_ttl(recorded) else policy.ttl_seconds_after_finished


def expiry_time(run: Mapping[str, Any], policies: Mapping[str, Any]) -> datetime | None:
    """`policies`: the run's namespace's CodeRunPolicies by name."""
    finished = parse_time((run.get("status") or {}).get("completionTime"))
    if finished is None:
        return None
    return finished + timedelta(seconds=ttl_seconds(run, policies))


def session_expiry_time(session: Mapping[str, Any], policies: Mapping[str, Any]) -> datetime | None:
    """An ended session is kept (so `kubectl get crsess` says why it ended) for its policy's
    ttlSecondsAfterFinished, as a finished run is; for the built-in default when that policy is gone."""
    status = session.get("status") or {}
    ended = parse_time(status.get("endTime")) if status.get("phase") == "Ended" else None
    if ended is None:
        return None
    policy = policies.get(str(status.get("policy") or ""))
    ttl = getattr(policy, "ttl_seconds_after_finished", None)
    return ended + timedelta(seconds=ttl if _is_ttl(ttl) else DEFAULT_POLICY.ttl_seconds_after_finished)


def _is_ttl(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
