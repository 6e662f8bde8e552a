"""Reading a sandbox pod's state, pure: is the program done, running, or stuck before it could start?"""
from __future__ import annotations

from typing import Any, Mapping

from ..api.reasons import Phase, Reason
from .status import Outcome

CONTAINER = "run"
# Waiting reasons that never heal by waiting longer: fail the run at once.
_PERMANENT_WAITING = {"InvalidImageName": Reason.IMAGE_UNAVAILABLE, "ErrImageNeverPull": Reason.IMAGE_UNAVAILABLE,
                      "CreateContainerConfigError": Reason.START_FAILED}
# Waiting reasons that may heal (a registry hiccup): fail after a short grace.
_RETRYING_WAITING = {"ErrImagePull": Reason.IMAGE_UNAVAILABLE, "ImagePullBackOff": Reason.IMAGE_UNAVAILABLE,
                     "CreateContainerError": Reason.START_FAILED, "RunContainerError": Reason.START_FAILED,
                     "CrashLoopBackOff": Reason.START_FAILED}
IMAGE_GRACE_SECONDS = 30


def container_status(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or ():
        if status.get("name") == CONTAINER:
            return status
    return None


def terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container's terminated state, as soon as the kubelet reports it (before the pod phase moves)."""
    status = container_status(pod)
    return ((status or {}).get("state") or {}).get("terminated")


def is_running(pod: Mapping[str, Any]) -> bool:
    return bool(((container_status(pod) or {}).get("state") or {}).get("running"))


def image_with_digest(pod: Mapping[str, Any], fallback: str) -> str:
    """image@sha256:... from the kubelet's imageID, so the status records exactly what ran."""
    status = container_status(pod) or {}
    image_id = status.get("imageID") or ""
    digest = image_id[image_id.rfind("sha256:"):] if "sha256:" in image_id else ""
    image = status.get("image") or fallback
    return f"{image.split('@')[0]}@{digest}" if digest else image


def pod_level_failure(pod: Mapping[str, Any], effective_limits: Mapping[str, Any] | None) -> Outcome | None:
    """Pod failed without the container reporting (deadline backstop, eviction)."""
    status = pod.get("status") or {}
    if status.get("phase") != "Failed" or terminated(pod):
        return None
    if status.get("reason") == "DeadlineExceeded":
        limit = (effective_limits or {}).get("timeoutSeconds", "?")
        return Outcome(Phase.FAILED, Reason.TIMEOUT,
                       f"the sandbox did not finish within its deadline (timeout {limit}s plus start-up); "
                       "raise spec.limits.timeoutSeconds or make the program faster")
    return Outcome(Phase.FAILED, Reason.INTERNAL_ERROR,
                   f"the sandbox pod failed: {status.get('reason', 'unknown')}: {status.get('message', '')}".strip())


def pending_verdict(pod: Mapping[str, Any], waited_seconds: float, start_deadline_seconds: int) -> Outcome | None:
    """A run whose pod cannot start fails with the real cause after a bounded wait, never pends forever."""
    waiting = ((container_status(pod) or {}).get("state") or {}).get("waiting") or {}
    cause, detail = waiting.get("reason"), waiting.get("message", "")
    if cause in _PERMANENT_WAITING or (cause in _RETRYING_WAITING and waited_seconds >= IMAGE_GRACE_SECONDS):
        reason = _PERMANENT_WAITING.get(cause) or _RETRYING_WAITING[cause]
        return Outcome(Phase.FAILED, reason, f"the sandbox could not start ({cause}): {detail}".strip()
                       + ("; check the runtime's image in the policy" if reason == Reason.IMAGE_UNAVAILABLE else ""))
    if waited_seconds < start_deadline_seconds:
        return None
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return Outcome(Phase.FAILED, Reason.UNSCHEDULABLE,
                           f"no node could take the sandbox within {start_deadline_seconds}s: "
                           f"{condition.get('message', '')}; ask for smaller limits")
    return Outcome(Phase.FAILED, Reason.START_FAILED,
                   f"the sandbox did not start within {start_deadline_seconds}s ({cause or 'no container status'})")
