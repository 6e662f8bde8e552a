"""The children of a CodeRun: input ConfigMap, hardened sandbox Pod, default-deny NetworkPolicy, artifacts."""
from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Mapping, Sequence

from kubernetes.utils import parse_quantity

from coderun.api.models import (API_VERSION, KIND, MAX_INPUT_TOTAL_CHARS, ArtifactCaps, CodeRunSpec, EgressRule,
                                ResourceLimits)
from ..policy import Decision, Policy
from .egress import ProxyRoute, proxy_egress_rule, uses_proxy
from .scheduling import pod_scheduling, sandbox_scheduling
from .names import (ANNOTATION_NONCE_SHA256, ANNOTATION_POLICY, ANNOTATION_POOL_KEY, CONTAINER_NAME, LABEL_MANAGED_BY,
                    LABEL_POOL, LABEL_POOL_LANGUAGE, LABEL_RUN_UID, LABEL_SANDBOX, MANAGER, child_name, fit_name,
                    RUN_JSON, run_labels)

INPUT_MOUNT = "/coderun/input"
# Inputs by reference (docs/data.md): the runner fetches them into a volume of their own, never under /tmp, so
# they do not count against the program's disk limit; the policy's data caps size it.
INPUTS_MOUNT = "/coderun/inputs"
# What stays inline (the artifacts ConfigMap, through the frame) when a run has the store; past it, the store.
INLINE_ARTIFACT_FILE_BYTES = 256 * 1024
INLINE_ARTIFACT_TOTAL_BYTES = 512 * 1024
NETWORK_LOG_KEY = "requests.jsonl"
AUDIT_RECORD_KEY = "audit.jsonl"
TMP_MOUNT = "/tmp"
# The runner package in every sandbox image (e2e/images/debian.sh, install_runner), run in isolated mode.
RUNNER = ("python3", "-I", "/opt/coderun")
RUNNER_COMMAND = (*RUNNER, "--input", INPUT_MOUNT)
# A warm pool pod's runner waits for its input on stdin (sent over pods/attach when a run claims the pod).
POOL_RUNNER_COMMAND = (*RUNNER, "--input-stdin")
SANDBOX_UID = 65532
# Pod deadline beyond the program's timeout: startup (image, sandbox, interpreter) and result upload.
POD_DEADLINE_MARGIN_SECONDS = 60
# Container logs count against ephemeral storage; leave room for them beside the user's /tmp.
LOG_STORAGE_MARGIN = "32Mi"
# A warm pool pod's runner writes the input it receives where a cold pod's ConfigMap is mounted, on a volume of its
# own (never under /tmp, whose size is the program's disk limit): room for the largest input (4 UTF-8 bytes a
# character at most, and run.json), taken from the log margin above. The runner hides it from the program.
POOL_INPUT_SIZE = f"{(MAX_INPUT_TOTAL_CHARS * 4) // 1048576 + 1}Mi"
# A stream that keeps flooding far beyond what the status keeps is stopped, not drained forever.
FLOOD_FACTOR = 16
# The runner keeps this much beyond spec.limits.outputBytes, so the operator redacts before it cuts and a
# secret straddling the cut is matched whole instead of leaking its head.
REDACTION_MARGIN_BYTES = 2048


def owner_reference(run: Mapping[str, Any], kind: str = KIND) -> dict[str, Any]:
    meta = run["metadata"]
    return {"apiVersion": API_VERSION, "kind": kind, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}


def _child_metadata(run: Mapping[str, Any], suffix: str, extra_labels: Mapping[str, str] | None = None
                    ) -> dict[str, Any]:
    meta = run["metadata"]
    return {
        "name": child_name(meta["name"], suffix),
        "namespace": meta["namespace"],
        "labels": {**run_labels(meta["name"], meta["uid"]), **(extra_labels or {})},
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


def _sandbox_json(decision: Decision) -> dict[str, Any]:
    """What every run of a decision tells the runner, whatever its program: a run.json without one."""
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
        "memoryBytes": int(parse_quantity(limits.memory)),
        "maxProcesses": policy.max_processes,
        "maxInodes": policy.max_inodes,
        # /tmp a tmpfs whose kernel refuses the entry and the page past the caps, at any CPU (the pod's memory
        # holds its bytes: sandbox_memory)
        "scratchTmpfs": True,
        "artifacts": artifact_caps(policy, with_store=False),
    }


def artifact_caps(policy: Policy, with_store: bool) -> dict[str, int]:
    """The runner's artifact caps: the policy's (spec.data.artifacts) when the run has the store, of which the
    first INLINE_* bytes stay inline; without the store, the inline caps bound them all."""
    caps = policy.data.artifacts or ArtifactCaps()
    inline = {"inlineFileBytes": INLINE_ARTIFACT_FILE_BYTES, "inlineTotalBytes": INLINE_ARTIFACT_TOTAL_BYTES}
    if with_store:
        return {"maxFiles": caps.max_files, "maxFileBytes": caps.max_file_bytes,
                "maxTotalBytes": caps.max_total_bytes, **inline}
    return {"maxFiles": caps.max_files, "maxFileBytes": min(caps.max_file_bytes, INLINE_ARTIFACT_FILE_BYTES),
            "maxTotalBytes": min(caps.max_total_bytes, INLINE_ARTIFACT_TOTAL_BYTES), **inline}


def _run_json(spec: CodeRunSpec, decision: Decision, env: Mapping[str, str] | None,
              data: Mapping[str, Any] | None) -> dict[str, Any]:
    document = {
        **_sandbox_json(decision),
        "files": [{"path": f.path, "key": f"file-{i}"} for i, f in enumerate(spec.files or ())],
        "stdinKey": "stdin" if spec.stdin is not None else None,
        "env": dict(env or {}),
    }
    if data:
        document["data"] = dict(data)
        document["artifacts"] = artifact_caps(decision.policy, with_store=True)
    return document


def inputs_bytes(data: Mapping[str, Any] | None) -> int:
    """The room a run's inputs take in its pod's inputs volume."""
    return sum(int(i["size"]) for i in (data or {}).get("inputs") or ())


# The runner's own bound on one transfer to or from the data service (runner data.py): this long, plus a second
# for each TRANSFER_BYTES_PER_SECOND bytes, plus what a busy service makes it wait (BUSY_SECONDS there). The pod's
# deadline and the run's grant leave a run's transfers that much more time than its program's.
TRANSFER_BASE_SECONDS = 30
TRANSFER_BYTES_PER_SECOND = 5 * 1000 * 1000
TRANSFER_BUSY_SECONDS = 60


def transfer_seconds(policy: Policy, data: Mapping[str, Any] | None) -> int:
    """How much longer than its program a run with the store may take: its inputs fetched before the program
    starts and its artifacts stored after it ended (as one), at the runner's slowest allowed rate, and a busy
    service waited for once. 0 without the store."""
    if not data:
        return 0
    caps = policy.data.artifacts or ArtifactCaps()
    inputs = (data or {}).get("inputs") or ()
    moved = inputs_bytes(data) + caps.max_total_bytes
    return TRANSFER_BASE_SECONDS * (len(inputs) + 1) + TRANSFER_BUSY_SECONDS + moved // TRANSFER_BYTES_PER_SECOND


def prestart_argument(decision: Decision) -> str:
    """A pool or session pod's runner starts each program before its code comes (runner prestart.py), as a run
    of this decision would start: its settings are the run.json every such run shares."""
    return "--prestart=" + json.dumps(_sandbox_json(decision), separators=(",", ":"), sort_keys=True)


def build_input_configmap(run: Mapping[str, Any], spec: CodeRunSpec, decision: Decision,
                          env: Mapping[str, str] | None = None,
                          run_data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Code, stdin, files and the runner's instructions (`env`: what the program gets beyond the runner's own,
    the egress proxy's settings: builders/egress.py; `run_data`: where its inputs and large artifacts go, with
    its data grant: data_plane.py), mounted read-only into the sandbox; the runner hides it from the program."""
    data = {RUN_JSON: json.dumps(_run_json(spec, decision, env, run_data), indent=1), "code": spec.code}
    binary: dict[str, str] = {}
    if spec.stdin is not None:
        data["stdin"] = spec.stdin
    for i, f in enumerate(spec.files or ()):
        if f.content is not None:
            data[f"file-{i}"] = f.content
        else:
            # Normalise: strip whitespace the API allowed and re-encode, so the kubelet always decodes it.
            binary[f"file-{i}"] = base64.b64encode(base64.b64decode("".join((f.content_base64 or "").split()))).decode()
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _child_metadata(run, "input"),
          "immutable": True, "data": data}
    if binary:
        cm["binaryData"] = binary
    return cm


def build_network_policy(run: Mapping[str, Any], egress: Sequence[EgressRule] = (),
                         proxy: ProxyRoute | None = None) -> dict[str, Any]:
    """This run's pod: no ingress, and egress only to what its policy allows (nothing by default): its cidr
    rules, and the egress proxy's pods when it has host rules (the proxy decides which names)."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": _child_metadata(run, "deny"),
        "spec": {"podSelector": {"matchLabels": {LABEL_RUN_UID: run["metadata"]["uid"]}},
                 "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": _egress_routes(egress, proxy)},
    }


def build_pool_network_policy(namespace: str, policy: Policy, proxy: ProxyRoute | None = None) -> dict[str, Any]:
    """A policy's warm pool pods: the routes its runs get (`build_network_policy`), in force from each pod's
    start, so a claimed pod's first request never waits on the CNI seeing new labels (a claim keeps the pool's
    labels). A pod waits with the runner only, no program; the proxy still opens names only to a run's
    credential, which arrives with its input."""
    label = fit_name(policy.name)
    metadata: dict[str, Any] = {"name": pool_network_policy_name(label), "namespace": namespace,
                                "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_POOL: label}}
    if policy.uid:  # it goes with the policy
        metadata["ownerReferences"] = [{"apiVersion": API_VERSION, "kind": "CodeRunPolicy", "name": policy.name,
                                        "uid": policy.uid}]
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata,
        "spec": {"podSelector": {"matchLabels": {LABEL_SANDBOX: "true", LABEL_POOL: label}},
                 "policyTypes": ["Ingress", "Egress"], "ingress": [],
                 "egress": _egress_routes(policy.egress, proxy)},
    }


def pool_network_policy_name(policy_label: str) -> str:
    return fit_name(f"coderun-pool-{policy_label}", 63)


def _egress_routes(egress: Sequence[EgressRule], proxy: ProxyRoute | None) -> list[dict[str, Any]]:
    """What a policy's runs may reach directly: its cidr rules, and the proxy's pods when it has host rules."""
    routes = [_egress_rule(rule) for rule in egress if rule.cidr is not None]
    if proxy is not None and uses_proxy(egress):
        routes.append(proxy_egress_rule(proxy))
    return routes


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
                     "labels": {LABEL_MANAGED_BY: MANAGER}},
        "spec": {"podSelector": {"matchLabels": {LABEL_SANDBOX: "true"}},
                 "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []},
    }


def build_data_network_policy(namespace: str, route: ProxyRoute) -> dict[str, Any]:
    """Every sandbox pod of the namespace may open the data service's port (NetworkPolicies add up: this opens
    nothing else). Whoever has no grant gets nothing there; the store itself stays out of reach."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "coderun-sandbox-data", "namespace": namespace, "labels": {LABEL_MANAGED_BY: MANAGER}},
        "spec": {"podSelector": {"matchLabels": {LABEL_SANDBOX: "true"}}, "policyTypes": ["Egress"],
                 "egress": [proxy_egress_rule(route)]},
    }


def sandbox_memory(limits: ResourceLimits) -> str:
    """The pod's memory: the program's, plus its /tmp, which the runner keeps in a tmpfs capped at the disk
    limit (its pages are memory). A program is OOMKilled only once it holds more than limits.memory itself."""
    total = int(parse_quantity(limits.memory) + parse_quantity(limits.disk))
    return f"{total // 1048576}Mi" if total % 1048576 == 0 else str(total)


def build_pod(run: Mapping[str, Any], decision: Decision, input_configmap: str,
              run_data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The hardened sandbox pod (docs/security.md, "What every run gets"). Nothing here is the caller's to switch
    off. `run_data`: the run's inputs by reference (a volume of their own) and its artifacts to the store (time
    beyond the program's for their transfers)."""
    metadata = _child_metadata(run, "sandbox", {LABEL_SANDBOX: "true"})
    metadata["annotations"] = {ANNOTATION_POLICY: decision.policy.name}
    inputs = (run_data or {}).get("inputs") or ()
    # an input of no bytes still needs its volume: the room is at least a MiB when there are inputs
    room = max(inputs_bytes(run_data), 1048576) if inputs else 0
    return _sandbox_pod(metadata, decision, list(RUNNER_COMMAND),
                        decision.limits.timeout_seconds + POD_DEADLINE_MARGIN_SECONDS +
                        transfer_seconds(decision.policy, run_data),
                        {"name": "input", "configMap": {"name": input_configmap}}, room)


def _sandbox_pod(metadata: dict[str, Any], decision: Decision, command: list[str],
                 deadline_seconds: int, input_volume: dict[str, Any], inputs_room: int = 0) -> dict[str, Any]:
    """What every sandbox pod is, cold, warm or a session's: gVisor, no token, no network of its own, non-root,
    read-only root, every capability dropped, limits equal to requests, a private /tmp, the input at INPUT_MOUNT
    (read-only for a ConfigMap; a warm pod's runner writes it), and where its policy (over the chart's defaults)
    has it run: the five scheduling fields only (builders/scheduling.py), beside the hardening, never over it."""
    limits = decision.limits
    # the inputs volume, rounded up to MiB, is the pod's ephemeral storage too (the kubelet counts an emptyDir)
    inputs_mib = -(-inputs_room // 1048576)
    ephemeral = str(parse_quantity(limits.disk) + parse_quantity(LOG_STORAGE_MARGIN) + inputs_mib * 1048576)
    input_mount: dict[str, Any] = {"name": "input", "mountPath": INPUT_MOUNT}
    if "configMap" in input_volume:
        input_mount["readOnly"] = True  # else left out, as the API server leaves out a false one
    resources = {"cpu": limits.cpu, "memory": sandbox_memory(limits), "ephemeral-storage": ephemeral}
    drop_all = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "privileged": False,
                "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"}}
    mounts = [input_mount, {"name": "tmp", "mountPath": TMP_MOUNT}]
    volumes = [input_volume, {"name": "tmp", "emptyDir": {"sizeLimit": limits.disk}}]
    if inputs_mib:
        mounts.append({"name": "inputs", "mountPath": INPUTS_MOUNT})
        volumes.append({"name": "inputs", "emptyDir": {"sizeLimit": f"{inputs_mib}Mi"}})
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
            "activeDeadlineSeconds": deadline_seconds,
            "securityContext": {"runAsNonRoot": True, "runAsUser": SANDBOX_UID, "runAsGroup": SANDBOX_UID,
                                "fsGroup": SANDBOX_UID, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": CONTAINER_NAME,
                "image": decision.runtime.image,
                "imagePullPolicy": "IfNotPresent",
                "command": command,
                "workingDir": TMP_MOUNT,
                "env": [],
                "resources": {"requests": dict(resources), "limits": dict(resources)},
                "securityContext": drop_all,
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
            **pod_scheduling(sandbox_scheduling(decision.policy.scheduling)),
        },
    }


def build_pool_pod(namespace: str, decision: Decision, pool: Mapping[str, str], idle_seconds: int) -> dict[str, Any]:
    """A warm pool pod: the sandbox pod above, its runner waiting on stdin, owned by the policy until a run
    claims it (`claim_patch`) or a session does (`session.session_claim_patch`: its stdin stays open for the
    session's later attaches). `pool` holds its labels (policy, language) and the pool key it serves; it goes
    after `idle_seconds` unclaimed, so a pool never keeps a stale pod for ever (the kubelet's deadline, or, where
    the policy allows sessions, the pool's refill: the deadline leaves room for a session's lifetime after that,
    and a claim shrinks it to what its run or session needs)."""
    metadata: dict[str, Any] = {
        "generateName": pool_name_prefix(pool[LABEL_POOL]), "namespace": namespace,
        "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_SANDBOX: "true", LABEL_POOL: pool[LABEL_POOL],
                   LABEL_POOL_LANGUAGE: pool[LABEL_POOL_LANGUAGE]},
        "annotations": {ANNOTATION_POLICY: decision.policy.name, ANNOTATION_POOL_KEY: pool["key"]}}
    if decision.policy.uid:
        metadata["ownerReferences"] = [{"apiVersion": API_VERSION, "kind": "CodeRunPolicy",
                                        "name": decision.policy.name, "uid": decision.policy.uid}]
    pod = _sandbox_pod(metadata, decision, [*POOL_RUNNER_COMMAND, prestart_argument(decision)],
                       idle_seconds + pool_session_room(decision.policy),
                       {"name": "input", "emptyDir": {"sizeLimit": POOL_INPUT_SIZE}})
    container = pod["spec"]["containers"][0]
    container.update({"stdin": True, "stdinOnce": False})
    if decision.policy.warm_pool_cpu_request:  # the policy chose to reserve less than the limit while it waits
        container["resources"]["requests"]["cpu"] = decision.policy.warm_pool_cpu_request
    return pod


def pool_session_room(policy: Policy) -> int:
    """What a pool pod's deadline holds past its idle time for a session that claims it at the last moment: the
    longest lifetime the policy gives a session (none where it allows none), and the usual margin."""
    sessions = policy.sessions
    return sessions.max_lifetime_seconds + POD_DEADLINE_MARGIN_SECONDS if sessions and sessions.allowed else 0


def pool_name_prefix(policy_label: str) -> str:
    return f"{fit_name(f'pool-{policy_label}', 52)}-"


def claim_patch(run: Mapping[str, Any], pool_pod: Mapping[str, Any], deadline_seconds: int,
                nonce_sha256: str) -> list[dict[str, Any]]:
    """A JSON patch that makes a pool pod this run's, applied only if nobody changed the pod since we saw it
    (the `test` on resourceVersion): two replicas, or a leader and its successor, never claim one pod. The run
    becomes the pod's controller (the operator follows it like a cold run's pod; it goes when the run goes), and
    the pod's deadline shrinks from the pool's idle time to this run's. The digest of the nonce the input will
    carry is recorded on the pod, so whoever collects the result (this operator or its successor) can tell this
    run's frame from one of an input someone else fed the pod."""
    meta = run["metadata"]
    labels = {**(pool_pod["metadata"].get("labels") or {}), **run_labels(meta["name"], meta["uid"])}
    annotations = {**(pool_pod["metadata"].get("annotations") or {}), ANNOTATION_NONCE_SHA256: nonce_sha256}
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": pool_pod["metadata"]["resourceVersion"]},
            {"op": "replace", "path": "/metadata/labels", "value": labels},
            {"op": "replace", "path": "/metadata/annotations", "value": annotations},
            {"op": "replace", "path": "/metadata/ownerReferences", "value": [owner_reference(run)]},
            {"op": "replace", "path": "/spec/activeDeadlineSeconds", "value": deadline_seconds}]


def warm_input(configmap: Mapping[str, Any], nonce: str) -> bytes:
    """The input ConfigMap's keys as a warm pod's runner reads them from stdin (runner.read_stdin_input)."""
    body = input_document(configmap, nonce)
    return b"%d\n" % len(body) + body


def input_document(configmap: Mapping[str, Any], nonce: str, extra: Mapping[str, str] | None = None) -> bytes:
    """The body of a document on a runner's stdin: the input ConfigMap's keys (and `extra` ones) with the nonce."""
    data = {**(configmap.get("data") or {}), **dict(extra or {})}
    return json.dumps({"nonce": nonce, "data": data, "binaryData": configmap.get("binaryData") or {}},
                      separators=(",", ":")).encode()


def build_network_log_configmap(run: Mapping[str, Any], jsonl: str) -> dict[str, Any]:
    """Every request the run made through the egress proxy, one JSON record a line, owned by the run."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _child_metadata(run, "egress-log"),
            "immutable": True, "data": {NETWORK_LOG_KEY: jsonl}}


def build_audit_record_configmap(run: Mapping[str, Any], jsonl: str) -> dict[str, Any]:
    """What the run's program touched, one gVisor trace point a line (docs/audit.md), owned by the run."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _child_metadata(run, "audit"),
            "immutable": True, "data": {AUDIT_RECORD_KEY: jsonl}}


def build_artifacts_configmap(run: Mapping[str, Any], contents: Mapping[str, bytes]) -> dict[str, Any]:
    """Artifact bytes by key, owned by the run so they go when it goes."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _child_metadata(run, "artifacts"),
            "immutable": True,
            "binaryData": {key: base64.b64encode(content).decode() for key, content in contents.items()}}
