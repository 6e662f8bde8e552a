"""The audit agent under floods (`make bench-audit` runs it after e2e/bench/audit.py; issue 35, docs/testing.md).

On the running local cluster: N cold runs at once (default 9), each making 90,000 open/close calls on its own /tmp,
then a victim run that reads /etc/passwd, writes a marker and runs `sh -c echo`. Prints the node agent's RSS
(VmRSS of its process, read in its pod) before, after the floods and after the victim, each flood's audit
(complete, pointsLost, the flood's row) and whether the victim's audit is complete and lists what it did.

`--fold`: no cluster; the cost of folding one point on receipt (the agent's sink thread: decode, fold, record),
in points per second, for a flood of 200,000 opens (half of one path, half over 5,000 paths), and what the
sandbox's fold holds afterwards.
"""
from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(1, str(REPO / "e2e"))  # e2e/, after e2e/bench/ (its neighbours)

AGENT_NAMESPACE, AGENT_SELECTOR = "coderun-system-audit", "app.kubernetes.io/component=audit-agent"
FLOOD = ("import os\nfor _ in range({flood}):\n    os.close(os.open('/tmp/flood', os.O_WRONLY | os.O_CREAT))\n"
         "print('flooded')\n")
VICTIM = ("import subprocess\nopen('/etc/passwd').read()\nopen('marker.txt', 'w').write('here')\n"
          "subprocess.run(['sh', '-c', 'echo'], check=True)\n")


def fold_cost(points: int = 200_000) -> None:
    from coderun.audit import wire
    from coderun.audit.points import common_pb2, container_pb2, sentry_pb2, syscall_pb2
    from coderun.audit.store import Store

    mt, container, now = common_pb2.MessageType, "5f0c" * 16, [1_000]

    def context(tgid, parent=0):
        now[0] += 1000
        return common_pb2.ContextData(container_id=container, time_ns=now[0], thread_group_id=tgid,
                                      thread_id=tgid, parent_thread_group_id=parent, cwd="/tmp/work")
    packets = [wire.encode_point(container_pb2.Start(id=container, args=["python3"], context_data=context(10)),
                                 mt.MESSAGE_CONTAINER_START)]
    for tgid, parent in ((11, 10), (12, 11), (13, 12)):
        packets.append(wire.encode_point(sentry_pb2.CloneInfo(context_data=context(parent), created_thread_group_id=tgid,
                                                              flags=17), mt.MESSAGE_SENTRY_CLONE))
    packets.append(wire.encode_point(sentry_pb2.ExecveInfo(context_data=context(13, 12), argv=["python3", "main.py"]),
                                     mt.MESSAGE_SENTRY_EXEC))
    for number in range(points):
        path = "/tmp/flood" if number % 2 else f"/tmp/flood-{number % 5000}"
        packets.append(wire.encode_point(syscall_pb2.Open(context_data=context(13, 12), sysno=257, fd=-100,
                                                          pathname=path, flags=0o101, exit=syscall_pb2.Exit(result=3)),
                                         mt.MESSAGE_SYSCALL_OPEN))
    packets.append(wire.encode_point(sentry_pb2.TaskExit(context_data=context(10)), mt.MESSAGE_SENTRY_TASK_EXIT))
    store = Store()
    connection = store.open()
    started = time.perf_counter()
    for packet in packets:
        store.add(connection, packet)
    seconds = time.perf_counter() - started
    audit = store.answer(container, 0, 0)["audit"]
    print(f"folded {len(packets):,} points in {seconds:.2f} s: {len(packets) / seconds:,.0f} points/s "
          f"({seconds / len(packets) * 1e6:.1f} µs a point); the fold holds {connection.held / 1024:.0f} KiB; "
          f"complete {audit['complete']}, filesWritten shown {len(audit['filesWritten'])}, "
          f"omitted {audit.get('omitted', {})}")


def agent_rss_mib(cluster) -> float:
    pod = cluster.kubectl("-n", AGENT_NAMESPACE, "get", "pods", "-l", AGENT_SELECTOR, "-o",
                          "jsonpath={.items[0].metadata.name}").stdout.strip()
    status = cluster.kubectl("-n", AGENT_NAMESPACE, "exec", pod, "-c", "agent", "--",
                             "/opt/coderun/venv/bin/python", "-c", "print(open('/proc/1/status').read())").stdout
    kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return kib / 1024


def on_cluster(floods: int, flood: int, cpu: str) -> None:
    from conftest import Cluster
    from latency import new_namespace

    cluster = Cluster()
    namespace = new_namespace(cluster.core)
    limits = {"cpu": cpu, "memory": "128Mi", "timeoutSeconds": 300}
    try:
        before = agent_rss_mib(cluster)
        print(f"agent RSS before: {before:.0f} MiB")
        started = time.monotonic()
        names = [cluster.create_run(namespace, {"language": "python", "code": FLOOD.format(flood=flood),
                                                "limits": limits}, name=f"flood-{i}-{uuid.uuid4().hex[:4]}")
                 for i in range(floods)]
        for name in names:
            status = cluster.wait_run(namespace, name, timeout=900)["status"]
            audit = status.get("audit") or {}
            row = next((f for f in audit.get("filesWritten") or () if f["path"] == "/tmp/flood"), {})
            print(f"  {name}: {status.get('phase')}, audit complete {audit.get('complete')}, "
                  f"pointsLost {(audit.get('counts') or {}).get('pointsLost')}, /tmp/flood count {row.get('count')}")
        after = agent_rss_mib(cluster)
        print(f"{floods} floods of {flood:,} opens ({cpu} CPU each) in {time.monotonic() - started:.0f} s; "
              f"agent RSS after: {after:.0f} MiB ({after - before:+.0f})")
        victim = cluster.create_run(namespace, {"language": "python", "code": VICTIM,
                                                "limits": {**limits, "timeoutSeconds": 30}}, name="victim")
        audit = cluster.wait_run(namespace, victim, timeout=120)["status"].get("audit") or {}
        whole = (audit.get("complete") is True
                 and "/etc/passwd" in (audit.get("outsideWorkdir") or {}).get("examples", [])
                 and any(f["path"] == "marker.txt" for f in audit.get("filesWritten") or ())
                 and ["sh", "-c", "echo"] in [p["argv"] for p in audit.get("processes") or ()])
        print(f"victim's audit: complete {audit.get('complete')}, lists all it did: {whole}; "
              f"agent RSS: {agent_rss_mib(cluster):.0f} MiB")
    finally:
        cluster.core.delete_namespace(namespace, propagation_policy="Background")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=9, help="concurrent floods")
    parser.add_argument("--flood", type=int, default=90_000, help="open/close calls a flood makes")
    parser.add_argument("--cpu", default="100m", help="each flood's CPU (9 x 100m and the overhead fit the 2-core node)")
    parser.add_argument("--fold", action="store_true", help="no cluster: the agent's cost a point")
    args = parser.parse_args()
    if args.fold:
        fold_cost()
    else:
        on_cluster(args.n, args.flood, args.cpu)


if __name__ == "__main__":
    main()
