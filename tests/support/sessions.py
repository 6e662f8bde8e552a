"""What the session tests of the controller share (test_controller_session, test_controller_egress): a session and
its runs as the API server holds them, a runner that answers documents as the real one does, a Ready session."""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Callable

from coderun.sandbox.runner.protocol import session_document_mac
from support.controller import NS, make_run

ALICE = {"coderun.io/created-by": "alice"}
POD = "s1-session-sess-uid"  # the session's name and the start of its uid


def make_session(name="s1", uid="sess-uid-1", **spec):
    return {"apiVersion": "coderun.io/v1alpha1", "kind": "CodeRunSession",
            "metadata": {"name": name, "namespace": NS, "uid": uid, "generation": 1, "annotations": dict(ALICE),
                         "creationTimestamp": "2026-11-22T10:00:00Z"},
            "spec": {"language": "python", **spec}}


def session_run(name, uid, created="2026-11-22T10:00:01Z", **spec):
    run = make_run(name, uid, session="s1", **spec)
    run["metadata"]["annotations"] = dict(ALICE)
    run["metadata"]["creationTimestamp"] = created
    return run


def runner(api) -> tuple[dict[str, Any], Callable[[bytes], bytes]]:
    """A session runner: the key from the first document, the MAC checked on the rest, a frame per run."""
    state: dict[str, Any] = {"key": None, "sequence": 0, "codes": []}

    def answer(document: bytes) -> bytes:
        header, body = document.split(b"\n", 1)
        length, _, signature = header.partition(b" ")
        assert int(length) == len(body)
        parsed = json.loads(body)
        if state["key"] is None:
            state["key"] = bytes.fromhex(json.loads(parsed["data"].pop("session.json"))["key"])
        else:
            sequence, mac = signature.split(b" ")
            assert int(sequence) > state["sequence"]
            state["sequence"] = int(sequence)
            assert mac.decode() == session_document_mac(state["key"], state["sequence"], body)
        state["codes"].append(parsed["data"]["code"])
        frame = {"version": 1, "reason": "Completed", "exitCode": 0, "stdout": f"run {len(state['codes'])}\n",
                 "stderr": "", "metrics": {"wallMillis": 5, "cpuMillis": 4, "maxRSSBytes": 1000},
                 "nonce": parsed["nonce"]}
        accepted = hashlib.sha256(parsed["nonce"].encode()).hexdigest()[:16]
        line = json.dumps(frame, separators=(",", ":"))  # as the runner prints it (frame.py)
        return f"CODERUN-ACCEPTED {accepted}\n\nCODERUN-RESULT-V1 {line}\n".encode()
    return state, answer


def start_session(env, **spec):
    api, _, ctl = env
    ctl.on_session(api.add_session(make_session(**spec)), deleted=False)
    pod = copy.deepcopy(api.objects[("Pod", NS, POD)])
    pod["status"] = {"phase": "Running", "containerStatuses": [{
        "name": "run", "image": "coderun.local/sandbox-python:v2",
        "imageID": "coderun.local/sandbox-python@sha256:" + "f" * 64, "state": {"running": {}}}]}
    api.objects[("Pod", NS, POD)] = pod
    ctl.on_pod(copy.deepcopy(pod), deleted=False)
    return api.objects[("CodeRunSession", NS, "s1")]
