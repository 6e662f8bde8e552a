"""The warm pool's unit tests: a policy keeping a pool, its pods made ready, and a runner's answer on the attach."""
import copy
import hashlib
import json

from support.controller import NS, settle

POLICY = {"apiVersion": "coderun.io/v1alpha1", "kind": "CodeRunPolicy",
          "metadata": {"name": "default", "namespace": NS, "uid": "policy-uid"},
          "spec": {"warmPool": {"size": 2, "languages": ["python"]}}}


def pool_pods(api):
    """Unclaimed pool pods: claimed ones keep the pool's labels (a run's or a session's owns them)."""
    return {name: pod for (kind, ns, name), pod in api.objects.items()
            if kind == "Pod" and "coderun.io/pool" in pod["metadata"].get("labels", {})
            and pod["metadata"].get("ownerReferences", [{}])[0].get("kind") not in ("CodeRun", "CodeRunSession")}


def start_pool(env, ready=True):
    """Refill, then the kubelet reports every pool pod's runner running."""
    api, _, ctl = env
    ctl.pool.refill()
    for pod in pool_pods(api).values():
        if ready:
            pod["status"] = {"phase": "Running", "startTime": "2026-11-22T09:59:00Z", "containerStatuses": [{
                "name": "run", "image": "coderun.local/sandbox-python:v2",
                "imageID": "coderun.local/sandbox-python@sha256:" + "f" * 64,
                "state": {"running": {"startedAt": "2026-11-22T09:59:01Z"}}}]}
            api._stamp(pod)
        ctl.on_pod(copy.deepcopy(pod), deleted=False)
    return sorted(pool_pods(api))


def runner_answer(nonce_from_input=True, **fields):
    """What a real runner prints on the stream: the accepted line, then a frame with the input's nonce."""
    def answer(document: bytes) -> bytes:
        nonce = json.loads(document.split(b"\n", 1)[1])["nonce"]
        frame = {"version": 1, "reason": "Completed", "exitCode": 0, "stdout": "42\n", "stderr": "",
                 "metrics": {"wallMillis": 5, "cpuMillis": 4, "maxRSSBytes": 1000},
                 "nonce": nonce if nonce_from_input else "0" * 64, **fields}
        accepted = hashlib.sha256(nonce.encode()).hexdigest()[:16]
        return f"CODERUN-ACCEPTED {accepted}\n\nCODERUN-RESULT-V1 {json.dumps(frame)}\n".encode()
    return answer


def submit_and_wait(env, run):
    api, _, ctl = env
    ctl.on_run(api.add_run(run), deleted=False)
    settle(ctl)
    return api.run(NS, run["metadata"]["name"])
