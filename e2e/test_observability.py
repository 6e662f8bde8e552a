"""What a person looks at: Prometheus metrics, the liveness endpoint, Events on the CodeRun, kubectl get."""
import re
import urllib.request

from conftest import wait_for

from coderun.api.models import GROUP, PLURAL, VERSION


def fetch(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


def test_metrics_liveness_events_and_printer_columns(operator, namespace):
    ok = operator.wait_run(namespace, operator.create_run(namespace, {"language": "python", "code": "print(1)"}))
    bad = operator.wait_run(namespace, operator.create_run(namespace, {"language": "python", "code": "1/0"}))

    status, body = fetch(operator.operator.healthz_url())
    assert status == 200
    status, metrics = fetch(operator.operator.metrics_url())
    assert status == 200
    assert re.search(r'coderun_runs_total\{language="python",phase="Succeeded",reason="Completed"\} [1-9]', metrics)
    assert re.search(r'coderun_runs_total\{language="python",phase="Failed",reason="NonZeroExit"\} [1-9]', metrics)
    for histogram in ("coderun_run_total_seconds", "coderun_run_queue_seconds", "coderun_run_startup_seconds"):
        assert re.search(rf'{histogram}_count\{{language="python"\}} [1-9]', metrics), histogram
    assert "coderun_cache_hits_total" in metrics

    events = operator.core.list_namespaced_event(namespace).items
    by_run = {(e.involved_object.name, e.reason) for e in events if e.involved_object.kind == "CodeRun"}
    assert (ok["metadata"]["name"], "PodCreated") in by_run and (ok["metadata"]["name"], "Completed") in by_run
    warning = next(e for e in events if e.involved_object.name == bad["metadata"]["name"] and e.reason == "NonZeroExit")
    assert warning.type == "Warning" and "ZeroDivisionError" in warning.message

    table = operator.kubectl("get", "crun", "-n", namespace).stdout
    assert re.search(rf'{ok["metadata"]["name"]}\s+Succeeded\s+Completed\s+0\s+\d+', table), table
    assert re.search(rf'{bad["metadata"]["name"]}\s+Failed\s+NonZeroExit\s+1\s+\d+', table), table


def active_runs(operator, namespace: str) -> float:
    """The namespace's own series (absent: none active); it moves with no other namespace's runs."""
    found = re.search(rf'^coderun_active_runs\{{namespace="{re.escape(namespace)}"\}} (\S+)$',
                      fetch(operator.operator.metrics_url())[1], re.M)
    return float(found.group(1)) if found else 0.0


def test_the_active_runs_gauge_follows_runs_and_forgets_deleted_ones(operator, namespace):
    assert active_runs(operator, namespace) == 0  # a new namespace: no series yet
    name = operator.create_run(namespace, {"language": "python", "code": "import time; time.sleep(60)",
                                           "limits": {"timeoutSeconds": 90}})
    operator.wait_running(namespace, name)
    assert active_runs(operator, namespace) == 1
    operator.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    # A run deleted before it finished must not stay counted (the gauge used to grow forever): its namespace's
    # series goes, whatever other namespaces run meanwhile.
    wait_for(lambda: active_runs(operator, namespace) == 0, 30, "the deleted run to leave its namespace's gauge")
    assert f'coderun_active_runs{{namespace="{namespace}"}}' not in fetch(operator.operator.metrics_url())[1]
