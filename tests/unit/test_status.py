from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from coderun.api.models import CodeRunSpec, ResourceLimits
from coderun_operator.policy import DEFAULT_POLICY
from coderun_operator.results.lifecycle import expiry_time, ttl_seconds
from coderun_operator.results.frame import RunnerFrame
from coderun_operator.policy.redact import Redactor
from coderun_operator.results.status import (Outcome, outcome_from_frame, outcome_without_frame, running_status,
                                             set_condition, terminal_status)

NOW = datetime(2026, 11, 22, 10, 0, 5, tzinfo=timezone.utc)
LIMITS = ResourceLimits(timeout_seconds=5, memory="256Mi", cpu="500m", disk="64Mi", output_bytes=65536)


def frame(**fields):
    return RunnerFrame.model_validate({"version": 1, "reason": "Completed", "exitCode": 0, **fields})


def outcome(f, expect=None, oom=False):
    spec = CodeRunSpec.model_validate({"language": "python", "code": "x", **({"expect": expect} if expect else {})})
    return outcome_from_frame(spec, f, Redactor(), oom, LIMITS, NOW - timedelta(seconds=2), [], [])


@pytest.mark.parametrize("fields,phase,reason,says", [
    ({}, "Succeeded", "Completed", "code 0"),
    ({"reason": "NonZeroExit", "exitCode": 1, "error": {"type": "KeyError", "message": "'a'", "line": 4}},
     "Failed", "NonZeroExit", "KeyError at line 4"),
    ({"reason": "NonZeroExit", "exitCode": 2}, "Failed", "NonZeroExit", "see stderr"),
    ({"reason": "Timeout", "exitCode": None, "signal": 9}, "Failed", "Timeout", "within 5s"),
    ({"reason": "Signaled", "exitCode": None, "signal": 9, "oomKilled": True}, "Failed", "OOMKilled", "256Mi"),
    ({"reason": "OutputLimitExceeded"}, "Failed", "OutputLimitExceeded", "65536 bytes"),
    ({"reason": "InvalidInput", "message": "path escapes"}, "Failed", "InvalidSpec", "path escapes"),
    ({"reason": "RunnerError", "message": "boom"}, "Failed", "InternalError", "boom"),
    ({"reason": "Signaled", "signal": 15}, "Failed", "Signaled", "signal 15 (SIGTERM)"),
    ({"reason": "DiskLimitExceeded", "limit": {"kind": "disk", "limit": 16777216, "observed": 20000000}},
     "Failed", "DiskLimitExceeded", "used 20000000 bytes in /tmp, over its disk limit of 16777216"),
    ({"reason": "DiskLimitExceeded", "limit": {"kind": "inodes", "limit": 100, "observed": 101}},
     "Failed", "DiskLimitExceeded", "created 101 files and directories"),
    ({"reason": "ProcessLimitExceeded", "limit": {"kind": "processes", "limit": 128, "observed": 128}},
     "Failed", "ProcessLimitExceeded", "limit of 128"),
    ({"reason": "SandboxViolation", "limit": {"kind": "termination-log", "limit": 0, "observed": 9}},
     "Failed", "SandboxViolation", "/dev/termination-log"),
    ({"reason": "SomethingNew"}, "Failed", "InternalError", "SomethingNew"),
])
def test_runner_reasons_map_to_phase_reason_and_advice(fields, phase, reason, says):
    result = outcome(frame(**fields))
    assert (result.phase, result.reason) == (phase, reason)
    assert says in result.message


def test_container_oom_overrides_the_runner_reason():
    assert outcome(frame(reason="Signaled", signal=9), oom=True).reason == "OOMKilled"


def test_output_is_redacted_and_startup_measured():
    result = outcome(frame(stdout="AKIAIOSFODNN7EXAMPLE\n", startedAtMillis=int((NOW.timestamp() - 1.5) * 1000)))
    assert "AKIA" not in result.fields["stdout"] and result.fields["redactions"] == 1
    assert result.fields["metrics"]["startupMillis"] == 500


def test_expectations_are_checked():
    result = outcome(frame(stdout="7"), expect={"exitCode": 0, "stdoutJSONSchema": {"type": "string"}})
    assert result.fields["validation"]["valid"] is False


@pytest.mark.parametrize("terminated,truncated,reason", [
    ({"reason": "OOMKilled", "exitCode": 137}, False, "OOMKilled"),
    ({"reason": "Error", "exitCode": 137}, False, "InternalError"),  # SIGKILL alone is not an OOM
    ({"reason": "Error", "exitCode": 1}, True, "OutputLimitExceeded"),
    ({"reason": "Error", "exitCode": 1}, False, "InternalError"),
])
def test_without_a_frame_the_container_state_decides(terminated, truncated, reason):
    container = {"state": {"terminated": terminated}}
    assert outcome_without_frame("no frame", truncated, container, LIMITS).reason == reason


@pytest.mark.parametrize("truncated", [False, True])
def test_without_a_frame_the_nodes_oom_kill_count_says_memory_when_containerd_said_error(truncated):
    """containerd's TaskOOM can arrive after the exit it explains: the kubelet then says Error, exit code 128."""
    container = {"state": {"terminated": {"reason": "Error", "exitCode": 128}}}
    outcome = outcome_without_frame("no frame", truncated, container, LIMITS, node_saw_oom_kill=True)
    assert (outcome.reason, outcome.fields) == ("OOMKilled", {"signal": 9})
    assert outcome_without_frame("no frame", False, container, LIMITS).reason == "InternalError"


def test_condition_transition_time_moves_only_on_flips():
    first = set_condition(None, "Running", True, "Started", "", 1, NOW)
    same = set_condition(first, "Running", True, "Started", "again", 1, NOW + timedelta(seconds=3))
    flipped = set_condition(same, "Running", False, "Completed", "", 1, NOW + timedelta(seconds=9))
    assert same[0]["lastTransitionTime"] == first[0]["lastTransitionTime"] and same[0]["message"] == "again"
    assert flipped[0]["lastTransitionTime"] != first[0]["lastTransitionTime"]


def test_terminal_status_sets_conditions_and_total_time(run_body):
    # The client's millisecond stamp, within the second the API server stamped (10:00:00)
    body = run_body(annotations={"coderun.io/created-at": "2026-11-22T10:00:00.250Z"})
    body["status"] = {"conditions": set_condition(None, "Running", True, "Started", "", 1, NOW)}
    status = terminal_status(body, Outcome("Failed", "Timeout", "too slow", {"exitCode": None}), NOW)
    by_type = {c.type: c for c in status.conditions}
    assert by_type["Failed"].status == "True" and by_type["Running"].status == "False"
    assert "Complete" not in by_type
    assert status.metrics.total_millis == 4750 and status.completion_time == "2026-11-22T10:00:05.000Z"
    assert status.observed_generation == 1


@pytest.mark.parametrize("phase, reason, ends_as", [("Succeeded", "Completed", "Complete"),
                                                    ("Failed", "NonZeroExit", "Failed"),
                                                    ("Failed", "Unschedulable", "Failed"),
                                                    ("Rejected", "PolicyDenied", "Failed")])
def test_every_terminal_phase_is_finished_for_kubectl_wait(run_body, phase, reason, ends_as):
    """`kubectl wait --for=condition=Complete` hangs on a failed run; Finished is True on every outcome, with the
    outcome's reason and message, beside Complete or Failed."""
    body = run_body()
    status = terminal_status(body, Outcome(phase, reason, f"it was {reason}"), NOW)
    by_type = {c.type: c for c in status.conditions}
    finished = by_type["Finished"]
    assert (finished.status, finished.reason, finished.message) == ("True", reason, f"it was {reason}")
    assert by_type[ends_as].status == "True" and not ({"Complete", "Failed"} - {ends_as}) & set(by_type)
    assert "Finished" not in {c.type for c in running_status(body, NOW).conditions}  # only once it ended
    body["status"] = status.model_dump(by_alias=True, exclude_none=True)  # written again later: the same moment
    again = terminal_status(body, Outcome(phase, reason, f"it was {reason}"), NOW + timedelta(seconds=5))
    assert {c.type: c for c in again.conditions}["Finished"].last_transition_time == finished.last_transition_time


def test_terminal_status_leaves_the_outcome_and_the_run_as_they_were(run_body):
    body = run_body()
    outcome = Outcome("Succeeded", "Completed", "ok", {"exitCode": 0, "metrics": {"wallMillis": 5}})
    before = (repr(body), repr(outcome))
    assert terminal_status(body, outcome, NOW) == terminal_status(body, outcome, NOW)
    assert (repr(body), repr(outcome)) == before


def test_rejected_run_is_not_accepted(run_body):
    status = terminal_status(run_body(), Outcome("Rejected", "PolicyDenied", "no"), NOW)
    by_type = {c.type: c for c in status.conditions}
    assert by_type["Accepted"].status == "False" and by_type["Failed"].reason == "PolicyDenied"


def test_a_secret_cut_by_the_output_cap_is_redacted_whole_then_cut():
    secret = "ghp_" + "a1B2" * 9
    text = "x" * 65529 + " " + secret + " tail"  # the runner keeps a margin beyond outputBytes; the cap cuts the secret
    result = outcome(frame(stdout=text, stdoutTruncated=False))
    assert "ghp_" not in result.fields["stdout"] and "a1B2" not in result.fields["stdout"]
    assert len(result.fields["stdout"].encode()) <= LIMITS.output_bytes and result.fields["stdoutTruncated"]
    assert result.fields["redactions"] == 1


def test_every_string_from_the_program_is_redacted():
    key = "AKIAIOSFODNN7EXAMPLE"
    result = outcome(frame(reason="NonZeroExit", exitCode=1, stdout=f'"{key}"',
                           error={"type": key, "message": f"leaked {key}", "line": 2}),
                     expect={"stdoutJSONSchema": {"type": "integer"}})
    spec = CodeRunSpec.model_validate({"language": "python", "code": "x"})
    named = outcome_from_frame(spec, frame(), Redactor(), False, LIMITS, NOW, [{"name": f"{key}.txt", "size": 1}],
                               [{"name": f"dir/{key}", "why": "symlink"}])
    seen = repr(result.fields) + result.message + repr(named.fields)
    assert key not in seen and result.fields["redactions"] == 3 and named.fields["redactions"] == 2


def test_a_secret_across_the_cut_of_an_error_or_a_name_is_redacted_whole_then_cut():
    secret = "ghp_" + "a1B2" * 9
    message = "m" * 4085 + " " + secret  # the status shows 4096 characters: the cut falls inside the secret
    name = "n" * 1010 + " " + secret
    spec = CodeRunSpec.model_validate({"language": "python", "code": "x"})
    result = outcome_from_frame(spec, frame(reason="NonZeroExit", exitCode=1,
                                            error={"type": "ValueError", "message": message, "line": 1}),
                                Redactor(), False, LIMITS, NOW, [{"name": name, "size": 1}], [])
    error, [artifact] = result.fields["error"], result.fields["artifacts"]
    assert "ghp_" not in error["message"] + artifact["name"] and "a1B2" not in error["message"] + artifact["name"]
    assert len(error["message"]) == 4096 and len(artifact["name"]) == 1024 and result.fields["redactions"] == 2


# ------------------------------------------------------------------ lifecycle: when a finished run is deleted
SHORT = replace(DEFAULT_POLICY, name="short", ttl_seconds_after_finished=5, max_ttl_seconds_after_finished=600)


@pytest.mark.parametrize("spec,status,seconds", [
    ({"ttlSecondsAfterFinished": 60}, {}, 60),                                    # the run's own
    ({"ttlSecondsAfterFinished": 86400}, {}, 600),                                # never beyond the policy's maximum
    ({}, {"decision": {"ttlSecondsAfterFinished": 7}}, 7),                        # the deciding policy's, recorded
    ({}, {}, 5),                                                                  # refused before a decision
    ({"policyRef": "gone"}, {}, 3600),                                            # no such policy: the built-in
    ({"ttlSecondsAfterFinished": "soon"}, {}, 5),                                 # garbage is ignored
])
def test_the_ttl_of_a_finished_run(spec, status, seconds):
    run = {"metadata": {}, "spec": {"policyRef": "short", **spec},
           "status": {"completionTime": "2026-11-22T10:00:00Z", **status}}
    assert ttl_seconds(run, {"short": SHORT}) == seconds
    assert expiry_time(run, {"short": SHORT}) == datetime(2026, 11, 22, 10, 0, tzinfo=timezone.utc) + \
        timedelta(seconds=seconds)
