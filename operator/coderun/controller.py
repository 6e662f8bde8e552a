"""Reconciliation: the pure core's decisions carried out through k8s.py. Handlers call only these functions.

Order matters for "nothing is lost": children are created before the status names them, and the final
status is written before the pod is deleted, so a crash at any point is repaired by the next reconcile.
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any, Mapping

import kopf
from pydantic import ValidationError

from . import k8s, metrics
from .api.models import CodeRunSpec
from .api.reasons import TERMINAL_PHASES, Phase, Reason
from .builders import (build_artifacts_configmap, build_input_configmap, build_namespace_network_policy,
                       build_network_policy, build_pod, code_hash)
from .builders.objects import CONTAINER_NAME
from .policy import DEFAULT_POLICY, Decision, Denial, evaluate, select_policy
from .results.cache import CACHE_LABEL, cache_key, is_reusable, label_value, pick_reusable, reused_outcome
from .results.frame import FrameError, parse_frame
from .results.pod_state import (container_status, image_with_digest, is_running, never_fits, pending_verdict,
                                pod_level_failure, terminated, unschedulable)
from .results.redact import Redactor
from .results.status import (Outcome, accepted_status, created_at, millis_between, outcome_from_frame,
                             outcome_without_frame, parse_time, running_status, terminal_status)

log = logging.getLogger("coderun")

# Frame size is bounded by the runner's caps (2 streams + artifacts); anything beyond this is not a real frame.
LOG_LIMIT_BYTES = 8 * 1024 * 1024
# Keep the written status well under etcd's 1.5 MiB object limit whatever the program printed.
STATUS_BUDGET_BYTES = 900 * 1024
# A run still without status after this long is admitted by the resync, in case its create handler gave up.
ADMIT_GRACE_SECONDS = 30

_run_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
_namespaces_with_default_deny: set[str] = set()
_redactors: dict[str, Redactor] = {}


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _key(run: Mapping[str, Any]) -> str:
    return run["metadata"]["uid"]


def _phase(run: Mapping[str, Any]) -> str | None:
    return (run.get("status") or {}).get("phase")


def _decide(run: Mapping[str, Any]) -> tuple[CodeRunSpec | None, Decision | Denial]:
    try:
        spec = CodeRunSpec.model_validate(run.get("spec") or {})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return None, Denial(Reason.INVALID_SPEC, "schema", f"spec.{where}: {first['msg']}")
    policy = select_policy(spec.policy_ref, {})
    if isinstance(policy, Denial):
        return spec, policy
    return spec, evaluate(spec, policy)


def _finish(run: Mapping[str, Any], outcome: Outcome, language: str | None) -> dict[str, Any] | None:
    """Write the terminal status once, tell people, count it. Returns what was written."""
    meta = run["metadata"]
    status = terminal_status(run, outcome, _now())
    status = _fit_status_budget(status)
    if k8s.patch_run_status(meta["namespace"], meta["name"], status) is None:
        return None  # the run was deleted meanwhile; nothing to report to
    event = kopf.info if outcome.phase == Phase.SUCCEEDED else kopf.warn
    event(dict(run), reason=outcome.reason, message=outcome.message[:1024])
    metrics.observe_finished(meta["uid"], status, language or "unknown")
    log.info("run %s/%s %s/%s", meta["namespace"], meta["name"], outcome.phase, outcome.reason)
    return status


def _fit_status_budget(status: dict[str, Any]) -> dict[str, Any]:
    """Shrink stdout/stderr (marking truncation) if escaping made the status larger than its budget."""
    for field in ("stdout", "stderr"):
        size = len(json.dumps(status, ensure_ascii=False).encode())
        if size <= STATUS_BUDGET_BYTES:
            break
        text = status.get(field) or ""
        keep = max(0, len(text) - (size - STATUS_BUDGET_BYTES) - 1024)
        status[field] = text[:keep]
        status[f"{field}Truncated"] = True
    return status


def admit(run: Mapping[str, Any]) -> None:
    """New or resumed run: policy check, then children, then the Pending status that names the pod."""
    with _run_locks[_key(run)]:
        _admit(run)


def _admit(run: Mapping[str, Any]) -> None:
    meta = run["metadata"]
    if _phase(run) in TERMINAL_PHASES or (run.get("status") or {}).get("podName"):
        return
    spec, decision = _decide(run)
    if isinstance(decision, Denial):
        _finish(run, Outcome(Phase.REJECTED, decision.reason, decision.message, {"policyRule": decision.rule}),
                spec.language if spec else None)
        return
    ns = meta["namespace"]
    if spec.cache and spec.cache.enabled and _answer_from_cache(run, spec, decision):
        return
    if ns not in _namespaces_with_default_deny:
        k8s.create_if_absent(build_namespace_network_policy(ns))
        _namespaces_with_default_deny.add(ns)
    configmap = build_input_configmap(run, spec, decision)
    pod = build_pod(run, decision, configmap["metadata"]["name"])
    try:
        for child in (configmap, build_network_policy(run), pod):
            k8s.create_if_absent(child)
    except k8s.Refused as refused:
        _finish(run, Outcome(Phase.FAILED, Reason.START_FAILED, f"{refused}; the namespace's quota or admission "
                             "policy must allow the sandbox"), spec.language)
        return
    now = _now()
    status = accepted_status(run, decision, pod["metadata"]["name"], decision.runtime.image, code_hash(spec), now)
    status["metrics"] = {"queueMillis": millis_between(created_at(run), now)}
    k8s.patch_run_status(ns, meta["name"], status)
    metrics.track_active(meta["uid"], True)
    kopf.info(dict(run), reason="PodCreated", message=f"sandbox pod {pod['metadata']['name']} created")


def on_pod(pod: Mapping[str, Any], deleted: bool) -> None:
    """Every event of a sandbox pod: move the run along, as soon as the container says it is done."""
    meta = pod["metadata"]
    owner = _owner(pod)
    if owner is None:
        return
    with _run_locks[owner["uid"]]:
        run = k8s.get_run(meta["namespace"], owner["name"])
        if run is None or run["metadata"]["uid"] != owner["uid"]:
            return
        _advance(run, None if deleted else pod, pod_deleted=deleted)


def resync() -> None:
    """Level-based pass over every run (periodically and after a restart): finish what events missed,
    notice vanished pods, clean up, expire. One list of runs and one of sandbox pods per pass."""
    # Runs first, pods second: a run that names its pod had that pod created before it was listed.
    runs = k8s.list_all_runs()
    pods_by_run = {owner["uid"]: pod for pod in k8s.list_sandbox_pods() if (owner := _owner(pod))}
    for run in runs:
        try:
            _resync_one(run, pods_by_run.get(run["metadata"]["uid"]))
        except Exception:  # one bad run must not stop the pass for the others
            log.exception("resync of %s/%s failed", run["metadata"]["namespace"], run["metadata"]["name"])


def _resync_one(run: Mapping[str, Any], pod: Mapping[str, Any] | None) -> None:
    meta, status = run["metadata"], run.get("status") or {}
    if _phase(run) in TERMINAL_PHASES:
        if pod is not None:
            k8s.delete_pod(meta["namespace"], pod["metadata"]["name"])
        _expire(run)
        return
    if not status.get("podName") and _age_seconds(run) <= ADMIT_GRACE_SECONDS:
        return  # the create handler is on it
    metrics.track_active(meta["uid"], True)
    with _run_locks[_key(run)]:
        # The list may be stale: decide on the run as it is now.
        fresh = k8s.get_run(meta["namespace"], meta["name"])
        if fresh is None or fresh["metadata"]["uid"] != meta["uid"]:
            return
        pod_name = (fresh.get("status") or {}).get("podName")
        if pod_name:
            if pod is None:  # absent from the snapshot: ask again before calling it deleted
                pod = k8s.get_pod(meta["namespace"], pod_name)
            _advance(fresh, pod, pod_deleted=pod is None)
        else:
            _admit(fresh)  # the create handler gave up or never ran; admission is idempotent


def _owner(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((o for o in pod["metadata"].get("ownerReferences") or () if o.get("kind") == "CodeRun"), None)


def _age_seconds(run: Mapping[str, Any]) -> float:
    created = parse_time(run["metadata"].get("creationTimestamp"))
    return (_now() - created).total_seconds() if created else 0.0


def _advance(run: Mapping[str, Any], pod: Mapping[str, Any] | None, pod_deleted: bool) -> None:
    status = run.get("status") or {}
    meta = run["metadata"]
    if _phase(run) in TERMINAL_PHASES:
        if pod is not None:
            k8s.delete_pod(meta["namespace"], pod["metadata"]["name"])
        return
    language = (run.get("spec") or {}).get("language")
    if pod_deleted or pod is None:
        if status.get("podName"):
            _finish(run, Outcome(Phase.FAILED, Reason.POD_DELETED,
                                 f"the sandbox pod {status['podName']} was deleted before the program finished; "
                                 "create the CodeRun again"), language)
        return
    if terminated(pod):
        _collect(run, pod)
        return
    failure = pod_level_failure(pod, status.get("effectiveLimits"))
    if failure:
        _finish(run, failure, language)
        k8s.delete_pod(meta["namespace"], pod["metadata"]["name"])
        return
    if is_running(pod):
        if _phase(run) != Phase.RUNNING:
            k8s.patch_run_status(meta["namespace"], meta["name"], running_status(run, _now()))
        return
    started = parse_time(status.get("startTime")) or _now()
    spec, decision = _decide(run)
    deadline = decision.policy.start_deadline_seconds if isinstance(decision, Decision) else 300
    verdict = never_fits(pod, k8s.node_allocatable()) if unschedulable(pod) else None
    verdict = verdict or pending_verdict(pod, (_now() - started).total_seconds(), deadline)
    if verdict:
        _finish(run, verdict, language)
        k8s.delete_pod(meta["namespace"], pod["metadata"]["name"])


def _collect(run: Mapping[str, Any], pod: Mapping[str, Any]) -> None:
    """Read the log once, trust only the vouched frame, store artifacts, write the status, delete the pod."""
    meta, status = run["metadata"], run.get("status") or {}
    ns, pod_name = meta["namespace"], pod["metadata"]["name"]
    spec, decision = _decide(run)
    state = terminated(pod)
    text, complete = k8s.read_log(ns, pod_name, CONTAINER_NAME, LOG_LIMIT_BYTES)
    effective = status.get("effectiveLimits")
    try:
        frame = parse_frame(text, state.get("message"), complete)
    except FrameError as e:
        outcome = outcome_without_frame(str(e), e.truncated, container_status(pod), effective)
    else:
        policy = decision.policy if isinstance(decision, Decision) else None
        artifacts = _store_artifacts(run, frame.artifacts)
        outcome = outcome_from_frame(spec, frame, _redactor(policy), state.get("reason") == "OOMKilled", effective,
                                     parse_time(status.get("startTime")), artifacts)
    outcome.fields["image"] = image_with_digest(pod, status.get("image") or "")
    outcome.fields["metrics"] = {**(status.get("metrics") or {}), **(outcome.fields.get("metrics") or {})}
    key = cache_key(spec, decision) if isinstance(decision, Decision) else None
    if key:
        outcome.fields["cacheKey"] = key
    written = _finish(run, outcome, spec.language if spec else None)
    if key and written and is_reusable(written):
        k8s.label_run(ns, meta["name"], {CACHE_LABEL: label_value(key)})
    k8s.delete_pod(ns, pod_name)


def _answer_from_cache(run: Mapping[str, Any], spec: CodeRunSpec, decision: Decision) -> bool:
    """A finished run with the same inputs within the TTL answers this one: no pod at all."""
    meta, key = run["metadata"], cache_key(spec, decision)
    candidates = k8s.list_runs(meta["namespace"], f"{CACHE_LABEL}={label_value(key)}")
    now = _now()
    source = pick_reusable((r for r in candidates if r["metadata"]["uid"] != meta["uid"]), key,
                           spec.cache.ttl_seconds, now)
    if source is None:
        return False
    artifacts = _copy_artifacts(run, source)
    if artifacts is None:
        return False  # the earlier run's artifacts are gone: run again rather than answer half
    outcome = reused_outcome(source, spec, artifacts, now)
    outcome.fields["cacheKey"] = key
    _finish(run, outcome, spec.language)
    metrics.CACHE_HITS.labels(spec.language).inc()
    return True


def _copy_artifacts(run: Mapping[str, Any], source: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """This run's own copy of the earlier run's artifacts, so deleting either run keeps the other whole."""
    listed = source["status"].get("artifacts") or []
    if not listed:
        return []
    contents = k8s.read_configmap_bytes(source["metadata"]["namespace"], listed[0]["configMap"])
    if contents is None or any(a["key"] not in contents for a in listed):
        return None
    return _save_artifacts(run, {a["key"]: contents[a["key"]] for a in listed}, listed)


def _redactor(policy) -> Redactor:
    patterns = tuple(policy.redaction_patterns) if policy else ()
    key = "\n".join(patterns)
    if key not in _redactors:
        _redactors[key] = Redactor(patterns)
    return _redactors[key]


def _store_artifacts(run: Mapping[str, Any], artifacts) -> list[dict[str, Any]]:
    """Artifacts whose bytes match their reported size and sha256 go to one ConfigMap owned by the run."""
    if not artifacts:
        return []
    contents, listed = {}, []
    for i, artifact in enumerate(artifacts):
        try:
            content = base64.b64decode(artifact.contentBase64, validate=True)
        except ValueError:
            continue
        if len(content) != artifact.size or hashlib.sha256(content).hexdigest() != artifact.sha256:
            continue
        key = f"artifact-{i}"
        contents[key] = content
        listed.append({"name": artifact.name, "size": artifact.size, "sha256": artifact.sha256, "key": key})
    return _save_artifacts(run, contents, listed)


def _save_artifacts(run: Mapping[str, Any], contents: dict[str, bytes], listed: list[dict]) -> list[dict[str, Any]]:
    """One ConfigMap owned by the run holds the bytes; the status lists where each artifact is."""
    configmap = build_artifacts_configmap(run, contents)
    k8s.create_if_absent(configmap)
    return [{**a, "configMap": configmap["metadata"]["name"]} for a in listed]


def _expire(run: Mapping[str, Any]) -> None:
    """Delete a finished run once its ttlSecondsAfterFinished (or the policy's) has passed."""
    meta, status, spec = run["metadata"], run.get("status") or {}, run.get("spec") or {}
    ttl = spec.get("ttlSecondsAfterFinished")
    if ttl is None:
        # Only the policy's default is needed, not a full evaluation of the spec (this runs every pass).
        policy = select_policy(spec.get("policyRef"), {})
        ttl = (DEFAULT_POLICY if isinstance(policy, Denial) else policy).ttl_seconds_after_finished
    finished = parse_time(status.get("completionTime"))
    if finished and (_now() - finished).total_seconds() >= ttl:
        k8s.delete_run(meta["namespace"], meta["name"])
        log.info("run %s/%s deleted %ss after it finished", meta["namespace"], meta["name"], ttl)
