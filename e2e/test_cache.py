"""spec.cache: an identical finished run answers at once, with no pod; platform failures are never reused; an
answer never crosses policies and never serves artifacts that are not the earlier run's."""
import base64
import time

from conftest import wait_for
from conftest import PodCensus
from framework.policy import apply_policy

CACHED = {"enabled": True, "ttlSeconds": 600}
PLOT = ("import os, random\nopen(os.path.join(os.environ['CODERUN_OUTPUT_DIR'], 'n.txt'), 'w')"
        ".write(str(random.random()))\nprint(random.random())\n")


def test_identical_run_is_answered_from_the_cache_without_a_pod(operator, namespace):
    census = PodCensus(operator, namespace)
    try:
        started = time.monotonic()
        first = operator.wait_run(namespace, operator.create_run(
            namespace, {"language": "python", "code": PLOT, "cache": CACHED}))
        real_seconds = time.monotonic() - started
        started = time.monotonic()
        second_name = operator.create_run(namespace, {"language": "python", "code": PLOT, "cache": CACHED})
        second = operator.wait_run(namespace, second_name)
        cached_seconds = time.monotonic() - started
    finally:
        census.stop()
    first_status, second_status = first["status"], second["status"]
    assert first_status["phase"] == "Succeeded" and "cachedFrom" not in first_status
    assert second_status["cachedFrom"] == first["metadata"]["name"]
    assert second_status["stdout"] == first_status["stdout"]  # random output: only a copy can match
    assert second_status["artifacts"][0]["sha256"] == first_status["artifacts"][0]["sha256"]
    assert second_status["artifacts"][0]["configMap"].startswith(second_name)
    assert second_name not in census.pods_by_run and len(census.pods_by_run[first["metadata"]["name"]]) == 1
    assert cached_seconds < real_seconds / 3, (cached_seconds, real_seconds)


def test_without_cache_enabled_or_after_a_platform_failure_the_code_runs(operator, namespace):
    code = "import time, random\ntime.sleep(8)\nprint(random.random())"
    broken = operator.create_run(namespace, {"language": "python", "code": code, "cache": CACHED,
                                             "limits": {"timeoutSeconds": 30}})
    operator.core.delete_namespaced_pod(operator.wait_running(namespace, broken), namespace, grace_period_seconds=0)
    assert operator.wait_run(namespace, broken)["status"]["reason"] == "PodDeleted"
    quick = "import random\nprint(random.random())"
    again = operator.wait_run(namespace, operator.create_run(
        namespace, {"language": "python", "code": code, "cache": CACHED, "limits": {"timeoutSeconds": 30}}),
        timeout=120)["status"]
    assert "cachedFrom" not in again and again["phase"] == "Succeeded"
    first = operator.wait_run(namespace, operator.create_run(namespace, {"language": "python", "code": quick}))
    uncached = operator.wait_run(namespace, operator.create_run(namespace, {"language": "python", "code": quick}))
    assert "cachedFrom" not in uncached["status"]
    assert uncached["status"]["stdout"] != first["status"]["stdout"]


def test_the_cache_never_crosses_policies(operator, namespace):
    """Same code, same limits, two policies: the redacting one is never answered with the plain one's output."""
    apply_policy(operator, namespace, "plain", {})
    apply_policy(operator, namespace, "redacting", {"redactionPatterns": ["tok-[0-9]{5}"]})
    code = "print('the token is tok-' + str(12345))"
    spec = {"language": "python", "code": code, "cache": CACHED}
    plain = operator.wait_run(namespace, operator.create_run(namespace, {**spec, "policyRef": "plain"}))["status"]
    assert plain["phase"] == "Succeeded" and plain["stdout"] == "the token is tok-12345\n", plain
    first = operator.create_run(namespace, {**spec, "policyRef": "redacting"})
    redacted = operator.wait_run(namespace, first)["status"]
    assert redacted["phase"] == "Succeeded", redacted
    assert "tok-12345" not in redacted["stdout"] and "[REDACTED:policy]" in redacted["stdout"], redacted["stdout"]
    assert "cachedFrom" not in redacted and redacted["policy"] == "redacting", redacted
    assert redacted["decision"]["redactionPatterns"] == ["tok-[0-9]{5}"]
    # Within one policy the cache still answers, and the answer names this run's own policy.
    again = operator.wait_run(namespace, operator.create_run(namespace, {**spec, "policyRef": "redacting"}))["status"]
    assert again["cachedFrom"] == first and again["policy"] == "redacting", again
    assert again["policyDigest"] == redacted["policyDigest"] and "tok-12345" not in again["stdout"]


def test_a_configmap_squatting_the_sources_artifacts_name_is_never_served(operator, namespace):
    """Someone replaces the earlier run's artifacts ConfigMap with their own bytes under its name (even with a
    copied owner reference): the cache does not serve it, the run runs for real."""
    first_name = operator.create_run(namespace, {"language": "python", "code": PLOT, "cache": CACHED})
    first = operator.wait_run(namespace, first_name)
    listed = first["status"]["artifacts"][0]
    source_cm = operator.core.read_namespaced_config_map(listed["configMap"], namespace)
    operator.core.delete_namespaced_config_map(listed["configMap"], namespace)
    forged = base64.b64encode(b"forged").decode()
    body = {"metadata": {"name": listed["configMap"], "ownerReferences": [
        {"apiVersion": o.api_version, "kind": o.kind, "name": o.name, "uid": o.uid, "controller": True}
        for o in source_cm.metadata.owner_references]}, "binaryData": {listed["key"]: forged}}
    wait_for(lambda: operator.core.create_namespaced_config_map(namespace, body), 30,
             "the squatting ConfigMap to be created once the genuine one is gone")
    second = operator.wait_run(namespace, operator.create_run(namespace, {"language": "python", "code": PLOT,
                                                                          "cache": CACHED}))["status"]
    assert second["phase"] == "Succeeded" and "cachedFrom" not in second, second
    assert second["stdout"] != first["status"]["stdout"]  # random output: it ran again
    copied = operator.core.read_namespaced_config_map(second["artifacts"][0]["configMap"], namespace)
    assert copied.binary_data[second["artifacts"][0]["key"]] != forged
