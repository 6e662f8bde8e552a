"""The warm pool on the real cluster: pods kept per policy, a run on a claimed pod with the same status as a cold
run, the pool refilled, the cold fallback, and the operator killed mid-claim (no run lost, none run twice).

Whether a program ran is read from the kubelet's own container logs on this host (/var/log/pods): a warm pod's
runner prints `CODERUN-ACCEPTED` once it has the whole input, before the program starts, and nothing else can.
"""
from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from pathlib import Path

import pytest

from coderun.api.coderunpolicy import POLICY_PLURAL
from coderun.api.models import GROUP, VERSION
from conftest import NAMESPACE_LABELS, PodCensus, apply_warm_pool, pool_ready, wait_for
from framework.warm import CASES, SEEN, comparable, differences, pool_pod_names

POD_LOGS = Path("/var/log/pods")


@contextlib.contextmanager
def cold_twin(cluster, namespace: str, warm_pool: dict, **policy):
    """A namespace beside `namespace` with the same policy but no pool; `namespace` gets the pool."""
    cold_ns = f"{namespace}-cold"
    cluster.core.create_namespace({"metadata": {"name": cold_ns, "labels": NAMESPACE_LABELS}})
    try:
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, cold_ns, POLICY_PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy", "metadata": {"name": "default"},
            "spec": {"admission": "Record", **policy}})
        apply_warm_pool(cluster, namespace, warm_pool, **policy)
        yield cold_ns
    finally:
        cluster.core.delete_namespace(cold_ns, propagation_policy="Background")


def run_warm_and_cold(cluster, namespace: str, cold_ns: str, name: str, spec: dict) -> tuple[dict, dict]:
    """The same run in both namespaces, once each: (warm status, cold status), asserted equal where it counts."""
    spec = {"language": "python", **spec}
    wait_for(lambda: pool_ready(cluster, namespace, spec["language"]) >= 1, 120, "a ready warm pod")
    warm = cluster.wait_run(namespace, cluster.create_run(namespace, spec, name=name), timeout=120)["status"]
    cold = cluster.wait_run(cold_ns, cluster.create_run(cold_ns, spec, name=name), timeout=120)["status"]
    assert warm["startMode"] == "Warm", (name, warm)
    assert cold["startMode"] == "Cold", (name, cold)
    warm_view, cold_view = comparable(warm, name), comparable(cold, name)
    assert warm_view == cold_view, (name, differences(warm_view, cold_view))
    assert warm["podName"].startswith("pool-default-")
    return warm, cold


def test_a_warm_run_has_the_status_a_cold_run_has(cluster, operator, namespace):
    """The same programs in a namespace with a pool and in one without, under the same policy otherwise."""
    # python and javascript; the waiting pods reserve little, so a one-core cold twin fits beside them
    with cold_twin(cluster, namespace, {"size": 2, "cpuRequest": "10m"}) as cold_ns:
        for name, spec in CASES:
            warm, _ = run_warm_and_cold(cluster, namespace, cold_ns, name, spec)
            # Each ran in the interpreter the pod started before it came (Python's and Node's alike); the memory
            # hog's sandbox may be killed whole, leaving no frame to say so.
            assert name == "oom" or warm["metrics"].get("interpreterPrestarted") is True, (name, warm["metrics"])
            if name in SEEN:
                assert SEEN[name](json.loads(warm["stdout"])), (name, warm["stdout"])


def test_input_files_count_once_against_the_disk_limit_warm_or_cold(cluster, operator, namespace):
    """Two 250 KB input files and 400 KB written under `disk: 1Mi` (900 KB of the 1,048,576 bytes): within the
    limit both ways; a warm pod once kept a second copy of its input under /tmp and ended DiskLimitExceeded."""
    spec = {"code": "open('out.bin', 'wb').write(b'w' * 400_000)\nprint(sum(len(open(f'data/{n}').read()) "
                    "for n in ('a.txt', 'b.txt')))",
            "files": [{"path": f"data/{n}", "content": n[0] * 250_000} for n in ("a.txt", "b.txt")],
            "limits": {"disk": "1Mi"}}
    pool = {"size": 1, "cpuRequest": "50m", "languages": ["python"]}
    with cold_twin(cluster, namespace, pool, defaults={"disk": "1Mi"}) as cold_ns:
        warm, cold = run_warm_and_cold(cluster, namespace, cold_ns, "disk-near-limit", spec)
    assert (warm["phase"], warm["reason"], warm["stdout"]) == ("Succeeded", "Completed", "500000\n"), warm


def test_the_pool_refills_and_follows_its_policy(cluster, operator, namespace):
    apply_warm_pool(cluster, namespace, {"size": 2, "cpuRequest": "50m", "languages": ["python"]})
    first = pool_pod_names(cluster, namespace)
    run = cluster.wait_run(namespace, cluster.create_run(namespace, {"language": "python", "code": "print(1)"}))
    assert run["status"]["startMode"] == "Warm" and run["status"]["podName"] in first
    wait_for(lambda: pool_ready(cluster, namespace) == 2, 60, "the pool back to 2 ready pods")
    assert run["status"]["podName"] not in pool_pod_names(cluster, namespace)  # a claimed pod is never reused
    # `kubectl get crpol` says the same: the policy applied, and its pool's stand (each refill pass, every 5 s).
    wait_for(lambda: (row := policy_columns(cluster, namespace))["ACCEPTED"] == "True" and row["WARM-READY"] == "2",
             30, "the policy's status to show it applied with 2 ready pods")
    # A changed policy replaces its pods; a policy without a pool has none.
    cluster.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, "default",
                                                  {"spec": {"warmPool": {"size": 1, "cpuRequest": "50m",
                                                                          "languages": ["python"]}}})
    wait_for(lambda: pool_ready(cluster, namespace) == 1 and len(pool_pod_names(cluster, namespace)) == 1, 90,
             "the pool shrunk to 1")
    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, "default")
    wait_for(lambda: not pool_pod_names(cluster, namespace), 90, "the pool gone with its policy")


def policy_columns(cluster, namespace: str) -> dict[str, str]:
    """`kubectl get crpol default` as a person reads it: column -> value."""
    header, row = cluster.kubectl("-n", namespace, "get", "crpol", "default").stdout.splitlines()
    return dict(zip(header.split(), row.split()))


def test_a_run_that_does_not_fit_the_pool_starts_cold(cluster, operator, namespace):
    apply_warm_pool(cluster, namespace, {"size": 1, "cpuRequest": "50m", "languages": ["python"]})
    run = cluster.wait_run(namespace, cluster.create_run(namespace, {
        "language": "python", "code": "print(1)", "limits": {"memory": "128Mi"}}))
    assert run["status"]["startMode"] == "Cold" and run["status"]["podName"].endswith("-sandbox")
    assert run["status"]["stdout"] == "1\n"


def test_a_warm_pod_someone_else_attached_to_first_costs_speed_not_the_run(cluster, operator, namespace):
    """An attach that connects and closes before the operator's (the pod's stdin stays open past an attach, as a
    session's later runs need): a claim of that pod never runs the program twice and the run gets its result."""
    apply_warm_pool(cluster, namespace, {"size": 1, "cpuRequest": "50m", "languages": ["python"]})
    pod = cluster.core.list_namespaced_pod(namespace, label_selector="coderun.io/pool").items[0].metadata.name
    cluster.kubectl("attach", "-i", "-n", namespace, pod, input="")  # connects, sends nothing, closes stdin
    run = cluster.wait_run(namespace, cluster.create_run(namespace, {"language": "python", "code": "print(7)"}))
    assert run["status"]["phase"] == "Succeeded" and run["status"]["stdout"] == "7\n", run["status"]


class AcceptedInputs:
    """Which pods' runners accepted an input: read from the kubelet's container log files while they exist."""

    def __init__(self, namespace: str):
        self.by_pod_uid: dict[str, int] = {}
        self.passes = 0  # whole scans done: one begun after a moment has read every log that existed then
        self._stop = threading.Event()
        self._glob = f"{namespace}_*/run/*.log"
        self._thread = threading.Thread(target=self._scan, daemon=True)
        self._thread.start()

    def _scan(self) -> None:
        while not self._stop.is_set():
            for log in POD_LOGS.glob(self._glob):
                try:
                    count = log.read_text(errors="replace").count("CODERUN-ACCEPTED ")
                except OSError:
                    continue
                uid = log.parent.parent.name.rsplit("_", 1)[1]
                self.by_pod_uid[uid] = max(self.by_pod_uid.get(uid, 0), count)
            self.passes += 1
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.mark.skipif(not POD_LOGS.is_dir(), reason="needs the kubelet's pod logs on this host (the local cluster)")
def test_the_operator_killed_mid_claim_loses_no_run_and_runs_none_twice(cluster, operator, namespace):
    # Runs of a quarter core: six waiting pods beside the chart's replicas leave room for a run gone cold at
    # a time, where a whole core's would wait for the pool to drain, which nothing here would ask it to.
    apply_warm_pool(cluster, namespace, {"size": 6, "cpuRequest": "50m", "languages": ["python"]},
                    defaults={"cpu": "250m"})
    census, accepted = PodCensus(cluster, namespace), AcceptedInputs(namespace)
    # Each program takes long enough (1.5 s) for its pod's log to be read while the pod exists.
    names = []
    try:
        for i in range(12):
            names.append(cluster.create_run(namespace, {"language": "python",
                                                        "code": f"import time; time.sleep(1.5); print({i})"},
                                            name=f"mid-{i}"))
            if i == 3:
                cluster.operator.control("kill")  # while the runs before are being claimed and fed
        runs = [cluster.wait_run(namespace, name, timeout=180) for name in names]
        # Barriers, not a pause: the census has counted every pod event up to now, and the log reader has
        # finished a whole scan begun after every run ended.
        census.catch_up()
        scanned = accepted.passes
        wait_for(lambda: accepted.passes >= scanned + 2, 30, "a whole scan of the pods' logs after the runs")
    finally:
        census.stop()
        accepted.stop()
        cluster.operator.control("start")
    for i, run in enumerate(runs):
        assert run["status"]["phase"] == "Succeeded" and run["status"]["stdout"] == f"{i}\n", run["status"]
    executions = {}
    for run in runs:
        pods = census.pods_by_run[run["metadata"]["name"]]
        fed = [uid for uid in pods if accepted.by_pod_uid.get(uid)]
        executions[run["metadata"]["name"]] = (run["status"]["startMode"], len(pods), len(fed))
    for name, (mode, pods, fed) in executions.items():
        # A warm run's program ran in exactly the one pod that accepted its input; a run that went cold ran
        # only in its cold pod, whatever warm pod it had claimed (and given up) before.
        assert (fed == 1) if mode == "Warm" else (fed == 0), (name, executions)
        assert sum(accepted.by_pod_uid.get(uid, 0) for uid in census.pods_by_run[name]) <= 1, (name, executions)
    assert any(mode == "Warm" for mode, _, _ in executions.values()), executions  # the pool was really used
    print(f"\nruns by (startMode, pods, pods that accepted input): {executions}")


def test_pool_metrics_count_claims_and_misses(cluster, operator, namespace):
    import urllib.request
    apply_warm_pool(cluster, namespace, {"size": 1, "cpuRequest": "50m", "languages": ["python"]})
    cluster.wait_run(namespace, cluster.create_run(namespace, {"language": "python", "code": "print(1)"}))
    cluster.wait_run(namespace, cluster.create_run(namespace, {"language": "python", "code": "print(1)",
                                                               "limits": {"memory": "128Mi"}}))
    text = urllib.request.urlopen(cluster.operator.metrics_url(), timeout=5).read().decode()
    claims = re.search(r'^coderun_pool_claims_total\{language="python"\} (\S+)$', text, re.M)
    misses = re.search(r'^coderun_pool_misses_total\{language="python",why="limits"\} (\S+)$', text, re.M)
    ready = re.search(rf'^coderun_pool_ready_pods\{{language="python",namespace="{namespace}",policy="default"\}} '
                      r'(\S+)$', text, re.M)
    assert claims and float(claims.group(1)) >= 1 and misses and float(misses.group(1)) >= 1, text[-2000:]
    assert ready and "coderun_pool_refill_seconds_count" in text
