"""Reading a sandbox pod's state, pure: is the program done, running, or stuck before it could start?"""
from __future__ import annotations

from decimal import Decimal
from typing import Any, Callable, Iterable, Mapping

from kubernetes.utils import parse_quantity

from coderun.api.models import ResourceLimits
from coderun.api.reasons import Phase, Reason
from ..builders.names import CONTAINER_NAME
from .status import Outcome

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
        if status.get("name") == CONTAINER_NAME:
            found: Mapping[str, Any] = status
            return found
    return None


def terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container's terminated state, as soon as the kubelet reports it (before the pod phase moves)."""
    status = container_status(pod)
    return ((status or {}).get("state") or {}).get("terminated")


def is_running(pod: Mapping[str, Any]) -> bool:
    return ((container_status(pod) or {}).get("state") or {}).get("running") is not None


def image_with_digest(pod: Mapping[str, Any], fallback: str) -> str:
    """image@sha256:... from the kubelet's imageID, so the status records exactly what ran."""
    status = container_status(pod) or {}
    image_id = status.get("imageID") or ""
    digest = image_id[image_id.rfind("sha256:"):] if "sha256:" in image_id else ""
    image = status.get("image") or fallback
    return f"{image.split('@')[0]}@{digest}" if digest else image


def eviction(pod: Mapping[str, Any], limits: ResourceLimits | None) -> Outcome | None:
    """The kubelet evicted the sandbox: over its disk (emptyDir or ephemeral storage) or for the node's sake."""
    status = pod.get("status") or {}
    if status.get("reason") != "Evicted":
        return None
    detail = str(status.get("message") or "")[:512]
    if any(word in detail for word in ("EmptyDir", "ephemeral", "emptyDir", "ephemeral-storage")):
        disk = limits.disk if limits else "?"
        return Outcome(Phase.FAILED, Reason.DISK_LIMIT_EXCEEDED,
                       f"the program wrote more than its disk limit of {disk} and the kubelet evicted the sandbox "
                       f"({detail}); write less or raise spec.limits.disk")
    return Outcome(Phase.FAILED, Reason.INTERNAL_ERROR, f"the node evicted the sandbox: {detail}")


def has_failed(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Failed"


def pod_level_failure(pod: Mapping[str, Any], limits: ResourceLimits | None) -> Outcome | None:
    """Pod failed without the container reporting (deadline backstop, eviction)."""
    if not has_failed(pod):
        return None
    status = pod["status"]
    evicted = eviction(pod, limits)
    if evicted or terminated(pod):
        return evicted
    if status.get("reason") == "DeadlineExceeded":
        limit = limits.timeout_seconds if limits else "?"
        return Outcome(Phase.FAILED, Reason.TIMEOUT,
                       f"the sandbox did not finish within its deadline (timeout {limit}s plus start-up); "
                       "raise spec.limits.timeoutSeconds or make the program faster")
    return Outcome(Phase.FAILED, Reason.INTERNAL_ERROR,
                   f"the sandbox pod failed: {status.get('reason', 'unknown')}: {status.get('message', '')}".strip())


def unschedulable(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or ())


def not_scheduled_because(pod: Mapping[str, Any]) -> str | None:
    """What the scheduler says keeps the pod off every node ("0/1 nodes are available: 1 Insufficient cpu."), as
    soon as it says it; None while it has said nothing, or has placed the pod."""
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message") or condition.get("reason") or "no reason given").strip()[:512]
    return None


def waiting_message(pod_name: str, pod: Mapping[str, Any], start_deadline_seconds: int,
                    ends: str = "the run fails Unschedulable", limits: str = "spec.limits") -> str:
    """A Pending run's (or session's) message while its pod has not started: why it waits, in the scheduler's
    words when it has spoken, and how long it may wait before it `ends`."""
    why = not_scheduled_because(pod)
    if why is None:
        return f"sandbox pod {pod_name} created; waiting for it to start"
    if what_to_change(why) != NO_ROOM:  # no node it may run on: room will not help, a node may still come
        return (f"sandbox pod {pod_name} created, not yet scheduled: {why.rstrip('.')}. It waits for such a node "
                f"(a cluster autoscaler may add one) up to {start_deadline_seconds}s from its creation, then {ends}; "
                f"{what_to_change(why)}")
    return (f"sandbox pod {pod_name} created, not yet scheduled: {why.rstrip('.')}. It waits for room on a node "
            f"(other sandboxes ending) up to {start_deadline_seconds}s from its creation, then {ends}; lower "
            f"{limits} or end other runs and sessions to make room")


def never_fits(pod: Mapping[str, Any], allocatable_by_node: Iterable[Mapping[str, str]]) -> Outcome | None:
    """A pod asking for more than any node has will never schedule: say so now instead of after the deadline."""
    asked: dict[str, Decimal] = {}
    for container in pod["spec"]["containers"]:
        for resource, value in ((container.get("resources") or {}).get("requests") or {}).items():
            asked[resource] = asked.get(resource, Decimal(0)) + parse_quantity(value)
    for resource, value in (pod["spec"].get("overhead") or {}).items():
        asked[resource] = asked.get(resource, Decimal(0)) + parse_quantity(value)
    nodes = list(allocatable_by_node)
    if not nodes:
        return None
    for resource in ("cpu", "memory"):
        largest = max(parse_quantity(n.get(resource, "0")) for n in nodes)
        if asked.get(resource, 0) > largest:
            overhead = (pod["spec"].get("overhead") or {}).get(resource)
            note = f" (including {overhead} for the sandbox itself)" if overhead else ""
            return Outcome(Phase.FAILED, Reason.UNSCHEDULABLE,
                           f"the sandbox asks for {_human(resource, asked[resource])} {resource}{note} but the "
                           f"largest node offers {_human(resource, largest)}; lower spec.limits.{resource}")
    return None


def _human(resource: str, value: Decimal) -> str:
    if resource == "memory":
        return f"{value / (1 << 20):.0f}Mi"
    return f"{value.normalize():f}"


def start_verdict(pod: Mapping[str, Any], waited_seconds: float, start_deadline_seconds: int,
                  nodes: Callable[[], Iterable[Mapping[str, Any]]]) -> Outcome | None:
    """Why a pod that has not started never will (a run's, or a session's): limits no node has, at once (`nodes`
    asked only for an unschedulable pod); else what pending_verdict says."""
    verdict = never_fits(pod, [(n.get("status") or {}).get("allocatable") or {} for n in nodes()]) \
        if unschedulable(pod) else None
    return verdict or pending_verdict(pod, waited_seconds, start_deadline_seconds)


# What the scheduler says of a node the pod's own scheduling rules out (kube-scheduler's NodeAffinity and
# TaintToleration plugins), as against one without room.
NO_ROOM = "ask for smaller limits"
_PLACEMENT_WORDS = ("node affinity/selector", "untolerated taint", "didn't match pod's node affinity")


def what_to_change(scheduler_says: str) -> str:
    """Where the scheduler's answer points: the policy's scheduling when no node is one its pods may run on, the
    run's limits otherwise."""
    if any(words in scheduler_says.lower() for words in _PLACEMENT_WORDS):
        return ("no node is one the policy's sandboxes may run on: check spec.scheduling of the CodeRunPolicy "
                "(else the chart's sandboxScheduling) against the nodes' labels and taints")
    return NO_ROOM


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
            said = str(condition.get("message", ""))
            return Outcome(Phase.FAILED, Reason.UNSCHEDULABLE,
                           f"no node could take the sandbox within {start_deadline_seconds}s: {said.rstrip('. ')}; "
                           f"{what_to_change(said)}")
    return Outcome(Phase.FAILED, Reason.START_FAILED,
                   f"the sandbox did not start within {start_deadline_seconds}s ({cause or 'no container status'})")
