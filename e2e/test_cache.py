"""spec.cache: an identical finished run answers at once, with no pod; platform failures are never reused."""
import time

from test_operator_restart import PodCensus

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
