"""Admission: policy check, the cache, then the run's children, then the Pending status that names the pod.

Order matters for "nothing is lost": children are created before the status names them, so a crash at any
point is repaired by the next reconcile (creation is idempotent). A child that already exists but is not
this run's (someone created it first under the deterministic name) is never adopted: the run ends with
NameConflict instead of reporting a squatter's output as its own.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from pydantic import ValidationError

from coderun.api.models import CodeRunSpec, DecisionRecord
from coderun.api.reasons import Phase, Reason, StartMode
from ..builders import (LABEL_MANAGED_BY, build_input_configmap, build_namespace_network_policy,
                        build_network_policy, build_pod, code_hash)
from ..builders.names import MANAGER
from ..policy import Decision, Denial, decision_from_record, evaluate, needs_use_permission, select_policy
from ..policy.approval import approval_verdict, shown_identity
from ..policy.evaluate import use_denial
from ..results.cache import cache_key, image_digest, is_same_source, pick_reusable, reused_outcome
from ..results.status import (Outcome, accepted_status, created_at, decision_fields, millis_between,
                              refusal_fields, rfc3339, waiting_status)
from . import core, warm
from .collection import ArtifactsConflict, copy_artifacts, redactor
from .identity import creator_may_use


def _no_requester(name: str) -> Denial:
    return use_denial(f"spec.policyRef names {name!r}, and no requester is known to check the permission to use it")


def decide(run: Mapping[str, Any], policies: Mapping[str, Any] | None = None,
           may_use: Callable[[str], Denial | None] = _no_requester) -> tuple[CodeRunSpec | None, Decision | Denial]:
    """The typed spec and the verdict: the decision recorded at admission if there is one (a policy changed
    since cannot change it), else the selected policy's. A spec the model refuses is InvalidSpec, naming the
    field. `policies` are the run's namespace's CodeRunPolicies by name; `may_use(name)` says whether the run's
    requester may name that policy (asked before whether it exists, so a refusal tells nothing about it)."""
    try:
        spec = CodeRunSpec.model_validate(run.get("spec") or {})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return None, Denial(Reason.INVALID_SPEC, "schema", f"spec.{where}: {first['msg']}"[:1024])
    recorded = (run.get("status") or {}).get("decision")
    if recorded:
        return spec, decision_from_record(DecisionRecord.model_validate(recorded))
    if needs_use_permission(spec.policy_ref):
        denial = may_use(spec.policy_ref)
        if denial:
            return spec, denial
    policy = select_policy(spec.policy_ref, policies or {})
    if isinstance(policy, Denial):
        return spec, policy
    return spec, evaluate(spec, policy)


def admit(ctl: core.Controller, run: Mapping[str, Any]) -> None:
    meta = run["metadata"]
    ctl.ensure_policies_listed()
    spec, decision = decide(run, ctl.store.policies(meta["namespace"]), creator_may_use(ctl.api, ctl.identity, run))
    if isinstance(decision, Denial):
        ctl.finish(run, Outcome(Phase.REJECTED, decision.reason, decision.message, refusal_fields(decision)))
        return
    if decision.policy.approval_required() and not _approved(ctl, run, decision):
        return
    digest = image_digest(decision.runtime.image, _node_images(ctl))
    key = cache_key(spec, decision, digest)
    if spec.cache and spec.cache.enabled and key and _answer_from_cache(ctl, run, spec, decision, digest, key):
        return
    if decision.policy.max_concurrent_runs is None:
        _start(ctl, run, spec, decision, key)
        return
    with ctl.namespace_lock(meta["namespace"]):  # the count and the start are one step: the cap holds exactly
        if _slot_free(ctl, run, decision):
            _start(ctl, run, spec, decision, key)


def _approved(ctl: core.Controller, run: Mapping[str, Any], decision: Decision) -> bool:
    """The supervisor pattern: approved-by lets the run go on, rejected-by ends it, each as the API server
    recorded who set it; until then, and while that record cannot be trusted, it waits with the decision
    recorded and a message that says why. An approval acted on is kept in status.approval."""
    if ((run.get("status") or {}).get("approval") or {}).get("approvedBy"):
        return True
    verdict = approval_verdict(run["metadata"].get("annotations") or {}, decision.policy.name,
                               decision.policy.allow_self_approval, ctl.identity.problem())
    if verdict.rejected:
        ctl.finish(run, Outcome(Phase.REJECTED, Reason.REJECTED_BY_APPROVER, verdict.message,
                                {"policyRule": "approval", "approval": verdict.record(rfc3339(ctl.now()))}))
        return False
    if not verdict.go:
        _wait(ctl, run, decision, Reason.AWAITING_APPROVAL, verdict.message)
        return False
    if ctl.write_status(run, {"approval": verdict.record(rfc3339(ctl.now()))}) is None:
        return False  # the run is gone
    ctl.event(run, "Normal", Reason.APPROVED, f"approved by {shown_identity(verdict.approver)}")
    return True


def _slot_free(ctl: core.Controller, run: Mapping[str, Any], decision: Decision) -> bool:
    """Runs of the same policy with a sandbox, plus those queued before this one, against maxConcurrentRuns:
    waiting runs start in creation order."""
    meta, policy = run["metadata"], decision.policy
    if meta["namespace"] not in ctl.store.listed_namespaces:
        # Once per namespace after a start: the watch may not have delivered every run yet (a restart, a
        # burst), and a run the count misses would break the cap or the order.
        for listed in ctl.api.list_runs(meta["namespace"]):
            ctl.store.put_run(listed)
        ctl.store.listed_namespaces.add(meta["namespace"])
    ahead = 0
    for other in ctl.store.unfinished_in(meta["namespace"]):
        status = other.get("status") or {}
        if other["metadata"]["uid"] == meta["uid"]:
            continue
        if not status and _created_before(other, run):
            ahead += 1  # created earlier, not looked at yet (events of a burst arrive in any order): it goes first
            continue
        if status.get("policy") != policy.name:
            continue
        if status.get("podName") or (status.get("reason") == Reason.QUEUED and _created_before(other, run)):
            ahead += 1
    if ahead < policy.max_concurrent_runs:
        return True
    _wait(ctl, run, decision, Reason.QUEUED,
          f"policy {policy.name!r} allows {policy.max_concurrent_runs} concurrent runs in this namespace; "
          "this one starts when a slot frees, in creation order")  # no position: it would be a write per finish
    return False


def _created_before(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    order = lambda r: (r["metadata"].get("creationTimestamp") or "", r["metadata"]["name"])  # noqa: E731
    return order(a) < order(b)


def _wait(ctl: core.Controller, run: Mapping[str, Any], decision: Decision, reason: str, message: str) -> None:
    """Pending with the decision recorded; written only when something changed (the tick comes back often)."""
    status = run.get("status") or {}
    if status.get("reason") == reason and status.get("message") == message and status.get("decision"):
        return
    ctl.write_status(run, waiting_status(run, decision, reason, message, ctl.now()))
    if status.get("reason") != reason:
        ctl.event(run, "Normal", reason, message)


def _start(ctl: core.Controller, run: Mapping[str, Any], spec: CodeRunSpec, decision: Decision,
           key: str | None) -> None:
    if warm.try_start(ctl, run, spec, decision, key):
        return
    meta = run["metadata"]
    configmap = build_input_configmap(run, spec, decision)
    pod = build_pod(run, decision, configmap["metadata"]["name"])
    try:  # the namespace's deny-all is refused like any child (a quota, a namespace being deleted)
        conflict = _ensure_namespace_default_deny(ctl, meta["namespace"])
        for child in (configmap, build_network_policy(run, decision.policy.egress), pod):
            conflict = conflict or not_ours(ctl.api.create_or_get(child), meta["uid"], child)
            if conflict:
                break
    except ctl.api.Refused as refused:
        ctl.finish(run, Outcome(Phase.FAILED, Reason.START_FAILED, f"{refused}; the namespace's quota or "
                                "admission policy must allow the sandbox", decision_fields(decision)))
        return
    if conflict:
        ctl.finish(run, Outcome(Phase.FAILED, Reason.NAME_CONFLICT, conflict, decision_fields(decision)))
        return
    now = ctl.now()
    status = accepted_status(run, decision, pod["metadata"]["name"], decision.runtime.image, code_hash(spec), now)
    status["startMode"] = StartMode.COLD
    status["metrics"] = {**((run.get("status") or {}).get("metrics") or {}),
                         "queueMillis": millis_between(created_at(run), now)}
    if key:
        status["cacheKey"] = key
    if ctl.write_status(run, status) is not None:
        ctl.event(run, "Normal", Reason.POD_CREATED, f"sandbox pod {pod['metadata']['name']} created")


def not_ours(existing: Mapping[str, Any] | None, run_uid: str, wanted: Mapping[str, Any] | None = None) -> str | None:
    """None when the child was just created or is this run's own; else why it cannot be used. Own means
    controlled by this run's uid and, where we know what it must hold, holding exactly that: an owner
    reference can be forged by anyone who can create objects in the namespace, the content cannot."""
    if existing is None:
        return None
    owners = existing["metadata"].get("ownerReferences") or ()
    if any(o.get("uid") == run_uid and o.get("controller") for o in owners) and \
            (wanted is None or _same_content(existing, wanted)):
        return None
    kind, name = existing.get("kind") or "object", existing["metadata"]["name"]
    return (f"a {kind} named {name} already exists in this namespace and does not belong to this run, so the "
            "sandbox cannot be created; delete that object or create the run under another name")


def _same_content(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """What decides what the sandbox runs and reaches, compared field by field (the API server adds defaults
    elsewhere, so whole objects never compare equal)."""
    kind = wanted["kind"]
    if kind == "ConfigMap":
        return all((existing.get(f) or {}) == (wanted.get(f) or {}) for f in ("data", "binaryData"))
    if kind == "NetworkPolicy":
        return _same_rules(existing.get("spec") or {}, wanted["spec"])
    have, want = existing.get("spec") or {}, wanted["spec"]
    pick = lambda c: (c.get("image"), c.get("command"), c.get("args"), c.get("env") or [])  # noqa: E731
    return (have.get("runtimeClassName") == want.get("runtimeClassName")
            and [pick(c) for c in have.get("containers") or ()] == [pick(c) for c in want["containers"]]
            and [v.get("configMap", {}).get("name") for v in have.get("volumes") or ()]
            == [v.get("configMap", {}).get("name") for v in want["volumes"]])


def _ensure_namespace_default_deny(ctl: core.Controller, namespace: str) -> str | None:
    """The namespace-wide deny-all for sandboxes, created or repaired on every admission (it may have been
    deleted or edited since); a same-named policy that is not coderun's is a conflict, never trusted."""
    wanted = build_namespace_network_policy(namespace)
    existing = ctl.api.create_or_get(wanted)
    if existing is None:
        return None
    if (existing["metadata"].get("labels") or {}).get(LABEL_MANAGED_BY) != MANAGER:
        return not_ours(existing, "")
    if not _same_rules(existing.get("spec") or {}, wanted["spec"]):
        ctl.api.replace_network_policy(wanted, existing["metadata"]["resourceVersion"])
    return None


def _same_rules(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    # The API server omits empty rule lists when it answers; missing and [] mean the same: deny.
    fields = ("podSelector", "policyTypes", "ingress", "egress")
    return all((have.get(f) or None) == (want.get(f) or None) for f in fields)


def _node_images(ctl: core.Controller) -> list[Mapping[str, Any]]:
    """What the nodes say they hold (repo digests on a registry-backed cluster), then the digest of the image
    last seen on a sandbox pod, for images imported without a repo digest."""
    images = [image for node in ctl.api.nodes() for image in (node.get("status") or {}).get("images") or ()]
    return images + [{"names": [tag, f"{tag.rsplit(':', 1)[0]}@{digest}"]} for tag, digest in ctl.seen_digests.items()]


def _answer_from_cache(ctl: core.Controller, run: Mapping[str, Any], spec: CodeRunSpec, decision: Decision,
                       digest: str, key: str) -> bool:
    """A finished run with the same inputs and decision within the TTL answers this one: no pod at all. The
    store keeps finished runs slim, so the one picked is read whole from the API server (one GET)."""
    meta, now = run["metadata"], ctl.now()
    candidates = (r for r in ctl.store.finished_in(meta["namespace"], key) if r["metadata"]["uid"] != meta["uid"])
    picked = pick_reusable(candidates, key, spec.cache.ttl_seconds, now)
    if picked is None:
        return False
    source = ctl.api.get_run(meta["namespace"], picked["metadata"]["name"])
    if not is_same_source(source, picked, key):
        return False  # gone or replaced since: run for real
    try:
        artifacts = copy_artifacts(ctl, run, source)
    except ArtifactsConflict:
        return False  # run for real; collection then reports the conflict with the program's own result
    if artifacts is None:
        return False  # the earlier run's artifacts are gone or not genuine: run again rather than answer wrong
    outcome = reused_outcome(source, spec, decision, digest, artifacts,
                             redactor(decision.policy, ctl.store.policies(meta["namespace"])), now)
    outcome.fields["cacheKey"] = key
    if ctl.finish(run, outcome) is not None:
        core.metrics.CACHE_HITS.labels(core.metrics.language_label(spec.language)).inc()
    return True
