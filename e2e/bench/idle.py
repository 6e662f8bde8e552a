"""The idle operator's cost with 0 and with N finished CodeRuns present (`make bench-idle`).

Finished runs are made without pods: a language no policy offers is Rejected at admission, one status write
each. The operator then sits idle; over a window we read its CPU time from /proc and the API requests it
sent from its own counter (`coderun_api_requests_total`, watches excluded). Neither should grow with N: no
request is made per finished run (the operator lists the nodes at most every 30 s when a pending run needs
them, and a namespace's runs and all CodeRunPolicies once after a start).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client, config

from coderun.api.models import GROUP, PLURAL, VERSION

REPO = Path(__file__).resolve().parents[2]
PID_FILE = REPO / ".cluster" / "pids" / "operator.pid"
METRICS = "http://127.0.0.1:{port}/metrics"


def operator_cpu_seconds() -> float:
    pid = PID_FILE.read_text().strip()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def api_requests(port: int) -> float:
    text = urllib.request.urlopen(METRICS.format(port=port), timeout=5).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(r"^coderun_api_requests_total\{[^}]*\} (\S+)$", text, re.M))


def idle_window(seconds: float, port: int) -> tuple[float, float]:
    """(CPU % of one core, API requests per minute) over the window."""
    cpu0, req0, t0 = operator_cpu_seconds(), api_requests(port), time.monotonic()
    time.sleep(seconds)  # measuring idleness: the window itself is the point
    elapsed = time.monotonic() - t0
    return (100 * (operator_cpu_seconds() - cpu0) / elapsed, 60 * (api_requests(port) - req0) / elapsed)


def make_finished_runs(custom, namespace: str, count: int, deadline_seconds: float) -> float:
    body = lambda i: {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRun",  # noqa: E731
                      "metadata": {"name": f"idle-{i:05d}"},
                      "spec": {"language": "not-offered", "code": "print(1)", "ttlSecondsAfterFinished": 86400}}
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body(i)),
                      range(count)))
    while time.monotonic() - started < deadline_seconds:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        if sum(1 for r in items if (r.get("status") or {}).get("phase") == "Rejected") == count:
            return time.monotonic() - started
        time.sleep(2)
    raise SystemExit(f"not all {count} runs finished within {deadline_seconds}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--window", type=float, default=60)
    parser.add_argument("--metrics-port", type=int, default=int(os.environ.get("CODERUN_METRICS_PORT", "9108")))
    args = parser.parse_args()
    config.load_kube_config(str(REPO / ".cluster" / "kubeconfig"))
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()
    namespace = f"bench-idle-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        cpu, rate = idle_window(args.window, args.metrics_port)
        print(f"{0:>5} finished runs: operator CPU {cpu:5.2f} % of a core, {rate:6.1f} API requests/min "
              f"(idle {args.window:.0f} s)")
        took = make_finished_runs(custom, namespace, args.runs, 900)
        print(f"      ({args.runs} runs created and finished in {took:.0f} s)")
        cpu, rate = idle_window(args.window, args.metrics_port)
        print(f"{args.runs:>5} finished runs: operator CPU {cpu:5.2f} % of a core, {rate:6.1f} API requests/min "
              f"(idle {args.window:.0f} s)")
    finally:
        core.delete_namespace(namespace)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
