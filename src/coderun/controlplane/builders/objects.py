"""The children of a CodeRun: input ConfigMap, hardened sandbox Pod, default-deny NetworkPolicy, artifacts."""
from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Mapping, Sequence

from kubernetes.utils import parse_quantity

from coderun.api.models import API_VERSION, KIND, CodeRunSpec, EgressRule
from ..policy import Decision
from .names import LABEL_RUN_UID, LABEL_SANDBOX, child_name, run_labels

INPUT_MOUNT = "/coderun/input"
TMP_MOUNT = "/tmp"
RUNNER_COMMAND = ("python3", "/opt/coderun/runner.py", "--input", INPUT_MOUNT)
SANDBOX_UID = 65532
CONTAINER_NAME = "run"
# Pod deadline beyond the program's timeout: startup (image, sandbox, interpreter) and result upload.
POD_DEADLINE_MARGIN_SECONDS = 60
# Container logs count against ephemeral storage; leave room for them beside the user's /tmp.
LOG_STORAGE_MARGIN = "32Mi"
# A stream that keeps flooding far beyond what the status keeps is stopped, not drained forever.
FLOOD_FACTOR = 16
# The runner keeps this much beyond spec.limits.outputBytes, so the operator redacts before it cuts and a
# secret straddling the cut is matched whole instead of leaking its head.
REDACTION_MARGIN_BYTES = 2048


def owner_reference(run: Mapping[str, Any]) -> dict[str, Any]:
    meta = run["metadata"]
    return {"apiVersion": API_VERSION, "kind": KIND, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def _child_metadata(run: Mapping[str, Any], suffix: str, extra_labels: Mapping[str, str] = ()) -> dict[str, Any]:
    meta = run["metadata"]
    return {
        "name": child_name(meta["name"], suffix),
        "namespace": meta["namespace"],
        "labels": {**run_labels(meta["name"], meta["uid"]), **dict(extra_labels)},
        "ownerReferences": [owner_reference(run)],
    }


def code_hash(spec: CodeRunSpec) -> str:
    """sha256 over everything the program sees as input; the same inputs give the same hash."""
    payload = {
        "language": spec.language,
        "code": spec.code,
        "stdin": spec.stdin or "",
        "files": sorted(((f.path, f.content, f.content_base64) for f in spec.files or ()), key=lambda t: t[0]),
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode())
    return f"sha256:{digest.hexdigest()}"


def _run_json(spec: CodeRunSpec, decision: Decision) -> dict[str, Any]:
    runtime, limits, policy = decision.runtime, decision.limits, decision.policy
    return {
        "version": 1,
        "language": runtime.language,
        "command": list(runtime.command),
        "codeFile": runtime.code_file,
        "timeoutSeconds": limits.timeout_seconds,
        "outputBytes": limits.output_bytes + REDACTION_MARGIN_BYTES,
        "floodBytes": limits.output_bytes * FLOOD_FACTOR,
        "diskBytes": int(parse_quantity(limits.disk)),
        "maxProcesses": policy.max_processes,
        "maxInodes": policy.max_inodes,
        "artifacts": {"maxFiles": policy.artifact_max_files, "maxFileBytes": policy.artifact_max_file_bytes,
                      "maxTotalBytes": policy.artifact_max_total_bytes},
        "files": [{"path": f.path, "key": f"file-{i}"} for i, f in enumerate(spec.files or ())],
        "stdinKey": "stdin" if spec.stdin is not None else None,
        "env": {},
    }


def build_input_configmap(run: Mapping[str, Any], spec: CodeRunSpec, decision: Decision) -> dict[str, Any]:
    """Code, stdin, files and the runner's instructions, mounted read-only into the sandbox."""
    data = {"run.json": json.dumps(_run_json(spec, decision), indent=1), "code": spec.code}
    binary: dict[str, str] = {}
    if spec.stdin is not None:
        data["stdin"] = spec.stdin
    for i, f in enumerate(spec.files or ()):
        if f.content is not None:
            data[f"file-{i}"] = f.content
        else:
            # Normalise: strip whitespace the API allowed and re-encode, so the kubelet always decodes it.
            binary[f"file-{i}"] = base64.b64encode(base64.b64decode("".join(f.content_base64.split()))).decode()
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _child_metadata(run, "input"),
          "immutable": True, "data": data}
    if binary:
        cm["binaryData"] = binary
    return cm


def build_network_policy(run: Mapping[str, Any], egress: Sequence[EgressRule] = ()) -> dict[str, Any]:
    """This run's pod: no ingress, and egress only to what its policy allows (nothing by default)."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _child_metadata(run, "deny"),
        "spec": {"podSelector": {"matchLabels": {LABEL_RUN_UID: run["metadata"]["uid"]}},
                 "policyTypes": ["Ingress", "Egress"], "ingress": [],
                 "egress": [_egress_rule(rule) for rule in egress]},
    }


def _egress_rule(rule: EgressRule) -> dict[str, Any]:
    allowed: dict[str, Any] = {"to": [{"ipBlock": {"cidr": rule.cidr}}]}
    if rule.ports:
        allowed["ports"] = [{"protocol": p.protocol, "port": p.port} for p in rule.ports]
    return allowed


def build_namespace_network_policy(namespace: str) -> dict[str, Any]:
    """A namespace-wide default deny for every sandbox pod, so no run is ever open while its own policy lands."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "coderun-sandbox-default-deny", "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "coderun"}},
        "spec": {"podSelector": {"matchLabels": {LABEL_SANDBOX: "true"}},
                 "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []},
    }


def build_pod(run: Mapping[str, Any], decision: Decision, input_configmap: str) -> dict[str, Any]:
    """The hardened sandbox pod (README, "What every run gets"). Nothing here is the caller's to switch off."""
    limits = decision.limits
    ephemeral = str(parse_quantity(limits.disk) + parse_quantity(LOG_STORAGE_MARGIN))
    resources = {"cpu": limits.cpu, "memory": limits.memory, "ephemeral-storage": ephemeral}
    drop_all = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "privileged": False,
                "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"}}
    metadata = _child_metadata(run, "sandbox", {LABEL_SANDBOX: "true"})
    metadata["annotations"] = {"coderun.io/policy": decision.policy.name}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "runtimeClassName": decision.runtime.runtime_class_name,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "hostNetwork": False, "hostPID": False, "hostIPC": False,
            # No resolver: with egress denied a DNS lookup should fail at once, not after a timeout.
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["127.0.0.1"]},
            "terminationGracePeriodSeconds": 1,
            "activeDeadlineSeconds": limits.timeout_seconds + POD_DEADLINE_MARGIN_SECONDS,
            "securityContext": {"runAsNonRoot": True, "runAsUser": SANDBOX_UID, "runAsGroup": SANDBOX_UID,
                                "fsGroup": SANDBOX_UID, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": CONTAINER_NAME,
                "image": decision.runtime.image,
                "imagePullPolicy": "IfNotPresent",
                "command": list(RUNNER_COMMAND),
                "workingDir": TMP_MOUNT,
                "env": [],
                "resources": {"requests": dict(resources), "limits": dict(resources)},
                "securityContext": drop_all,
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "volumeMounts": [{"name": "input", "mountPath": INPUT_MOUNT, "readOnly": True},
                                 {"name": "tmp", "mountPath": TMP_MOUNT}],
            }],
            "volumes": [{"name": "input", "configMap": {"name": input_configmap}},
                        {"name": "tmp", "emptyDir": {"sizeLimit": limits.disk}}],
        },
    }


def build_artifacts_configmap(run: Mapping[str, Any], contents: Mapping[str, bytes]) -> dict[str, Any]:
    """Artifact bytes by key, owned by the run so they go when it goes."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _child_metadata(run, "artifacts"),
            "immutable": True,
            "binaryData": {key: base64.b64encode(content).decode() for key, content in contents.items()}}
