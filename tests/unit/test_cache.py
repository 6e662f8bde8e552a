import json
import re
from datetime import datetime, timedelta, timezone

from dataclasses import replace

import pytest

from coderun.api.models import CodeRunSpec, EgressRule
from coderun_operator.policy import DEFAULT_POLICY, evaluate
from coderun_operator.results.cache import (cache_key, image_digest, is_reusable, is_same_source, pick_reusable,
                                                reused_outcome)
from coderun_operator.policy.redact import Redactor

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)


DIGEST = "sha256:" + "a" * 64


def key_of(digest=DIGEST, policy=DEFAULT_POLICY, **fields):
    spec = CodeRunSpec.model_validate({"language": "python", "code": "print(1)", **fields})
    return cache_key(spec, evaluate(spec, policy), digest)


def decision_of(policy=DEFAULT_POLICY, **fields):
    spec = CodeRunSpec.model_validate({"language": "python", "code": "print(1)", **fields})
    return spec, evaluate(spec, policy)


def finished(name, key, seconds_ago, phase="Succeeded", reason="Completed", **extra):
    return {"metadata": {"name": name}, "status": {
        "phase": phase, "reason": reason, "cacheKey": key, "message": "the program exited with code 0",
        "completionTime": (NOW - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z"),
        "exitCode": 0, "stdout": "1\n", "metrics": {"wallMillis": 40, "totalMillis": 3000}, **extra}}


def test_the_key_covers_inputs_and_limits_but_not_expectations():
    base = key_of()
    assert base == key_of(expect={"exitCode": 0}) == key_of(cache={"enabled": True})
    assert len({base, key_of(code="print(2)"), key_of(stdin="x"), key_of(limits={"memory": "512Mi"}),
                key_of(limits={"disk": "16Mi"}),
                key_of(files=[{"path": "a", "content": "b"}]), key_of(digest="sha256:" + "b" * 64)}) == 7


def test_without_an_image_digest_there_is_no_key():
    assert key_of(digest=None) is None


def test_the_digest_comes_from_the_reference_or_a_node_record_of_the_tag():
    pinned = "registry.example/python@sha256:" + "c" * 64
    assert image_digest(pinned) == "sha256:" + "c" * 64
    nodes = [{"names": ["registry.example/python:v1", "registry.example/python@sha256:" + "d" * 64]},
             {"names": ["registry.example/other:v1", "registry.example/other@sha256:" + "e" * 64]}]
    assert image_digest("registry.example/python:v1", nodes) == "sha256:" + "d" * 64
    assert image_digest("registry.example/python:v2", nodes) is None
    assert image_digest("localhost:5000/python:v1", [{"names": ["localhost:5000/python:v1"]}]) is None


def test_the_newest_reusable_run_within_the_ttl_wins():
    key = key_of()
    runs = [finished("old", key, 500), finished("new", key, 20), finished("too-old", key, 9000),
            finished("other-key", "x", 1), finished("infra", key, 2, phase="Failed", reason="PodDeleted"),
            finished("copy", key, 1, cachedFrom="new")]
    assert pick_reusable(runs, key, 600, NOW)["metadata"]["name"] == "new"
    assert pick_reusable(runs, key, 10, NOW) is None


# The four crossings seen on the cluster: same code and limits, other policies.
REDACTING = replace(DEFAULT_POLICY, name="redacting", digest="sha256:" + "1" * 64, redaction_patterns=("tok-[0-9]+",))
PLAIN = replace(DEFAULT_POLICY, name="plain", digest="sha256:" + "2" * 64)
EGRESS = replace(PLAIN, egress=(EgressRule(cidr="10.0.0.5/32"),))
FEW_PROCESSES = replace(PLAIN, max_processes=8)


@pytest.mark.parametrize("other", [REDACTING, EGRESS, FEW_PROCESSES, replace(PLAIN, max_inodes=64),
                                   replace(PLAIN, digest="sha256:" + "3" * 64)])
def test_the_key_covers_the_whole_decision_not_only_code_and_limits(other):
    assert key_of(policy=PLAIN) == key_of(policy=replace(PLAIN))
    assert key_of(policy=other) != key_of(policy=PLAIN)


def test_program_outcomes_are_reusable_platform_failures_and_refusals_are_not():
    for reason in ("Completed", "NonZeroExit", "Timeout", "OOMKilled", "DiskLimitExceeded", "ProcessLimitExceeded",
                   "OutputLimitExceeded", "Signaled", "SandboxViolation"):
        assert is_reusable({"phase": "Succeeded" if reason == "Completed" else "Failed", "reason": reason})
    for reason in ("InternalError", "PodDeleted", "Unschedulable", "ImageUnavailable", "StartFailed", "NameConflict",
                   "InvalidSpec", "SomethingNew"):
        assert not is_reusable({"phase": "Failed", "reason": reason})
    assert not is_reusable({"phase": "Rejected", "reason": "PolicyDenied"})


def test_reused_outcome_copies_the_result_and_revalidates():
    source = finished("first", "k", 30)
    spec, decision = decision_of(expect={"exitCode": 3})
    outcome = reused_outcome(source, spec, decision, DIGEST, [], Redactor(), NOW)
    assert (outcome.phase, outcome.reason) == ("Succeeded", "Completed")
    assert outcome.fields["stdout"] == "1\n" and outcome.fields["cachedFrom"] == "first"
    assert outcome.fields["metrics"] == {"wallMillis": 40}
    assert outcome.fields["validation"]["valid"] is False
    assert "reused from first" in outcome.message and "30s ago" in outcome.message


def test_a_reused_result_is_redacted_again_with_this_runs_patterns():
    source = finished("plain-run", "k", 5, stdout="the token is tok-12345\n", stderr="tok-9 leaked",
                      error={"type": "ValueError", "message": "bad tok-77", "line": 2}, redactions=0,
                      message="the program exited with code 1: ValueError at line 2: bad tok-77",
                      artifactsSkipped=[{"name": "tok-5.txt", "why": "too-large"}])
    spec, decision = decision_of(policy=REDACTING)
    artifacts = [{"name": "out-tok-1.csv", "size": 1, "sha256": "0" * 64, "configMap": "x-artifacts", "key": "a"}]
    outcome = reused_outcome(source, spec, decision, DIGEST, artifacts, Redactor(REDACTING.redaction_patterns), NOW)
    shown = json_text(outcome)
    assert not re.search("tok-[0-9]", shown), shown
    assert outcome.fields["stdout"] == "the token is [REDACTED:policy]\n"
    assert outcome.fields["redactions"] == 5  # stdout, stderr, error message, two names (the message repeats one)


def test_text_redacted_once_is_not_counted_again():
    source = finished("r", "k", 5, stdout="password=[REDACTED:credential]\n", redactions=1)
    spec, decision = decision_of()
    outcome = reused_outcome(source, spec, decision, DIGEST, [], Redactor(), NOW)
    assert outcome.fields["stdout"] == "password=[REDACTED:credential]\n" and outcome.fields["redactions"] == 1


def test_what_decided_the_run_is_never_copied_from_the_source():
    source = finished("plain-run", "k", 5, policy="plain", policyDigest=PLAIN.digest, runtimeClass="runc",
                      image="elsewhere/python@sha256:" + "9" * 64, codeHash="sha256:other",
                      effectiveLimits={"timeoutSeconds": 99}, decision={"policy": "plain"})
    spec, decision = decision_of(policy=REDACTING)
    fields = reused_outcome(source, spec, decision, DIGEST, [], Redactor(), NOW).fields
    assert (fields["policy"], fields["policyDigest"]) == ("redacting", REDACTING.digest)
    assert fields["decision"]["policy"] == "redacting" and fields["decision"]["redactionPatterns"] == ["tok-[0-9]+"]
    assert fields["runtimeClass"] == "gvisor" and fields["effectiveLimits"]["timeoutSeconds"] == 5
    assert fields["image"] == "coderun.local/sandbox-python:v2@" + DIGEST
    assert fields["codeHash"] != "sha256:other"


def test_the_fetched_source_must_be_the_picked_run_still_answering_the_key():
    picked = {"metadata": {"name": "first", "uid": "u1"}}
    good = {**finished("first", "k", 5), "metadata": {"name": "first", "uid": "u1"}}
    assert is_same_source(good, picked, "k")
    assert not is_same_source(None, picked, "k")
    assert not is_same_source({**good, "metadata": {"name": "first", "uid": "u2"}}, picked, "k")  # name reused
    assert not is_same_source(good, picked, "other-key")


def json_text(outcome):
    return json.dumps(outcome.fields) + outcome.message
