from datetime import datetime, timedelta, timezone

from coderun.api.models import CodeRunSpec
from coderun.controlplane.policy import DEFAULT_POLICY, evaluate
from coderun.controlplane.results.cache import cache_key, image_digest, is_reusable, pick_reusable, reused_outcome

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)


DIGEST = "sha256:" + "a" * 64


def key_of(digest=DIGEST, **fields):
    spec = CodeRunSpec.model_validate({"language": "python", "code": "print(1)", **fields})
    return cache_key(spec, evaluate(spec, DEFAULT_POLICY), digest)


def finished(name, key, seconds_ago, phase="Succeeded", reason="Completed", **extra):
    return {"metadata": {"name": name}, "status": {
        "phase": phase, "reason": reason, "cacheKey": key, "message": "the program exited with code 0",
        "completionTime": (NOW - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z"),
        "exitCode": 0, "stdout": "1\n", "metrics": {"wallMillis": 40, "totalMillis": 3000}, **extra}}


def test_the_key_covers_inputs_and_limits_but_not_expectations():
    base = key_of()
    assert base == key_of(expect={"exitCode": 0}) == key_of(cache={"enabled": True})
    assert len({base, key_of(code="print(2)"), key_of(stdin="x"), key_of(limits={"memory": "512Mi"}),
                key_of(files=[{"path": "a", "content": "b"}]), key_of(digest="sha256:" + "b" * 64)}) == 6


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


def test_program_failures_are_reusable_platform_failures_are_not():
    assert is_reusable({"phase": "Failed", "reason": "NonZeroExit"})
    assert is_reusable({"phase": "Failed", "reason": "Timeout"})
    for reason in ("InternalError", "PodDeleted", "Unschedulable", "ImageUnavailable"):
        assert not is_reusable({"phase": "Failed", "reason": reason})
    assert not is_reusable({"phase": "Rejected", "reason": "PolicyDenied"})


def test_reused_outcome_copies_the_result_and_revalidates():
    source = finished("first", "k", 30)
    spec = CodeRunSpec.model_validate({"language": "python", "code": "print(1)", "expect": {"exitCode": 3}})
    outcome = reused_outcome(source, spec, [], NOW)
    assert (outcome.phase, outcome.reason) == ("Succeeded", "Completed")
    assert outcome.fields["stdout"] == "1\n" and outcome.fields["cachedFrom"] == "first"
    assert outcome.fields["metrics"] == {"wallMillis": 40}
    assert outcome.fields["validation"]["valid"] is False
    assert "reused from first" in outcome.message and "30s ago" in outcome.message
