"""Latency of a CodeRun against a bare pod with the same spec, on the running local cluster (`make bench`).

For `print(1)`, N times each, one at a time, timed from the client's create call:
  CodeRun: -> its sandbox pod exists; -> the CodeRun has a terminal status (the result is readable).
  bare pod (the operator's own pod spec, no operator): -> the container is reported terminated;
           -> the pod phase is Succeeded.
Then N CodeRuns at once (250m CPU each, so the node queues them): how long until all have their result.
Times are taken from watch events as the client sees them. Prints medians and p90s.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from kubernetes import client, config, watch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from coderun.api.models import GROUP, PLURAL, VERSION, CodeRunSpec  # noqa: E402
from coderun.api.reasons import TERMINAL_PHASES  # noqa: E402
from coderun.controlplane.builders import build_input_configmap, build_pod  # noqa: E402
from coderun.controlplane.policy import DEFAULT_POLICY, evaluate  # noqa: E402

KUBECONFIG = Path(__file__).resolve().parents[1] / ".cluster" / "kubeconfig"
CODE = "print(1)"


class Stopwatch:
    """Watches pods and CodeRuns in a namespace and records when each milestone was first seen."""

    def __init__(self, namespace: str):
        self.seen: dict[tuple[str, str], float] = {}
        self.cond = threading.Condition()
        core, custom = client.CoreV1Api(), client.CustomObjectsApi()
        for target in (lambda: self._pods(core, namespace), lambda: self._runs(custom, namespace)):
            threading.Thread(target=target, daemon=True).start()

    def _mark(self, key: tuple[str, str]) -> None:
        with self.cond:
            self.seen.setdefault(key, time.monotonic())
            self.cond.notify_all()

    def _pods(self, core, namespace):
        for event in watch.Watch().stream(core.list_namespaced_pod, namespace, timeout_seconds=3600):
            pod = event["object"]
            self._mark(("pod-created", pod.metadata.name))
            statuses = pod.status.container_statuses or []
            if statuses and statuses[0].state.terminated:
                self._mark(("container-terminated", pod.metadata.name))
            if pod.status.phase == "Succeeded":
                self._mark(("pod-succeeded", pod.metadata.name))

    def _runs(self, custom, namespace):
        for event in watch.Watch().stream(custom.list_namespaced_custom_object, GROUP, VERSION,
                                          namespace, PLURAL, timeout_seconds=3600):
            run = event["object"]
            if (run.get("status") or {}).get("phase") in TERMINAL_PHASES:
                self._mark(("run-finished", run["metadata"]["name"]))

    def wait(self, key: tuple[str, str], timeout: float = 120) -> float:
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.seen, timeout):
                raise TimeoutError(f"{key} not seen within {timeout}s")
            return self.seen[key]


def bench_coderuns(custom, stopwatch, namespace, n):
    to_pod, to_result = [], []
    for i in range(n):
        name = f"bench-run-{i}"
        body = {"apiVersion": "coderun.io/v1alpha1", "kind": "CodeRun",
                "metadata": {"name": name, "annotations": {
                    "coderun.io/created-at": datetime.now(timezone.utc).isoformat(timespec="milliseconds")
                    .replace("+00:00", "Z")}},
                "spec": {"language": "python", "code": CODE}}
        start = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        to_pod.append(stopwatch.wait(("pod-created", f"{name}-sandbox")) - start)
        to_result.append(stopwatch.wait(("run-finished", name)) - start)
        run = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        assert run["status"]["stdout"] == "1\n", run["status"]
    return to_pod, to_result


def bench_bare_pods(core, stopwatch, namespace, n):
    spec = CodeRunSpec.model_validate({"language": "python", "code": CODE})
    decision = evaluate(spec, DEFAULT_POLICY)
    to_terminated, to_succeeded = [], []
    for i in range(n):
        fake_run = {"metadata": {"name": f"bench-pod-{i}", "namespace": namespace, "uid": str(uuid.uuid4())}}
        configmap = build_input_configmap(fake_run, spec, decision)
        pod = build_pod(fake_run, decision, configmap["metadata"]["name"])
        for obj in (configmap, pod):
            del obj["metadata"]["ownerReferences"]
        core.create_namespaced_config_map(namespace, configmap)
        start = time.monotonic()
        core.create_namespaced_pod(namespace, pod)
        name = pod["metadata"]["name"]
        to_terminated.append(stopwatch.wait(("container-terminated", name)) - start)
        to_succeeded.append(stopwatch.wait(("pod-succeeded", name)) - start)
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    return to_terminated, to_succeeded


def bench_concurrent(custom, stopwatch, namespace, n):
    """N runs created at once; seconds until the last result, and each run's own created->result time."""
    start = time.monotonic()
    names = [f"burst-{i}" for i in range(n)]
    for name in names:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
            "apiVersion": "coderun.io/v1alpha1", "kind": "CodeRun", "metadata": {"name": name},
            "spec": {"language": "python", "code": CODE, "limits": {"cpu": "250m", "timeoutSeconds": 30}}})
    finished = [stopwatch.wait(("run-finished", name), timeout=600) - start for name in names]
    phases = {custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
              ["status"]["phase"] for name in names}
    assert phases == {"Succeeded"}, phases
    return max(finished), finished


def summary(label: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p90 = ms[min(len(ms) - 1, int(round(0.9 * (len(ms) - 1))))]
    return f"{label:<48} median {statistics.median(ms):7.0f} ms   p90 {p90:7.0f} ms   (n={len(ms)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="sequential runs of each kind")
    parser.add_argument("--burst", type=int, default=30, help="runs created at once")
    args = parser.parse_args()
    config.load_kube_config(str(KUBECONFIG))
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace,
                                        "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    try:
        stopwatch = Stopwatch(namespace)
        to_pod, to_result = bench_coderuns(custom, stopwatch, namespace, args.n)
        to_terminated, to_succeeded = bench_bare_pods(core, stopwatch, namespace, args.n)
        burst_seconds, burst = bench_concurrent(custom, stopwatch, namespace, args.burst)
    finally:
        core.delete_namespace(namespace)
    print(f"print(1), {args.n} runs each, sequential, gVisor, 1 CPU / 256Mi")
    print(summary("CodeRun created -> sandbox pod created", to_pod))
    print(summary("CodeRun created -> terminal status written", to_result))
    print(summary("bare pod created -> container terminated", to_terminated))
    print(summary("bare pod created -> pod phase Succeeded", to_succeeded))
    print(f"{args.burst} CodeRuns created at once (250m CPU each): all Succeeded, the last after {burst_seconds:.1f} s")
    print(summary("  each: created -> terminal status written", burst))


if __name__ == "__main__":
    main()
