"""What the audit costs (`make bench-audit`, on the running local cluster as users install it): the same programs
under gVisor with the trace session (RuntimeClass gvisor, the audit on) and without it (gvisor-untraced, the
same runsc and image without `pod-init-config`), one run at a time, alternating, cold. Its figures are in
docs/testing.md.

  print(1):  created -> terminal status (the client's watch), the whole run as a caller sees it;
  pandas:    `import pandas`, timed by the program (a few thousand opens: the traced calls of a real import);
  stat:      100,000 os.stat calls, timed by the program (a syscall without a trace point: should cost nothing);
  open:      20,000 open+close of one file, timed by the program (every open is traced: the worst case);
  spawn:     50 `subprocess.run(["true"])`, timed by the program (clone, execve, exit points).

Prints p50 per program and runtime, and the traced/untraced ratio.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # e2e/, after e2e/bench/ (its neighbours)
from latency import new_namespace  # noqa: E402
from conftest import Cluster, wait_for  # noqa: E402
from coderun.api.coderunpolicy import POLICY_PLURAL  # noqa: E402
from coderun.api.models import GROUP, VERSION  # noqa: E402
from framework.egress import PYTHON_IMAGE  # noqa: E402

TIMED = "import time\nstart = time.perf_counter()\n{body}\nprint(round(time.perf_counter() - start, 6))\n"
PROGRAMS = {
    "print(1)": None,  # timed from outside
    "pandas": TIMED.format(body="import pandas"),
    "stat x100000": TIMED.format(body="import os\nfor _ in range(100000):\n    os.stat('/tmp')"),
    "open x20000": TIMED.format(body="for _ in range(20000):\n    open('/etc/hostname').close()"),
    "spawn x50": TIMED.format(body="import subprocess\nfor _ in range(50):\n    subprocess.run(['true'])"),
}
RUNTIMES = {"traced": "gvisor", "untraced": "gvisor-untraced"}
LIMITS = {"cpu": "1", "memory": "512Mi", "timeoutSeconds": 120}


def policy() -> dict:
    runtimes = [{"language": f"python-{label}", "image": PYTHON_IMAGE, "command": ["python3", "-u", "main.py"],
                 "codeFile": "main.py", "runtimeClassName": runtime_class}
                for label, runtime_class in RUNTIMES.items()]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CodeRunPolicy", "metadata": {"name": "default"},
            "spec": {"admission": "Record", "runtimes": runtimes,
                     "maximums": LIMITS}}


def one_run(cluster: Cluster, namespace: str, name: str, language: str, code: str) -> tuple[float, dict]:
    started = time.monotonic()
    cluster.create_run(namespace, {"language": language, "code": code, "limits": LIMITS}, name=name)
    run = cluster.wait_run(namespace, name, timeout=300)
    return time.monotonic() - started, run["status"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="runs of each program on each runtime")
    args = parser.parse_args()
    cluster = Cluster()
    namespace = new_namespace(cluster.core)
    try:
        cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL, policy())
        wait_for(lambda: cluster.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, POLICY_PLURAL,
                                                                     "default").get("status"), 30, "the policy")
        figures: dict[tuple[str, str], list[float]] = {}
        audits: dict[str, str] = {}
        for i in range(args.n):
            for program, code in PROGRAMS.items():
                for label in RUNTIMES:  # alternating, so drift on the node touches both alike
                    name = f"{program.split()[0].replace('(1)', '').replace('(', '')}-{label}-{i}".lower()
                    wall, status = one_run(cluster, namespace, name, f"python-{label}", code or "print(1)")
                    assert status.get("phase") == "Succeeded", (name, status.get("reason"), status.get("message"))
                    seconds = wall if code is None else float(status["stdout"].split()[-1])
                    figures.setdefault((program, label), []).append(seconds)
                    audit = status.get("audit") or {}
                    audits[label] = audit.get("source", "none")
        print(f"audit source seen: traced runs {audits.get('traced')}, untraced runs {audits.get('untraced')}")
        print(f"{'program':<16} {'traced p50':>12} {'untraced p50':>14} {'ratio':>7}   (n={args.n} each, cold)")
        for program in PROGRAMS:
            traced = statistics.median(figures[(program, "traced")]) * 1000
            untraced = statistics.median(figures[(program, "untraced")]) * 1000
            print(f"{program:<16} {traced:>9.0f} ms {untraced:>11.0f} ms {traced / untraced:>7.2f}")
    finally:
        cluster.core.delete_namespace(namespace, propagation_policy="Background")


if __name__ == "__main__":
    main()
