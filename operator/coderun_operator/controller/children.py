"""A run's children in the API: the namespace's deny-all for sandboxes, the cold start's ConfigMap,
NetworkPolicy and pod, and the ConfigMaps that hold the artifacts, the requests through the egress proxy and the
audit agent's record. Created idempotently under deterministic names; a same-named object that is not this
run's (builders/ownership.py) is never adopted."""
from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from typing import Any, Callable, Mapping, Sequence

from coderun.api.models import CodeRunSpec
from ..kube_api import KubeApi
from ..builders import (build_artifacts_configmap, build_audit_record_configmap, build_input_configmap,
                        build_namespace_network_policy, build_network_log_configmap, build_network_policy, build_pod,
                        build_pool_network_policy)
from ..builders.egress import EgressAccess, ProxyRoute, credential_expiry, minted, run_environment
from ..builders.objects import POD_DEADLINE_MARGIN_SECONDS, build_data_network_policy
from ..builders.ownership import genuine_artifacts, is_managed, not_ours, same_rules
from ..policy import Decision, Policy
from ..results.frame import FrameArtifact

log = logging.getLogger("coderun")


def ensure_namespace_default_deny(api: KubeApi, namespace: str) -> str | None:
    """The namespace-wide deny-all for sandboxes, created or repaired on every admission (it may have been
    deleted or edited since); a same-named policy that is not coderun's is a conflict, never trusted."""
    return ensure_network_policy(api, build_namespace_network_policy(namespace))


def ensure_pool_routes(api: KubeApi, namespace: str, policy: Policy, proxy: ProxyRoute | None) -> str | None:
    """A warm pool's NetworkPolicy (its runs' routes), created or repaired before its pods are; a conflict as
    above."""
    return ensure_network_policy(api, build_pool_network_policy(namespace, policy, proxy))


def ensure_network_policy(api: KubeApi, wanted: Mapping[str, Any],
                          ours: Callable[[Mapping[str, Any]], bool] = is_managed,
                          taken: Callable[[Mapping[str, Any]], str | None] = lambda existing: not_ours(existing, "")
                          ) -> str | None:
    """`wanted` created, or the one of its name brought to its rules when it is `ours`; else why it cannot be
    (`taken`'s words): a same-named policy that is not ours is never trusted or changed."""
    existing = api.create_or_get(dict(wanted))
    if existing is None:
        return None
    if not ours(existing):
        return taken(existing)
    if not same_rules(existing.get("spec") or {}, wanted["spec"]):
        api.replace_network_policy(dict(wanted), existing["metadata"]["resourceVersion"])
    return None


def ensure_data_route(api: KubeApi, namespace: str, route: ProxyRoute) -> str | None:
    """Sandbox pods of the namespace may reach the data service's pods (their runners fetch inputs and store
    artifacts there with their run's grant; a program has no grant): ensured with the namespace's default deny."""
    return ensure_network_policy(api, build_data_network_policy(namespace, route))


def create_sandbox(api: KubeApi, run: Mapping[str, Any], spec: CodeRunSpec, decision: Decision,
                   egress: EgressAccess | None = None, now: float = 0, run_data: Mapping[str, Any] | None = None,
                   laid: Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any], float],
                                  Mapping[str, Any] | None] | None = None
                   ) -> tuple[str, str | None, str | None]:
    """The cold start's children, the namespace's deny-all first and the pod last: the pod's name, why the
    sandbox cannot be created when a child's name is taken, and the proxy pod the run's input names. With
    `egress` (a policy with host rules, pinned to a proxy pod), the program gets a credential for that pod and
    its NetworkPolicy the route to the proxy's pods. `laid` (DataPlane.laid) finds the data section an earlier
    start of the run laid in its input. A refusal (a quota, a namespace being deleted) raises `api.Refused`."""
    uid = run["metadata"]["uid"]
    conflict = ensure_namespace_default_deny(api, run["metadata"]["namespace"])
    configmap = input_configmap(run, spec, decision, egress, now, run_data=run_data)
    existing = None if conflict else api.create_or_get(configmap)
    found = minted(egress, run, existing) if egress is not None and existing is not None else None
    kept = laid(run, existing, run_data, now) if laid is not None and run_data and existing is not None else None
    if found is not None or kept is not None:  # a start retried after a crash: the credential, proxy pod and
        expiry, egress = found or (None, egress)  # data grant of then, the same input
        run_data = kept or run_data
        configmap = input_configmap(run, spec, decision, egress, now, expiry, run_data=run_data)
    conflict = conflict or not_ours(existing, uid, configmap)
    pod = build_pod(run, decision, configmap["metadata"]["name"], run_data)
    network_policy = build_network_policy(run, decision.policy.egress, egress.route if egress else None)
    for child in (network_policy, pod):
        conflict = conflict or not_ours(api.create_or_get(child), uid, child)
        if conflict:
            break
    return pod["metadata"]["name"], conflict, egress.pod if egress else None


def input_configmap(run: Mapping[str, Any], spec: CodeRunSpec, decision: Decision, egress: EgressAccess | None,
                    now: float, expiry: int | None = None, run_data: Mapping[str, Any] | None = None
                    ) -> dict[str, Any]:
    """The run's input, cold (a ConfigMap) or warm (its keys on the pod's stdin); through the proxy, with the
    credential it mints now (or minted at `expiry`); with `run_data`, its inputs by reference and its data grant."""
    if egress is None:
        return build_input_configmap(run, spec, decision, run_data=run_data)
    expires = expiry or credential_expiry(decision, POD_DEADLINE_MARGIN_SECONDS, now)
    return build_input_configmap(run, spec, decision,
                                 run_environment(egress, run, decision.policy, decision.runtime, expires), run_data)


def store_network_log(api: KubeApi, run: Mapping[str, Any], jsonl: str) -> str | None:
    """The run's requests through the egress proxy in a ConfigMap owned by it; its name, or None when it cannot
    be stored (the name is taken by an object that is not this run's, a quota): the status then names no log,
    and the run ends as it would have."""
    return _store_record(api, run, build_network_log_configmap(run, jsonl), "egress log")


def store_audit_record(api: KubeApi, run: Mapping[str, Any], jsonl: str) -> str | None:
    """What the run's program touched, the audit agent's record, in a ConfigMap owned by it; its name, or None
    as for the egress log."""
    return _store_record(api, run, build_audit_record_configmap(run, jsonl), "audit record")


def _store_record(api: KubeApi, run: Mapping[str, Any], configmap: dict[str, Any], what: str) -> str | None:
    try:
        existing = api.create_or_get(configmap)
    except api.Refused as refused:
        log.warning("run %s: its %s was not stored: %s", run["metadata"]["name"], what, refused)
        return None
    return None if not_ours(existing, run["metadata"]["uid"]) else configmap["metadata"]["name"]


class ArtifactsConflict(Exception):
    """The artifacts ConfigMap's name is taken by an object that is not this run's."""

    def __init__(self, name: str):
        super().__init__(f"the program ran, but a ConfigMap named {name} already exists and does not belong to "
                         "this run, so its artifacts were not stored; delete that ConfigMap or use another name")


def store_artifacts(api: KubeApi, run: Mapping[str, Any],
                    artifacts: Sequence[FrameArtifact]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Artifacts whose bytes match their reported size and sha256 go to one ConfigMap owned by the run; the
    others are listed as skipped ("corrupt"), never silently dropped."""
    contents, listed, skipped = {}, [], []
    for i, artifact in enumerate(artifacts):
        try:
            content = base64.b64decode(artifact.contentBase64, validate=True)
        except (binascii.Error, ValueError):
            content = None
        if content is None or len(content) != artifact.size or hashlib.sha256(content).hexdigest() != artifact.sha256:
            skipped.append({"name": artifact.name, "why": "corrupt"})
            continue
        key = f"artifact-{i}"
        contents[key] = content
        listed.append({"name": artifact.name, "size": artifact.size, "sha256": artifact.sha256, "key": key})
    return _save_artifacts(api, run, contents, listed), skipped


def copy_artifacts(api: KubeApi, run: Mapping[str, Any], source: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """This run's own copy of the earlier run's artifacts, so deleting either run keeps the other whole. None
    when they cannot be copied as the earlier run recorded them: gone, or a ConfigMap under their name that is
    not the earlier run's or does not hold the bytes its status vouches for (sha256 of each)."""
    listed = source["status"].get("artifacts") or []
    if not listed:
        return []
    configmap = api.read_configmap(source["metadata"]["namespace"], listed[0]["configMap"])
    contents = genuine_artifacts(configmap, source["metadata"]["uid"], listed)
    if contents is None:
        return None
    return _save_artifacts(api, run, contents, listed)


def _save_artifacts(api: KubeApi, run: Mapping[str, Any], contents: dict[str, bytes],
                    listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ConfigMap owned by the run holds the bytes; the status lists where each artifact is. A same-named
    ConfigMap that is not this run's is never used: the artifacts are then reported as skipped instead."""
    if not listed:
        return []
    configmap = build_artifacts_configmap(run, contents)
    if not_ours(api.create_or_get(configmap), run["metadata"]["uid"]):
        raise ArtifactsConflict(configmap["metadata"]["name"])
    return [{**a, "configMap": configmap["metadata"]["name"]} for a in listed]
