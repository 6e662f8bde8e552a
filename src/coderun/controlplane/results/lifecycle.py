"""When a finished run is deleted, pure: its ttlSecondsAfterFinished, else its policy's default."""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Mapping

from ..policy import DEFAULT_POLICY, Denial, select_policy
from .status import parse_time


def expiry_time(run: Mapping[str, Any]) -> datetime | None:
    status, spec = run.get("status") or {}, run.get("spec") or {}
    finished = parse_time(status.get("completionTime"))
    if finished is None:
        return None
    ttl = spec.get("ttlSecondsAfterFinished")
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0:
        policy = select_policy(spec.get("policyRef") if isinstance(spec.get("policyRef"), str) else None, {})
        ttl = (DEFAULT_POLICY if isinstance(policy, Denial) else policy).ttl_seconds_after_finished
    return finished + timedelta(seconds=ttl)
