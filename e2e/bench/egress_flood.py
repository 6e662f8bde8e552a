"""The egress proxy's log under concurrent floods, on the running local cluster (`make bench-egress`, after
e2e/bench/egress.py). Its figures are in docs/testing.md.

For N = 1, 2, 4 (--floods): N runs at once, each sending --requests refused requests pipelined over
--connections connections (e2e/test_hostile_egress_log.py's program), under the e2e egress policy. While they
run, the proxy pods' own counts are read about twice a second (`kubectl exec` into the squid container): for the
flood runs, the requests the acl helper admitted and those the log daemon wrote (run_logs.py); their difference
is the log's lag, in records. Printed per N: the largest lag seen, how long after the last flood's program ended
the lag was still above zero, each run's status.network (requests, admitted, complete) and its container's end ->
terminal status (which includes the admin endpoint's wait for the log to reach the admitted count).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # e2e/, after e2e/bench/ (its neighbours)
sys.path.insert(2, str(Path(__file__).resolve().parents[2] / "tests"))  # what e2e's modules import (pytest's pythonpath)
from latency import Stopwatch, new_namespace  # noqa: E402
from conftest import Cluster, wait_for  # noqa: E402
from framework.egress import PROXY_NAMESPACE, apply_policy, create_destinations, egress_policy, python  # noqa: E402
from framework.sessions import SMALL  # noqa: E402
from framework.hostile import facts_of  # noqa: E402
from framework.egress import FLOOD  # noqa: E402

PROXY_SELECTOR = "app.kubernetes.io/component=egress-proxy"
# Run in the squid container: for each uid, (admitted, logged) as the pod's files say now.
COUNTS = r'''
import json, sys
def number(path, key=None):
    try:
        text = open(path).read(4096)
        return int(json.loads(text)[key] if key else text or 0)
    except (OSError, ValueError, KeyError):
        return 0
runs = "/run/coderun-egress/runs/"
print(json.dumps({uid: [number(runs + uid + ".admitted"), number(runs + uid + ".usage", "requests")]
                  for uid in sys.argv[1:]}))
'''


def counts(cluster: Cluster, pods: list[str], uids: list[str]) -> tuple[int, int]:
    """(admitted, logged) of the runs `uids`, summed over the proxy pods."""
    admitted = logged = 0
    for pod in pods:
        out = cluster.kubectl("exec", "-n", PROXY_NAMESPACE, pod, "-c", "squid", "--", "python3", "-c", COUNTS,
                              *uids, check=False)
        for a, l in (json.loads(out.stdout or "{}") or {}).values():
            admitted, logged = admitted + a, logged + l
    return admitted, logged


def floods(cluster: Cluster, namespace: str, stopwatch: Stopwatch, code: str, n: int) -> dict:
    names = [cluster.create_run(namespace, {"language": "python", "code": code,
                                            "limits": {**SMALL, "cpu": "500m", "timeoutSeconds": 240}})
             for _ in range(n)]
    uids = [cluster.get_run(namespace, name)["metadata"]["uid"] for name in names]
    pods = [p.metadata.name for p in cluster.core.list_namespaced_pod(PROXY_NAMESPACE,
                                                                      label_selector=PROXY_SELECTOR).items]
    samples: list[tuple[float, int]] = []  # (when, admitted - logged)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            admitted, logged = counts(cluster, pods, uids)
            samples.append((time.monotonic(), admitted - logged))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    statuses = [wait_for(lambda name=name: (cluster.get_run(namespace, name).get("status") or {}).get(
        "phase") in ("Succeeded", "Failed") and cluster.get_run(namespace, name)["status"], 600, name)
        for name in names]
    done.set()
    sampler.join()
    ended = max(stopwatch.wait(("container-terminated", s["podName"])) for s in statuses)
    behind = [t - ended for t, lag in samples if t > ended and lag > 0]
    return {"statuses": statuses, "max_lag": max((lag for _, lag in samples), default=0),
            "lag_after_end": max(behind, default=0.0), "samples": len(samples),
            "to_status": [stopwatch.wait(("run-finished", name)) - stopwatch.wait(("container-terminated",
                                                                                   s["podName"]))
                          for name, s in zip(names, statuses)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floods", default="1,2,4", help="concurrent flood runs, one round each")
    parser.add_argument("--requests", type=int, default=24_000, help="refused requests per flood run")
    parser.add_argument("--connections", type=int, default=60, help="pipelined connections per flood run")
    args = parser.parse_args()
    cluster = Cluster()
    dest = create_destinations(cluster)
    namespace = new_namespace(cluster.core)
    code = python(FLOOD.replace("{target}", f"{dest.name('other')}:8080").replace("{requests}", str(args.requests))
                  .replace("{connections}", str(args.connections)))
    try:
        apply_policy(cluster, namespace, egress_policy(dest))
        stopwatch = Stopwatch(namespace)
        print(f"floods of {args.requests} refused requests over {args.connections} pipelined connections each, "
              f"gVisor, 500m CPU a run; the proxy's counts read about twice a second")
        for n in (int(x) for x in args.floods.split(",")):
            got = floods(cluster, namespace, stopwatch, code, n)
            print(f"{n} at once: largest log lag {got['max_lag']} records; lag still above zero "
                  f"{got['lag_after_end']:.1f} s after the last flood ended ({got['samples']} samples)")
            for status, to_status in zip(got["statuses"], got["to_status"]):
                network, facts = status.get("network") or {}, facts_of(status)
                print(f"  answered {facts.get('answered')}  requests {network.get('requests')}  admitted "
                      f"{network.get('admitted')}  complete {network.get('complete')}  container ended -> status "
                      f"{to_status:.2f} s")
    finally:
        for name in (namespace, dest.namespace):
            cluster.core.delete_namespace(name, propagation_policy="Background")


if __name__ == "__main__":
    main()
