"""The operator's memory with many finished runs (`make bench-memory`; pure, no cluster).

The controller runs in-process against the unit tier's fake of k8s.py. N finished CodeRuns, each with
512 KiB of output in its status (stdout and stderr at 256 KiB, the most a stream keeps), are handed to it the
way the kopf watch hands them (whole objects, all at once, as a restarted leader gets them), then deleted.
We print the process RSS and the Python heap (tracemalloc) at each step, and what keeping the runs whole would
have cost, for comparison. The target: far below the operator's 512Mi limit, and back near the baseline once
the runs are gone.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "unit"))
from fake_k8s import FakeK8s  # noqa: E402 - the unit tier's fake API server

from coderun.api.models import GROUP, VERSION  # noqa: E402
from coderun_operator.controller import Controller  # noqa: E402

STREAM_BYTES = 256 * 1024
NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)
MiB = 1024 * 1024


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def heap_bytes() -> int:
    return tracemalloc.get_traced_memory()[0]


def finished_run(i: int) -> dict:
    """A Succeeded run as the API server returns it: its own 512 KiB of output, a full recorded decision."""
    name = f"run-{i:05d}"
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRun",
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{i:05d}", "resourceVersion": str(1000 + i),
                     "generation": 1, "creationTimestamp": "2026-11-22T11:00:00Z",
                     "labels": {"coderun.io/cache-key": f"{i:063d}"}},
        "spec": {"language": "python", "code": f"print({i})\n" + "#" * 2000, "cache": {"enabled": True}},
        "status": {
            "phase": "Succeeded", "reason": "Completed", "message": "the program exited with code 0",
            "exitCode": 0, "stdout": os.urandom(STREAM_BYTES // 2).hex(), "stderr": os.urandom(STREAM_BYTES // 2).hex(),
            "stdoutBytes": STREAM_BYTES, "stderrBytes": STREAM_BYTES, "cacheKey": f"{i:064d}",
            "completionTime": "2026-11-22T11:59:00.000Z", "podName": f"{name}-sandbox", "policy": "default",
            "policyDigest": "sha256:" + "a" * 64,
            "decision": {"policy": "default", "policyDigest": "sha256:" + "a" * 64, "ttlSecondsAfterFinished": 3600,
                         "runtime": {"language": "python", "image": "coderun.local/sandbox-python:v2",
                                     "command": ["python3", "-u", "main.py"], "codeFile": "main.py"},
                         "limits": {"timeoutSeconds": 5, "memory": "256Mi", "cpu": "1", "disk": "64Mi",
                                    "outputBytes": STREAM_BYTES}, "maxProcesses": 128, "maxInodes": 16384},
            "metrics": {"wallMillis": 5, "cpuMillis": 4, "maxRSSBytes": 10 * MiB, "totalMillis": 900},
            "conditions": [{"type": "Complete", "status": "True", "reason": "Completed", "message": "done",
                            "lastTransitionTime": "2026-11-22T11:59:00.000Z", "observedGeneration": 1}]},
    }


def figures(label: str, baseline: tuple[int, int] | None = None) -> tuple[int, int]:
    gc.collect()
    now = rss_bytes(), heap_bytes()
    delta = "" if baseline is None else \
        f"   (+{(now[0] - baseline[0]) / MiB:7.1f} MiB RSS, +{(now[1] - baseline[1]) / MiB:7.1f} MiB heap)"
    print(f"{label:<44} RSS {now[0] / MiB:7.1f} MiB   heap {now[1] / MiB:7.1f} MiB{delta}", flush=True)
    return now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--limit-mib", type=int, default=512, help="the operator's memory limit in the chart")
    args = parser.parse_args()
    tracemalloc.start()
    ctl = Controller(api=FakeK8s(), clock=lambda: NOW)
    finished_run(0)  # warm up what the first run allocates once (imports, caches)
    baseline = figures("baseline (controller, no runs)")

    for i in range(args.runs):
        ctl.on_run(finished_run(i), deleted=False)  # the watch's object is dropped once the handler returns
    held = figures(f"{args.runs} finished runs in the store", baseline)
    per_run = (held[1] - baseline[1]) / args.runs
    print(f"{'':<44} {per_run / 1024:.2f} KiB of heap per finished run "
          f"(each run carried {2 * STREAM_BYTES // 1024} KiB of output)")

    for i in range(args.runs):
        ctl.on_run(finished_run_identity(i), deleted=True)
    after = figures("after the runs are deleted", baseline)

    whole = [finished_run(i) for i in range(args.runs)]
    kept_whole = figures(f"for comparison: {args.runs} runs kept whole", baseline)
    del whole
    gc.collect()

    grew, limit = held[0] - baseline[0], args.limit_mib * MiB
    print(f"\nwith the runs: +{grew / MiB:.1f} MiB RSS, {held[0] / MiB:.0f} MiB in all ({100 * held[0] / limit:.0f}% of the "
          f"{args.limit_mib}Mi limit); "
          f"after deletion: {(after[0] - baseline[0]) / MiB:+.1f} MiB RSS, {(after[1] - baseline[1]) / MiB:+.2f} MiB "
          f"heap; kept whole they would take +{(kept_whole[1] - baseline[1]) / MiB:.0f} MiB heap")
    if held[0] > limit / 4 or after[1] - baseline[1] > 4 * MiB:
        sys.exit("FAIL: finished runs are not kept slim, or deleted runs left memory behind")


def finished_run_identity(i: int) -> dict:
    """What a DELETED event needs here: the run's identity and its last (terminal) phase."""
    return {"metadata": {"name": f"run-{i:05d}", "namespace": "bench", "uid": f"uid-{i:05d}"},
            "status": {"phase": "Succeeded"}}


if __name__ == "__main__":
    main()
