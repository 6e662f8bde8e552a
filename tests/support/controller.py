"""The controller's unit tests: a fixed clock, runs and policies as the API server would hand them, and the
kubelet's side of a cold run (its pod terminated, its log and termination message)."""
import copy
import hashlib
import json
from datetime import datetime, timezone

T0 = datetime(2026, 11, 22, 10, 0, 0, tzinfo=timezone.utc)
NS = "team-a"


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self):
        return self.now


def make_run(name="demo", uid="uid-1", **spec):
    return {"apiVersion": "coderun.io/v1alpha1", "kind": "CodeRun",
            "metadata": {"name": name, "namespace": NS, "uid": uid, "generation": 1,
                         "creationTimestamp": "2026-11-22T10:00:00Z"},
            "spec": {"language": "python", "code": "print(6*7)", **spec}}


def policy_object(name="default", **spec):
    return {"apiVersion": "coderun.io/v1alpha1", "kind": "CodeRunPolicy",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def submit(env, run):
    api, _, ctl = env
    ctl.on_run(api.add_run(run), deleted=False)
    return api.run(NS, run["metadata"]["name"])


def frame_log(**fields):
    frame = {"version": 1, "reason": "Completed", "exitCode": 0, "stdout": "42\n", "stderr": "",
             "metrics": {"wallMillis": 5, "cpuMillis": 4, "maxRSSBytes": 1000}, **fields}
    text = json.dumps(frame, separators=(",", ":"))
    return f"CODERUN-RESULT-V1 {text}\n", json.dumps({"frameSha256": hashlib.sha256(text.encode()).hexdigest()})


def pod_of(api, run_name="demo"):
    return copy.deepcopy(api.objects[("Pod", NS, f"{run_name}-sandbox")])


def terminate(env, run_name="demo", log=None, termination=None, reason="Completed", exit_code=0):
    """The kubelet reports the container terminated; the runner left `log` and `termination`."""
    api, _, ctl = env
    pod = pod_of(api, run_name)
    if log is None:
        log, termination = frame_log()
    api.logs[pod["metadata"]["name"]] = (log, True)
    pod["status"] = {"phase": "Running", "containerStatuses": [{
        "name": "run", "image": "coderun.local/sandbox-python:v2",
        "imageID": "coderun.local/sandbox-python@sha256:" + "f" * 64,
        "state": {"terminated": {"reason": reason, "exitCode": exit_code, "message": termination}}}]}
    ctl.on_pod(pod, deleted=False)
    return api.run(NS, run_name)


def settle(ctl) -> None:
    """Wait for the threads the controller has started and still holds: a session run's stream (SessionRuns.streams)
    and a warm claim's attach (Claims.attaches). Each is dropped from its map as it ends, so what is held is what
    runs."""
    for thread in [*ctl.session_runs.streams.values(), *ctl.claims.attaches.values()]:
        thread.join(5)
        assert not thread.is_alive(), f"{thread.name} still runs after 5 s"
