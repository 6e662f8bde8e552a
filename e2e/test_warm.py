"""The warm pool on the real cluster: pods kept per policy, a run on a claimed pod with the same status as a cold
run, the pool refilled, the cold fallback, and the operator killed mid-claim (no run lost, none run twice).

Whether a program ran is read from the kubelet's own container logs on this host (/var/log/pods): a warm pod's
runner prints `CODERUN-ACCEPTED` once it has the whole input, before the program starts, and nothing else can.
"""
from __future__ import annotations

import contextlib
import copy
import json
import re
import threading
import time
from pathlib import Path

import pytest

from coderun.api.coderunpolicy import POLICY_PLURAL
from coderun.api.models import GROUP, VERSION
from conftest import NAMESPACE_LABELS, PodCensus, apply_warm_pool, pool_ready, wait_for

POD_LOGS = Path("/var/log/pods")

# Programs whose statuses must not depend on where they ran: (name, spec).
CASES = [
    ("oom", {"code": "chunks = []\nwhile True: chunks.append(bytearray(32 * 1024 * 1024))"}),
    ("success", {"code": "import sys; print('out'); print('err', file=sys.stderr)"}),
    ("exception", {"code": "def f():\n    raise ValueError('bad value')\nf()\n"}),
    ("exit-code", {"code": "import sys; sys.exit(3)"}),
    ("stdin-and-files", {"code": "import sys; print(sys.stdin.read(), open('data/in.txt').read())",
                         "stdin": "from stdin", "files": [{"path": "data/in.txt", "content": "from a file"}]}),
    ("timeout", {"code": "while True: pass", "limits": {"timeoutSeconds": 2}}),
    ("output-flood", {"code": "import sys\nwhile True: sys.stdout.write('x' * 65536)"}),
    ("disk", {"code": "open('/tmp/big', 'wb').write(b'0' * 100 * 1024 * 1024)"}),
    ("artifacts", {"code": "import os\nopen(os.path.join(os.environ['CODERUN_OUTPUT_DIR'], 'a.txt'), 'w')"
                           ".write('artifact')\nprint('done')"}),
    ("secret-redacted", {"code": "print('key AKIAABCDEFGHIJKLMNOP')"}),
    ("javascript", {"language": "javascript", "code": "console.log(6 * 7); null.x;"}),
    # What a Node program sees of how it was started (a warm one in a process started before its code came).
    ("javascript-view", {"language": "javascript",
                         "code": "console.log(JSON.stringify({argv: process.argv, execArgv: process.execArgv,\n"
                                 "  env: process.env, cwd: process.cwd(), cache: Object.keys(require.cache),\n"
                                 "  main: require.main === module}));\nprocess.exitCode = 4;\n"}),
    # What the program can see of where it runs: its scratch and work dirs, its environment, its rlimits, and the
    # raw input dir (hidden: an empty read-only directory, warm or cold).
    ("program-view", {"code": "import json, os, resource\n"
                              "def tried(fn):\n"
                              "    try:\n"
                              "        return fn()\n"
                              "    except OSError as e:\n"
                              "        return type(e).__name__\n"
                              "print(json.dumps({'tmp': sorted(os.listdir('/tmp')), 'work': sorted(os.listdir('.')),\n"
                              "    'cwd': os.getcwd(), 'env': dict(os.environ),\n"
                              "    'rlimits': {n: resource.getrlimit(getattr(resource, n))\n"
                              "                for n in dir(resource) if n.startswith('RLIMIT_')},\n"
                              "    'input': tried(lambda: os.listdir('/coderun/input')),\n"
                              "    'input_write': tried(lambda: open('/coderun/input/x', 'w') and 'written')}))",
                      "files": [{"path": "data/in.txt", "content": "from a file"}]}),
]
# What the program must see, beyond seeing the same warm and cold.
SEEN = {"program-view": lambda view: view["input"] == [] and view["input_write"] == "OSError"
        and view["tmp"] == ["home", "outputs", "work"] and view["work"] == ["data", "main.py"],
        "javascript-view": lambda view: view["argv"][1:] == ["/tmp/work/main.js"] and view["execArgv"] == []
        and view["cache"] == ["/tmp/work/main.js"] and view["main"] and "CODERUN_PRESTART_FD" not in view["env"]}
# What may differ between a warm and a cold run of the same program: when, where, how long.
# The cache key covers the whole decision, the policy's digest with it, and the twins' policies differ by the pool.
WHERE_AND_WHEN = ("startMode", "podName", "startTime", "completionTime", "metrics", "policyDigest", "message",
                  "cacheKey")
# A write past the disk limit meets two enforcers, RLIMIT_FSIZE (EFBIG, the program's own error) and the runner's
# disk walk (SIGKILL), and which comes first is a race on either path; the reason and the limit are the same.
# Past the memory limit the node's OOM killer takes the program's process (the runner survives to report it, with
# its empty output) or the whole sandbox (nothing left to report), whichever it picks; seen: cold runs the first,
# warm ones the second, on the same node. Reason, signal, exit code and message are the same either way.
# A flood is killed once the runner has read past its flood cap; what it reads after (the pipe's content at the
# kill: nothing, or one more of the program's 64 KiB writes) is timing. Both views must still be past the cap, with
# the same kept head, reason and record.
FLOOD_CAP = 1048576
KILL_TIMED = {"output-flood": ("stdoutBytes", "stdoutSha256")}
RACING = {"disk": ("exitCode", "signal", "error", "stderr", "stderrBytes", "stderrSha256", "conditions"),
          "oom": tuple(f"{stream}{part}" for stream in ("stdout", "stderr")
                       for part in ("", "Bytes", "Sha256", "Truncated"))
                 + ("artifacts", "artifactsSkipped", "redactions")}


def comparable(status: dict, case: str = "") -> dict:
    status = copy.deepcopy(status)
    for field in WHERE_AND_WHEN + RACING.get(case, ()):
        status.pop(field, None)
    audit = status.get("audit") or {}
    # The runner's own share differs by transport: a warm runner read its code and wrote its setup before the
    # claim, which is not the run's. What the program did must be the same.
    audit.pop("runner", None)
    without_interpreter_start(audit)
    if case in RACING:  # which enforcer won decides what the program did next (a traceback re-reads main.py,
        status.pop("audit", None)  # a sandbox killed whole leaves no end in the record): the race above
    if case in KILL_TIMED and status.get("stdoutBytes", 0) > FLOOD_CAP:
        status.update({field: "past the cap" for field in KILL_TIMED[case]})
    status.get("decision", {}).pop("policyDigest", None)
    for condition in status.get("conditions") or ():
        condition.pop("lastTransitionTime", None)
        if condition.get("type") == "Accepted":
            condition.pop("message", None)
    for artifact in status.get("artifacts") or ():
        artifact.pop("configMap", None)
    return status


def differences(a, b, path: str = "") -> dict:
    """Where two statuses differ, leaf by leaf (a readable failure message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = {}
        for key in set(a) | set(b):
            out.update(differences(a.get(key), b.get(key), f"{path}.{key}"))
        return out
    return {} if a == b else {path: (a, b)}


def without_interpreter_start(audit: dict) -> None:
    """What the interpreter's own start did, which a prestarted run's did before the run came (the record says so:
    its first process is the prestarted interpreter, `startedBeforeRun`): the libraries it read outside the work
    dir, its reads of the code file (a cold Python start opens it twice), and how that first process was started.
    What the program did after (its files, connections, later processes, exit) is compared whole."""
    if not audit:
        return
    audit.get("outsideWorkdir", {}).pop("reads", None)
    audit["filesRead"] = [row for row in audit.get("filesRead", ()) if row.get("path") != "main.py"]
    processes = audit.get("processes") or []
    if processes:
        processes[0] = {k: v for k, v in processes[0].items() if k not in ("argv", "startedBeforeRun")}


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


def pool_pod_names(cluster, namespace: str) -> set[str]:
    return {p.metadata.name for p in cluster.core.list_namespaced_pod(namespace, label_selector="coderun.io/pool").items}


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
    finally:
        time.sleep(1)
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
