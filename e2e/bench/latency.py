"""Latency of a CodeRun, warm and cold, against a bare pod and a Job, on the running local cluster (`make bench`).

For `print(1)`, one at a time, timed from the client's create call to what the client's watch sees:
  warm CodeRun (a policy with a warm pool): -> terminal status written (each run created once the pool has
           a ready pod; the refill is measured on its own below);
  cold CodeRun (no pool): -> its sandbox pod exists; -> terminal status written;
  bare pod (the operator's own pod spec, no operator): -> container reported terminated;
  Job (the same pod as a Job's template): -> the Job controller's pod exists.
Then warm Node runs, in the node the pod started before the run and (given stdin) in one started with it.
Then runs in a CodeRunSession (its sandbox up already), each created once the one before has ended: keepState false
(a fresh process per run), then true (one interpreter); and sessions created -> Ready, on a warm pool pod and on a
pod of their own.
Then a pool of 20 (cpuRequest 20m, so 20 fit on this 2-CPU node) takes 20 CodeRuns created at once, and the
pool's refill: every pod created -> its runner running, and the pool back to 20 ready after the burst.
Prints medians, p90s and p99s.
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from pathlib import Path

import yaml
from kubernetes import client, config, watch

from coderun.api.coderunpolicy import POLICY_PLURAL  # noqa: E402
from coderun.api.coderunsession import SESSION_PLURAL  # noqa: E402
from coderun.api.models import GROUP, PLURAL, VERSION, CodeRunSpec  # noqa: E402
from coderun.api.reasons import TERMINAL_PHASES  # noqa: E402
from coderun_operator.builders import build_input_configmap, build_pod  # noqa: E402
from coderun_operator.policy import DEFAULT_POLICY, evaluate  # noqa: E402

KUBECONFIG = Path(__file__).resolve().parents[2] / ".cluster" / "kubeconfig"
DEMO_POD_WAITED_SECONDS = 5.0
CODE = "print(1)"


class Stopwatch:
    """Watches pods and CodeRuns in a namespace and records when each milestone was first seen."""

    def __init__(self, namespace: str):
        self.seen: dict[tuple[str, str], float] = {}
        self.pool_ready: set[str] = set()  # unclaimed pool pods whose runner runs
        self.cond = threading.Condition()
        core, custom = client.CoreV1Api(), client.CustomObjectsApi()
        for target in (lambda: self._pods(core, namespace), lambda: self._runs(custom, namespace),
                       lambda: self._sessions(custom, namespace)):
            threading.Thread(target=target, daemon=True).start()

    def _mark(self, key: tuple[str, str]) -> None:
        with self.cond:
            self.seen.setdefault(key, time.monotonic())
            self.cond.notify_all()

    def _pods(self, core, namespace):
        for event in watch.Watch().stream(core.list_namespaced_pod, namespace, timeout_seconds=3600):
            pod = event["object"]
            self._mark(("pod-created", pod.metadata.name))
            for owner in pod.metadata.owner_references or ():
                if owner.kind == "Job":
                    self._mark(("job-pod-created", owner.name))
            statuses = pod.status.container_statuses or []
            self._pool_pod(pod, statuses, event["type"])
            if statuses and statuses[0].state.terminated:
                self._mark(("container-terminated", pod.metadata.name))
            if pod.status.phase == "Succeeded":
                self._mark(("pod-succeeded", pod.metadata.name))

    def _pool_pod(self, pod, statuses, event_type) -> None:
        if "coderun.io/pool" not in (pod.metadata.labels or {}):
            return
        # a claimed pod keeps the pool's labels, owned by its run or session
        claimed = any(o.kind in ("CodeRun", "CodeRunSession") for o in pod.metadata.owner_references or ())
        ready = bool(statuses and statuses[0].state.running) and not claimed and event_type != "DELETED" \
            and pod.metadata.deletion_timestamp is None
        with self.cond:
            (self.pool_ready.add if ready else self.pool_ready.discard)(pod.metadata.name)
            if ready:
                self.seen.setdefault(("pool-pod-ready", pod.metadata.name), time.monotonic())
            self.cond.notify_all()

    def wait_pool(self, ready: int, timeout: float = 300) -> float:
        """Until `ready` pool pods wait unclaimed; returns when that was."""
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.pool_ready) >= ready, timeout):
                raise TimeoutError(f"{ready} pool pods not ready within {timeout}s ({len(self.pool_ready)} are)")
            return time.monotonic()

    def _runs(self, custom, namespace):
        for event in watch.Watch().stream(custom.list_namespaced_custom_object, GROUP, VERSION,
                                          namespace, PLURAL, timeout_seconds=3600):
            run = event["object"]
            if (run.get("status") or {}).get("phase") in TERMINAL_PHASES:
                self._mark(("run-finished", run["metadata"]["name"]))

    def _sessions(self, custom, namespace):
        for event in watch.Watch().stream(custom.list_namespaced_custom_object, GROUP, VERSION,
                                          namespace, SESSION_PLURAL, timeout_seconds=3600):
            if (event["object"].get("status") or {}).get("phase") == "Ready":
                self._mark(("session-ready", event["object"]["metadata"]["name"]))

    def wait(self, key: tuple[str, str], timeout: float = 120) -> float:
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.seen, timeout):
                raise TimeoutError(f"{key} not seen within {timeout}s")
            return self.seen[key]


def create_run(custom, namespace: str, name: str, session: str | None = None, **limits) -> float:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRun", "metadata": {"name": name},
            "spec": {"language": "python", "code": CODE, **({"limits": limits} if limits else {}),
                     **({"session": session} if session else {})}}
    start = time.monotonic()
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    return start


def finished_status(custom, namespace: str, name: str) -> dict:
    status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)["status"]
    assert status["phase"] == "Succeeded" and status["stdout"] == "1\n", status
    return status


def bench_cold(custom, stopwatch, namespace, n):
    to_pod, to_result = [], []
    for i in range(n):
        name = f"cold-{i}"
        start = create_run(custom, namespace, name)
        to_pod.append(stopwatch.wait(("pod-created", f"{name}-sandbox")) - start)
        to_result.append(stopwatch.wait(("run-finished", name)) - start)
        assert finished_status(custom, namespace, name)["startMode"] == "Cold"
    return to_pod, to_result


def bench_warm(custom, stopwatch, namespace, n):
    """Sequential warm runs, each created once a pool pod is ready; how many still started cold."""
    to_result, modes = [], []
    for i in range(n):
        stopwatch.wait_pool(1)
        name = f"warm-{i}"
        start = create_run(custom, namespace, name)
        to_result.append(stopwatch.wait(("run-finished", name)) - start)
        modes.append(finished_status(custom, namespace, name)["startMode"])
    return to_result, modes


def bench_node_warm(custom, stopwatch, namespace, n):
    """`console.log(1)` on a pool of Node pods, one at a time, each created once a pool pod is ready: in the node the
    pod started before the run came, and (the same pods, the run given stdin, which a prestarted node cannot take)
    in a node started with the run. Created -> terminal status, and the program's own wall time."""
    apply_policy(custom, namespace, {"size": 3, "cpuRequest": "100m", "languages": ["javascript"]})
    figures = {"prestarted": ([], []), "started with the run": ([], [])}
    for i in range(n):
        for mode, (to_result, walls) in figures.items():
            stopwatch.wait_pool(1)
            name = f"node-{'pre' if mode == 'prestarted' else 'with'}-{i}"
            spec = {"language": "javascript", "code": "console.log(1)",
                    **({} if mode == "prestarted" else {"stdin": "unread"})}
            start = time.monotonic()
            custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRun", "metadata": {"name": name}, "spec": spec})
            to_result.append(stopwatch.wait(("run-finished", name)) - start)
            status = finished_status(custom, namespace, name)
            assert status["startMode"] == "Warm", status
            assert bool(status["metrics"].get("interpreterPrestarted")) is (mode == "prestarted"), status["metrics"]
            walls.append(status["metrics"]["wallMillis"] / 1000)
    return figures


def pod_cpu(core, namespace: str, pod_name: str) -> tuple[float, int, int] | None:
    """The pod's CPU so far on this host, from its cgroup (v1, as the local cluster's kubelet makes it): CPU
    milliseconds used, CFS periods, periods throttled; None where it cannot be read (another host, cgroup v2)."""
    uid = core.read_namespaced_pod(pod_name, namespace).metadata.uid
    for tier in ("", "burstable/", "besteffort/"):
        base = f"/sys/fs/cgroup/%s/kubepods/{tier}pod{uid}"
        try:
            usage = int(Path(base % "cpuacct", "cpuacct.usage").read_text()) / 1e6
            stat = dict(line.split() for line in Path(base % "cpu", "cpu.stat").read_text().splitlines())
        except OSError:
            continue
        return usage, int(stat["nr_periods"]), int(stat["nr_throttled"])
    return None


def bench_session(custom, stopwatch, namespace, n, keep_state=False):
    """Sequential runs in one session whose sandbox is Ready, each created once the one before ended: created ->
    terminal status; and the session pod's CPU a run, and its CFS periods throttled, where this host shows them.
    keepState false: a fresh process per run; true: one interpreter for all. The namespace's policy allows
    sessions (allow_sessions)."""
    session = f"bench-{'keep' if keep_state else 'fresh'}"
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunSession", "metadata": {"name": session},
        "spec": {"language": "python", "keepState": keep_state}})
    stopwatch.wait(("session-ready", session))
    stopwatch.wait_pool(1)  # the session took the pool's pod: its replacement's start is not the runs' cost
    pod = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL, session)["status"]["podName"]
    core = client.CoreV1Api()
    before = pod_cpu(core, namespace, pod)
    to_result = []
    for i in range(n):
        name = f"{session}-{i}"
        start = create_run(custom, namespace, name, session=session)
        to_result.append(stopwatch.wait(("run-finished", name)) - start)
        assert finished_status(custom, namespace, name)["startMode"] == "Session"
    after = pod_cpu(core, namespace, pod)
    cpu = None if before is None or after is None else (
        (after[0] - before[0]) / n, after[2] - before[2], after[1] - before[1])
    # its pod's CPU request goes with it (the next session's pod needs the room on a 2-CPU node)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL, session)
    return to_result, cpu


def session_cpu(cpu: tuple[float, int, int] | None) -> str:
    if cpu is None:
        return "  (the pod's CPU: no cgroup v1 of it on this host)"
    return f"  the pod's CPU {cpu[0]:.0f} ms a run, {cpu[1]}/{cpu[2]} CFS periods throttled"


def bench_session_start(custom, stopwatch, namespace, n, warm: bool):
    """Sessions one at a time, created -> Ready: on a warm pool pod (each created once the pool has one ready), or
    cold (limits the pool does not hold: a pod of its own). Each is deleted once Ready."""
    to_ready, modes = [], []
    for i in range(n):
        if warm:
            stopwatch.wait_pool(1)
        name = f"start-{'warm' if warm else 'cold'}-{i}"
        start = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunSession", "metadata": {"name": name},
            "spec": {"language": "python", **({} if warm else {"limits": {"memory": "384Mi"}})}})
        to_ready.append(stopwatch.wait(("session-ready", name)) - start)
        modes.append(custom.get_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL,
                                                         name)["status"]["startMode"])
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL, name)
    return to_ready, modes


def allow_sessions(custom, namespace):
    """Sessions, and a warm pool of one their runs' and start's benches take pods from."""
    apply_policy(custom, namespace, {"size": 1, "cpuRequest": "100m"}, sessions={"allowed": True})


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


def bench_jobs(stopwatch, namespace, n):
    """The Job controller's reaction: Job created -> its pod created (the bare pod's spec as the template)."""
    batch = client.BatchV1Api()
    spec = CodeRunSpec.model_validate({"language": "python", "code": CODE})
    decision = evaluate(spec, DEFAULT_POLICY)
    to_pod = []
    for i in range(n):
        fake_run = {"metadata": {"name": f"bench-job-{i}", "namespace": namespace, "uid": str(uuid.uuid4())}}
        configmap = build_input_configmap(fake_run, spec, decision)
        pod = build_pod(fake_run, decision, configmap["metadata"]["name"])
        del configmap["metadata"]["ownerReferences"]
        client.CoreV1Api().create_namespaced_config_map(namespace, configmap)
        name = f"bench-job-{i}"
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
               "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 0,
                        "template": {"metadata": {"labels": {"coderun.io/sandbox": "true"}}, "spec": pod["spec"]}}}
        start = time.monotonic()
        batch.create_namespaced_job(namespace, job)
        to_pod.append(stopwatch.wait(("job-pod-created", name)) - start)
        batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
    return to_pod


def bench_burst(custom, stopwatch, namespace, n):
    """N warm runs created at once on a full pool of N: the last result, each run's time, then the refill."""
    stopwatch.wait_pool(n)
    start = time.monotonic()
    names = [f"burst-{i}" for i in range(n)]
    for name in names:
        create_run(custom, namespace, name)
    finished = [stopwatch.wait(("run-finished", name), timeout=600) - start for name in names]
    modes = [finished_status(custom, namespace, name)["startMode"] for name in names]
    refilled = stopwatch.wait_pool(n) - start
    return max(finished), finished, modes, refilled


def apply_policy(custom, namespace: str, warm_pool: dict, **spec) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy", "metadata": {"name": "default"},
        "spec": {"warmPool": {"languages": ["python"], **warm_pool}, **spec}})


def bench_demo_warm(custom, stopwatch, namespace, n):
    """The pandas demo (examples/coderun.yaml, its own limits) on a warm pod, one at a time: created -> terminal
    status, and the program's own wall time; a policy whose defaults are the demo's limits keeps the pool (numpy
    and pandas prestarted: 512Mi). Each run is created once a pool pod has waited DEMO_POD_WAITED_SECONDS, as a
    pool pod does between runs (its preloads take a second's wait and about as long again at one CPU: a run that
    comes sooner waits for them, which `warm print(1)` above measures)."""
    demo = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "coderun.yaml").read_text())["spec"]
    limits = demo["limits"]
    apply_policy(custom, namespace, {"size": 1, "cpuRequest": "100m"},
                 defaults={"memory": limits["memory"], "cpu": limits["cpu"], "timeoutSeconds": limits["timeoutSeconds"]})
    to_result, totals, prestarted = [], [], 0
    for i in range(n):
        ready = stopwatch.wait_pool(1)
        time.sleep(max(0.0, ready + DEMO_POD_WAITED_SECONDS - time.monotonic()))  # a pause, not a synchronisation
        name = f"demo-{i}"
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRun", "metadata": {"name": name}, "spec": demo}
        start = time.monotonic()
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        to_result.append(stopwatch.wait(("run-finished", name)) - start)
        status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)["status"]
        assert status["phase"] == "Succeeded" and status["startMode"] == "Warm", status
        totals.append(status["metrics"]["wallMillis"] / 1000)
        prestarted += bool(status["metrics"].get("interpreterPrestarted"))
    return to_result, totals, prestarted


def new_namespace(core) -> str:
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace,
                                        "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    return namespace


def summary(label: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    pick = lambda q: ms[min(len(ms) - 1, int(round(q * (len(ms) - 1))))]  # noqa: E731
    return (f"{label:<46} p50 {statistics.median(ms):6.0f} ms  p90 {pick(0.9):6.0f} ms  p99 {pick(0.99):6.0f} ms"
            f"  (n={len(ms)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=50, help="sequential CodeRuns, warm and cold")
    parser.add_argument("--pods", type=int, default=20, help="sequential bare pods and Jobs")
    parser.add_argument("--burst", type=int, default=20, help="warm runs created at once, on a pool that size")
    parser.add_argument("--demo", type=int, default=10, help="sequential pandas demo runs on a warm pod")
    parser.add_argument("--node", type=int, default=10, help="sequential warm Node runs of each kind")
    args = parser.parse_args()
    config.load_kube_config(str(KUBECONFIG))
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()
    cold_ns, warm_ns = new_namespace(core), new_namespace(core)
    session_ns = burst_ns = demo_ns = node_ns = None
    try:
        stopwatch = Stopwatch(cold_ns)
        to_pod, cold = bench_cold(custom, stopwatch, cold_ns, args.n)
        to_terminated, to_succeeded = bench_bare_pods(core, stopwatch, cold_ns, args.pods)
        job_to_pod = bench_jobs(stopwatch, cold_ns, args.pods)
        core.delete_namespace(cold_ns)
        # Sequential warm runs: a pool of 3, each pod reserving 100m of its 1 CPU (3 fit beside the operator).
        warm_watch = Stopwatch(warm_ns)
        apply_policy(custom, warm_ns, {"size": 3, "cpuRequest": "100m"})
        warm, warm_modes = bench_warm(custom, warm_watch, warm_ns, args.n)
        core.delete_namespace(warm_ns)
        node_ns = new_namespace(core)
        node = bench_node_warm(custom, Stopwatch(node_ns), node_ns, args.node)
        core.delete_namespace(node_ns)
        session_ns = new_namespace(core)
        session_watch = Stopwatch(session_ns)
        allow_sessions(custom, session_ns)
        session, session_pod_cpu = bench_session(custom, session_watch, session_ns, args.n)
        session_kept, session_kept_pod_cpu = bench_session(custom, session_watch, session_ns, args.n, keep_state=True)
        starts = args.demo // 2 or 1
        warm_start, warm_start_modes = bench_session_start(custom, session_watch, session_ns, starts, warm=True)
        cold_start, cold_start_modes = bench_session_start(custom, session_watch, session_ns, starts, warm=False)
        core.delete_namespace(session_ns)
        demo_ns = new_namespace(core)
        demo, demo_totals, demo_prestarted = bench_demo_warm(custom, Stopwatch(demo_ns), demo_ns, args.demo)
        core.delete_namespace(demo_ns)
        burst_ns = new_namespace(core)
        burst_watch = Stopwatch(burst_ns)
        created = time.monotonic()
        apply_policy(custom, burst_ns, {"size": args.burst, "cpuRequest": "20m"})
        filled = burst_watch.wait_pool(args.burst) - created
        burst_seconds, burst, burst_modes, refilled = bench_burst(custom, burst_watch, burst_ns, args.burst)
        pod_ready = [burst_watch.seen[("pool-pod-ready", name)] - burst_watch.seen[("pod-created", name)]
                     for (kind, name) in list(burst_watch.seen) if kind == "pool-pod-ready"]
    finally:
        for namespace in (cold_ns, warm_ns, session_ns, burst_ns, demo_ns, node_ns):
            if namespace:
                core.delete_namespace(namespace, propagation_policy="Background", _request_timeout=30) \
                    if _exists(core, namespace) else None
    print("print(1), sequential, gVisor, 1 CPU / 256Mi (the built-in defaults)")
    print(summary("warm CodeRun created -> terminal status", warm) +
          f"  {warm_modes.count('Warm')}/{len(warm_modes)} Warm")
    for mode, (to_result, walls) in node.items():
        print(summary(f"warm Node, {mode}: created -> terminal", to_result))
        print(summary(f"warm Node, {mode}: the program", walls))
    print(summary("CodeRun in a session created -> terminal status", session) + "  keepState false")
    print(session_cpu(session_pod_cpu))
    print(summary("CodeRun in a session created -> terminal status", session_kept) + "  keepState true")
    print(session_cpu(session_kept_pod_cpu))
    print(summary("CodeRunSession created -> Ready, a pool pod", warm_start) +
          f"  {warm_start_modes.count('Warm')}/{len(warm_start_modes)} Warm")
    print(summary("CodeRunSession created -> Ready, its own pod", cold_start) +
          f"  {cold_start_modes.count('Cold')}/{len(cold_start_modes)} Cold")
    print(f"the pandas demo (examples/coderun.yaml) on a warm pod, one at a time: {demo_prestarted}/{len(demo)} "
          "with pandas prestarted")
    print(summary("  created -> terminal status (client's watch)", demo))
    print(summary("  the program (status.metrics.wallMillis)", demo_totals))
    print(summary("cold CodeRun created -> terminal status", cold))
    print(summary("cold CodeRun created -> sandbox pod created", to_pod))
    print(summary("bare pod created -> container terminated", to_terminated))
    print(summary("bare pod created -> pod phase Succeeded", to_succeeded))
    print(summary("Job created -> its pod created", job_to_pod))
    print(f"{args.burst} warm CodeRuns created at once on a pool of {args.burst}: "
          f"{burst_modes.count('Warm')} Warm, the last result after {burst_seconds:.2f} s")
    print(summary("  each: created -> terminal status", burst))
    print(f"pool of {args.burst} from empty: all ready after {filled:.1f} s; "
          f"after the burst, back to {args.burst} ready {refilled:.1f} s after the first run was created")
    print(summary("  each pool pod: created -> runner running", pod_ready))


def _exists(core, namespace: str) -> bool:
    try:
        core.read_namespace(namespace)
        return True
    except client.ApiException:
        return False


if __name__ == "__main__":
    main()
