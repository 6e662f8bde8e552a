"""A CodeRunSession's children, pure: its sandbox pod (the run's pod, with the session's limits, its runner in
session mode on an open stdin, owned by the session), its routes when the policy has egress rules, and the
documents its runner reads (docs/sessions.md)."""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from coderun.api.coderunsession import SESSION_KIND
from coderun.api.models import DataPolicy, EgressRule
from coderun.sandbox.runner.protocol import SESSION_SETTINGS_KEY, session_document_mac
from ..policy import Decision
from .egress import ProxyRoute
from .names import ANNOTATION_POLICY, LABEL_MANAGED_BY, LABEL_SANDBOX, LABEL_SESSION, LABEL_SESSION_UID, MANAGER, \
    child_name, fit_name
from .objects import POD_DEADLINE_MARGIN_SECONDS, POOL_INPUT_SIZE, RUNNER, _egress_routes, _sandbox_pod, \
    input_document, owner_reference, prestart_argument

# The runner reads one document per run on stdin for as long as the session lives (runner main.serve_session).
SESSION_RUNNER_COMMAND = (*RUNNER, "--session")
KEEP_STATE_FLAG = "--keep-state"  # one interpreter for all the session's runs (runner kept_interpreter.py)


def session_labels(session: Mapping[str, Any]) -> dict[str, str]:
    meta = session["metadata"]
    return {LABEL_MANAGED_BY: MANAGER, LABEL_SANDBOX: "true", LABEL_SESSION: fit_name(meta["name"]),
            LABEL_SESSION_UID: meta["uid"]}


def session_pod_name(session: Mapping[str, Any]) -> str:
    """Named by the session's uid too: a session deleted and created again under its name at once gets a pod of
    its own, not the old one's name while that pod is still terminating."""
    meta = session["metadata"]
    return child_name(meta["name"], f"session-{meta['uid'][:8]}")


def build_session_pod(session: Mapping[str, Any], decision: Decision, lifetime_seconds: int) -> dict[str, Any]:
    """The hardened sandbox pod every run gets (objects._sandbox_pod), with the session's limits, its runner in
    --session mode on a stdin that stays open between attaches, its input written by the runner on a volume of its
    own (as a warm pod's), owned by the session (it goes when the session goes), and the kubelet's deadline the
    session's lifetime plus the usual margin (the backstop of the operator's tick)."""
    meta = session["metadata"]
    metadata = {"name": session_pod_name(session), "namespace": meta["namespace"], "labels": session_labels(session),
                "annotations": {ANNOTATION_POLICY: decision.policy.name},
                "ownerReferences": [owner_reference(session, SESSION_KIND)]}
    keep_state = [KEEP_STATE_FLAG] if (session.get("spec") or {}).get("keepState") else []
    pod = _sandbox_pod(metadata, decision, [*SESSION_RUNNER_COMMAND, prestart_argument(decision), *keep_state],
                       lifetime_seconds + POD_DEADLINE_MARGIN_SECONDS,
                       {"name": "input", "emptyDir": {"sizeLimit": POOL_INPUT_SIZE}},
                       session_inputs_room(decision))
    pod["spec"]["containers"][0].update({"stdin": True, "stdinOnce": False})
    return pod


def session_inputs_room(decision: Decision) -> int:
    """A session's pod keeps its inputs from run to run (docs/data.md): room for the policy's inputs total when the
    policy sets spec.data (an opt-in: the room is the pod's ephemeral storage), else none."""
    data = decision.policy.data
    return data.max_inputs_total_bytes if data != DataPolicy() else 0


def session_claim_patch(session: Mapping[str, Any], pool_pod: Mapping[str, Any],
                        deadline_seconds: int) -> list[dict[str, Any]]:
    """A JSON patch that makes a warm pool pod the session's sandbox, applied only if nobody changed the pod since
    we saw it (the `test` on resourceVersion: a run or another session never claims it too): the session's
    labels beside the pool's (the session's NetworkPolicy selects it; the pool's still does, as a run's claim
    keeps it, so its routes never lapse while the network plugin catches up; the session's label takes it out of
    the pool's count, store.put_pod), owned by the session (it goes when the session goes), and the kubelet's
    deadline the session's lifetime from now (`deadline_seconds`, counted from the pod's start). Its first
    document, which carries the session's settings, makes its runner the session's (runner
    main.accept_stdin_input)."""
    annotations = {ANNOTATION_POLICY: (pool_pod["metadata"].get("annotations") or {}).get(ANNOTATION_POLICY)}
    labels = {**(pool_pod["metadata"].get("labels") or {}), **session_labels(session)}
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": pool_pod["metadata"]["resourceVersion"]},
            {"op": "replace", "path": "/metadata/labels", "value": labels},
            {"op": "replace", "path": "/metadata/annotations", "value": annotations},
            {"op": "replace", "path": "/metadata/ownerReferences",
             "value": [owner_reference(session, SESSION_KIND)]},
            {"op": "replace", "path": "/spec/activeDeadlineSeconds", "value": deadline_seconds}]


def build_session_network_policy(session: Mapping[str, Any], egress: Sequence[EgressRule],
                                 proxy: ProxyRoute | None) -> dict[str, Any]:
    """The session pod's routes, for a policy with egress rules: what a run of the policy gets (its cidr rules, and
    the proxy's pods when it has host rules), in force from the pod's start and for the session's life (owned by
    the session, as its pod is). The proxy still opens names only to a run's credential, which comes with each
    run's document, so the sandbox reaches nothing by name between runs."""
    meta = session["metadata"]
    metadata = {"name": session_pod_name(session), "namespace": meta["namespace"],
                "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_SESSION_UID: meta["uid"]},
                "ownerReferences": [owner_reference(session, SESSION_KIND)]}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata,
            "spec": {"podSelector": {"matchLabels": {LABEL_SESSION_UID: meta["uid"]}},
                     "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": _egress_routes(egress, proxy)}}


def session_document(configmap: Mapping[str, Any], nonce: str, key: bytes, sequence: int,
                     keep_state: bool = False) -> bytes:
    """One run's document for the session's runner (runner/input_stream.py): the first (`sequence` 0) carries the
    session's key in session.json and no MAC (the runner has no key yet); every later one carries, on its length
    line, its sequence number and the MAC under that key of that number and its body, so no other client of the
    pod's stdin can run, replay or reorder a document (the runner takes only numbers past the last it read)."""
    if sequence == 0:
        body = input_document(configmap, nonce, {SESSION_SETTINGS_KEY: json.dumps({"key": key.hex(),
                                                                                   "keepState": keep_state})})
        return b"%d\n" % len(body) + body
    body = input_document(configmap, nonce)
    return b"%d %d %s\n" % (len(body), sequence, session_document_mac(key, sequence, body).encode()) + body
