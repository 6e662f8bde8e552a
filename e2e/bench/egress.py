"""What the egress proxy costs, on the running local cluster as users install it (`make bench-egress`: the chart's
operator and proxy). Its figures are in docs/testing.md.

  run: `print(1)` in a namespace whose policy allows hosts (the run's credential, its route to the proxy, the
       proxy pods asked at its end) against the same run under the same policy without egress; and a run that
       GETs one allowed name, so that its end writes a network log. One at a time, cold: created -> terminal
       status, and the container's end -> terminal status (with egress, the status that carries status.network,
       written once the log ConfigMap is: what asking the proxy pods adds to a run's end);
  request: inside one run, GETs to an allowed in-cluster HTTP server through the proxy, by name, against the
       same GETs straight to its pod (a cidr rule), each timed by the program: the proxy's added latency; then
       one large download each way: its throughput; and the same direct GETs and download from a plain runc pod
       (no gVisor, no proxy): what the sandbox's own network stack costs beside the proxy.

Times come from the client's watches (e2e/bench/latency.py's Stopwatch) and the program's own clock. The
destination server, its names and the policy are e2e/test_egress.py's. Prints p50, p90 and p99.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # e2e/, after e2e/bench/ (its neighbours)
sys.path.insert(2, str(Path(__file__).resolve().parents[2] / "tests"))  # what e2e's modules import (pytest's pythonpath)
from latency import Stopwatch, new_namespace, summary  # noqa: E402
from conftest import Cluster, wait_for  # noqa: E402
from framework.egress import FETCH, PYTHON_IMAGE, apply_policy, create_destinations, egress_policy, python  # noqa: E402
from framework.sessions import SMALL  # noqa: E402
from framework.hostile import facts_of  # noqa: E402

IDLE = "print(1)"
# The program's GETs: one untimed first (the proxy's first lookup of the name), then `count` timed, each on a
# connection of its own (urllib's way) and a path of its own (nothing served from a cache).
GETS = '''
import urllib.request
def timed_gets(opener, url, count):
    try:
        opener.open(url + "?warm", timeout=15).read()
        times = []
        for i in range(count):
            start = time.perf_counter()
            with opener.open("%s?%d" % (url, i), timeout=15) as answer:
                answer.read()
            times.append(time.perf_counter() - start)
        return times
    except Exception as e:
        return "%s: %s" % (type(e).__name__, str(e)[:300])
def timed_download(opener, url):
    """Seconds to read the whole answer, 1 MiB at a time (nothing kept), and its size."""
    try:
        start, size = time.perf_counter(), 0
        with opener.open(url, timeout=120) as answer:
            while chunk := answer.read(1 << 20):
                size += len(chunk)
        return [time.perf_counter() - start, size]
    except Exception as e:
        return "%s: %s" % (type(e).__name__, str(e)[:300])
'''


def timed_runs(cluster: Cluster, stopwatch: Stopwatch, namespace: str, code: str,
               n: int) -> tuple[list[float], list[float], list[dict]]:
    """N runs of `code`, one at a time: created -> terminal status, the container's end -> terminal status, and
    their statuses."""
    to_end, after_exit, statuses = [], [], []
    for _ in range(n):
        start = time.monotonic()
        name = cluster.create_run(namespace, {"language": "python", "code": code, "limits": SMALL})
        finished = stopwatch.wait(("run-finished", name), timeout=180)
        status = cluster.get_run(namespace, name)["status"]
        assert status["phase"] == "Succeeded", status
        to_end.append(finished - start)
        after_exit.append(finished - stopwatch.wait(("container-terminated", status["podName"])))
        statuses.append(status)
    return to_end, after_exit, statuses


def gets_program(proxied: str | None, direct: str, count: int, download_bytes: int) -> str:
    """A program that times `count` GETs of `proxied` through the proxy its environment names (unless None), then
    of `direct` without a proxy, then one download of `download_bytes` each way, and reports the seconds, or what
    went wrong."""
    ways = {"direct": ("straight", direct)} | ({"proxied": ("via_proxy", proxied)} if proxied else {})
    timed = ", ".join(f'{way}=timed_gets({opener}, "{url}/bench", {count}), '
                      f'{way}_download=timed_download({opener}, "{url}/bytes/{download_bytes}")'
                      for way, (opener, url) in sorted(ways.items(), reverse=True))
    return python(GETS, f'''
        via_proxy, straight = urllib.request.build_opener(), urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
        report({timed})''')


def request_times(cluster: Cluster, stopwatch: Stopwatch, namespace: str, dest, count: int,
                  download_bytes: int) -> dict:
    """One run's GETs and download through the proxy (by name, to the web Service) and straight to the web pod."""
    code = gets_program(f"http://{dest.name('web')}:8080", f"http://{dest.pod_ip}:8080", count, download_bytes)
    name = cluster.create_run(namespace, {"language": "python", "code": code,
                                          "limits": {**SMALL, "timeoutSeconds": 120}})
    stopwatch.wait(("run-finished", name), timeout=300)
    status = cluster.get_run(namespace, name)["status"]
    assert status["phase"] == "Succeeded", status
    return facts_of(status)


def runc_times(cluster: Cluster, namespace: str, dest, count: int, download_bytes: int) -> dict:
    """The same direct GETs and download from a plain pod: runc, no sandbox, no proxy (its namespace's NetworkPolicy
    selects only sandbox pods)."""
    code = gets_program(None, f"http://{dest.pod_ip}:8080", count, download_bytes)
    cluster.core.create_namespaced_pod(namespace, {"metadata": {"name": "runc-bench"}, "spec": {
        "restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "bench", "image": PYTHON_IMAGE, "imagePullPolicy": "Never",
                        "command": ["python3", "-c", code], "resources": {"limits": {"cpu": SMALL["cpu"],
                                                                                    "memory": SMALL["memory"]}},
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}})
    wait_for(lambda: cluster.core.read_namespaced_pod("runc-bench", namespace).status.phase in ("Succeeded", "Failed"),
             300, "the runc pod's GETs")
    return facts_of({"stdout": cluster.core.read_namespaced_pod_log("runc-bench", namespace)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="sequential runs, with egress and without")
    parser.add_argument("--requests", type=int, default=100, help="GETs timed inside the run, each way")
    parser.add_argument("--download-mib", type=int, default=50, help="one download's size, each way")
    args = parser.parse_args()
    cluster = Cluster()
    dest = create_destinations(cluster)
    with_egress = egress_policy(dest)
    with_egress["spec"]["egress"].append({"cidr": f"{dest.pod_ip}/32", "ports": [{"port": 8080}]})  # direct
    without_egress = egress_policy(dest)
    del without_egress["spec"]["egress"]
    one_get = python(FETCH, f'''
        report(got=fetch("http://{dest.name('web')}:8080/bench")[:2])''')
    namespaces = [new_namespace(cluster.core), new_namespace(cluster.core)]
    try:
        apply_policy(cluster, namespaces[0], with_egress)
        apply_policy(cluster, namespaces[1], without_egress)
        egress_watch, plain_watch = Stopwatch(namespaces[0]), Stopwatch(namespaces[1])
        idle = timed_runs(cluster, egress_watch, namespaces[0], IDLE, args.n)
        plain = timed_runs(cluster, plain_watch, namespaces[1], IDLE, args.n)
        fetching = timed_runs(cluster, egress_watch, namespaces[0], one_get, args.n)
        gets = request_times(cluster, egress_watch, namespaces[0], dest, args.requests, args.download_mib << 20)
        runc = runc_times(cluster, namespaces[1], dest, args.requests, args.download_mib << 20)
    finally:
        for namespace in (*namespaces, dest.namespace):
            cluster.core.delete_namespace(namespace, propagation_policy="Background")
    assert all(s["stdout"] == "1\n" and s["network"]["complete"] for s in idle[2]), [s["network"] for s in idle[2]]
    assert all(s["stdout"] == "1\n" and "network" not in s for s in plain[2])
    assert all(facts_of(s)["got"][0] == 200 and s["network"]["complete"] and s["network"].get("logConfigMap")
               for s in fetching[2]), [(facts_of(s), s["network"]) for s in fetching[2]]
    print(f"one at a time, cold, gVisor, {SMALL['cpu']} CPU / {SMALL['memory']}; a policy allowing "
          f"{dest.name('web')}:8080 and others, and the same policy without egress")
    print(summary(f"{IDLE}, no egress: created -> terminal", plain[0]))
    print(summary(f"{IDLE}, egress: created -> terminal", idle[0]))
    print(summary("one GET, egress: created -> terminal", fetching[0]))
    print(summary(f"{IDLE}, no egress: container ended -> status", plain[1]))
    print(summary(f"{IDLE}, egress: container ended -> status", idle[1]))
    print(summary("one GET, egress: container ended -> status", fetching[1]))
    ways = {"proxied": gets, "direct": gets, "runc pod, direct": runc}
    print(f"{args.requests} GETs inside one run (and a runc pod), each timed by the program")
    for way, facts in ways.items():
        times = facts.get(way.rpartition(" ")[2])
        print(summary(f"  {way}: GET -> whole answer", times) if isinstance(times, list)
              else f"  {way}: {times or 'no report'}")
    if all(isinstance(gets.get(way), list) for way in ("proxied", "direct")):
        added = statistics.median(gets["proxied"]) - statistics.median(gets["direct"])
        print(f"  the proxy's added latency per request (p50 - p50): {added * 1000:.1f} ms")
    print(f"one download of {args.download_mib} MiB inside the same run (and the runc pod)")
    for way, facts in ways.items():
        got = facts.get(f"{way.rpartition(' ')[2]}_download")
        print(f"  {way}: {got[1] / got[0] / (1 << 20):.1f} MiB/s ({got[0]:.2f} s, {got[1]} bytes)"
              if isinstance(got, list) else f"  {way}: {got or 'no report'}")


if __name__ == "__main__":
    main()
