import pytest

from coderun_operator.policy import DEFAULT_POLICY
from coderun_operator.results.pod_state import (image_with_digest, never_fits, pending_verdict, pod_level_failure,
                                       terminated, waiting_message)


def pod(waiting=None, terminated_state=None, phase="Pending", conditions=(), reason=None, image_id=""):
    state = {"waiting": waiting} if waiting else {"terminated": terminated_state} if terminated_state else {}
    status = {"phase": phase, "conditions": list(conditions),
              "containerStatuses": [{"name": "run", "state": state, "image": "img:v1", "imageID": image_id}]}
    if reason:
        status["reason"] = reason
    return {"status": status}


def test_terminated_is_seen_before_the_pod_phase_moves():
    assert terminated(pod(terminated_state={"exitCode": 0}, phase="Running")) == {"exitCode": 0}
    assert terminated(pod(phase="Running")) is None


@pytest.mark.parametrize("waiting,waited,reason", [
    ({"reason": "InvalidImageName", "message": "bad"}, 0, "ImageUnavailable"),
    ({"reason": "ErrImageNeverPull"}, 0, "ImageUnavailable"),
    ({"reason": "ImagePullBackOff"}, 31, "ImageUnavailable"),
    ({"reason": "CreateContainerConfigError"}, 0, "StartFailed"),
])
def test_start_failures_fail_the_run(waiting, waited, reason):
    assert pending_verdict(pod(waiting=waiting), waited, 300).reason == reason


def test_pending_is_patient_until_the_deadline():
    assert pending_verdict(pod(waiting={"reason": "ImagePullBackOff"}), 5, 300) is None
    assert pending_verdict(pod(waiting={"reason": "ContainerCreating"}), 100, 300) is None
    unschedulable = pod(conditions=[{"type": "PodScheduled", "status": "False", "message": "Insufficient cpu"}])
    verdict = pending_verdict(unschedulable, 301, 300)
    assert verdict.reason == "Unschedulable" and "Insufficient cpu" in verdict.message


def test_a_waiting_pod_s_message_is_the_scheduler_s_word_once_it_has_one():
    assert waiting_message("p", pod(), 300) == "sandbox pod p created; waiting for it to start"
    scheduled = pod(conditions=[{"type": "PodScheduled", "status": "True"}])
    assert waiting_message("p", scheduled, 300) == "sandbox pod p created; waiting for it to start"
    stuck = pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                             "message": "0/1 nodes are available: 1 Insufficient cpu."}])
    message = waiting_message("p", stuck, 120)
    assert message.startswith("sandbox pod p created, not yet scheduled: 0/1 nodes are available: 1 Insufficient cpu. ")
    assert "up to 120s" in message and "fails Unschedulable" in message


def test_pod_level_failures():
    limits = DEFAULT_POLICY.defaults
    assert pod_level_failure(pod(phase="Failed", reason="DeadlineExceeded"), limits).reason == "Timeout"
    assert pod_level_failure(pod(phase="Failed", reason="Evicted"), None).reason == "InternalError"
    assert pod_level_failure(pod(phase="Running"), None) is None


def test_image_digest_is_recorded():
    assert image_with_digest(pod(image_id="docker.io/x@sha256:abc"), "img:v1") == "img:v1@sha256:abc"
    assert image_with_digest(pod(), "img:v1") == "img:v1"


def sandbox(cpu, memory, overhead=None):
    spec = {"containers": [{"resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
    if overhead:
        spec["overhead"] = overhead
    return {"spec": spec}


def test_a_pod_larger_than_every_node_fails_at_once_with_the_numbers():
    nodes = [{"cpu": "2", "memory": "24Gi"}, {"cpu": "1", "memory": "8Gi"}]
    verdict = never_fits(sandbox("2", "256Mi", {"cpu": "50m", "memory": "64Mi"}), nodes)
    assert verdict.reason == "Unschedulable"
    assert "2.05 cpu (including 50m for the sandbox itself)" in verdict.message and "offers 2" in verdict.message
    assert never_fits(sandbox("1", "256Mi", {"cpu": "50m"}), nodes) is None
    assert "Mi" in never_fits(sandbox("1", "30Gi"), nodes).message
    assert never_fits(sandbox("64", "1Gi"), []) is None
