"""What the warm pool's transport costs on this cluster (issue 11): `pods/attach` to a pre-started gVisor pod.

Starts N sandbox-image pods whose process waits for one line on stdin (stdin + stdinOnce, as a warm pod
would), then, one pod at a time: attach through the API server, write a line, read the process's answer.
Prints the attach handshake and the full round trip, so the warm path's budget (claim, attach, input, program,
result, status) can be planned against real numbers, not guesses.

    .venv/bin/python e2e/bench/attach.py [N, default 8: each holds 50m CPU plus gVisor's overhead]
"""
from __future__ import annotations

import statistics
import sys
import time
import uuid
from pathlib import Path

from kubernetes import client, config
from kubernetes.stream import stream

REPO = Path(__file__).resolve().parents[2]
ANSWER = "import sys; line = sys.stdin.readline(); print('got ' + line.strip(), flush=True)"


def waiting_pod(name: str) -> dict:
    hardened = {"runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
                "readOnlyRootFilesystem": True}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"coderun.io/bench": "attach"}},
            "spec": {"runtimeClassName": "gvisor", "restartPolicy": "Never", "automountServiceAccountToken": False,
                     "containers": [{"name": "sandbox", "image": "coderun.local/sandbox-python:v2", "stdin": True,
                                     "stdinOnce": True, "command": ["python3", "-c", ANSWER],
                                     "securityContext": hardened,
                                     "resources": {"limits": {"cpu": "50m", "memory": "64Mi"}}}]}}


def round_trip(core: client.CoreV1Api, namespace: str, name: str) -> tuple[float, float, str]:
    started = time.perf_counter()
    attached = stream(core.connect_get_namespaced_pod_attach, name, namespace, container="sandbox", stdin=True,
                      stdout=True, stderr=False, tty=False, _preload_content=False)
    connected = time.perf_counter()
    attached.write_stdin("hello\n")
    answer = ""
    while not answer.endswith("\n") and attached.is_open() and time.perf_counter() - started < 10:
        attached.update(timeout=1)
        if attached.peek_stdout():
            answer += attached.read_stdout()
    done = time.perf_counter()
    attached.close()
    return (connected - started) * 1000, (done - started) * 1000, answer


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    config.load_kube_config(str(REPO / ".cluster" / "kubeconfig"))
    core = client.CoreV1Api()
    namespace = f"bench-attach-{uuid.uuid4().hex[:5]}"
    core.create_namespace({"metadata": {"name": namespace}})
    try:
        names = [f"waiting-{i}" for i in range(count)]
        begun = time.monotonic()
        for name in names:
            core.create_namespaced_pod(namespace, waiting_pod(name))
        while sum(1 for p in core.list_namespaced_pod(namespace).items if p.status.container_statuses
                  and p.status.container_statuses[0].state.running) < count:
            if time.monotonic() - begun > 180:
                raise SystemExit("pods not running after 180 s")
            time.sleep(0.2)
        print(f"{count} waiting gVisor pods running {time.monotonic() - begun:.1f} s after creation")
        results = [round_trip(core, namespace, name) for name in names]
        assert all(r[2] == "got hello\n" for r in results), [r[2] for r in results]
        for label, index in (("attach handshake", 0), ("attach, write, answer read", 1)):
            values = sorted(r[index] for r in results)
            print(f"{label:<30} median {statistics.median(values):6.0f} ms   "
                  f"p90 {values[int(0.9 * (len(values) - 1))]:6.0f} ms   (n={len(values)})")
    finally:
        core.delete_namespace(namespace)


if __name__ == "__main__":
    main()
