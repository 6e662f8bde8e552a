"""Following the sandbox pod: Running, a verdict on a pod that cannot start, and the result once the
container terminated (read as soon as the kubelet says so, about a second before the pod phase moves).

The result is read once, only the runner-vouched frame is trusted, artifacts are stored, the status is
written, and only then is the pod deleted, so a crash in between is repaired by the next reconcile.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any, Mapping

from coderun.api.reasons import Phase, Reason, StartMode
from ..builders import build_artifacts_configmap
from ..builders.objects import CONTAINER_NAME
from ..policy import DEFAULT_POLICY, Decision
from ..results.cache import CACHE_LABEL, cache_key, image_digest, is_reusable, label_value
from ..results.frame import FrameError, RunnerFrame, parse_frame, parse_streamed_frame
from ..results.pod_state import (container_status, eviction, image_with_digest, is_running, never_fits,
                                 pending_verdict, pod_level_failure, terminated, unschedulable)
from ..results.redact import Redactor
from ..results.status import (Outcome, outcome_from_frame, outcome_without_frame, parse_time, running_status)
from . import core, warm
from .store import owner_uid

# Frame size is bounded by the runner's caps (2 streams + artifacts); anything beyond this is not a real frame.
LOG_LIMIT_BYTES = 8 * 1024 * 1024


def advance(ctl: core.Controller, run: Mapping[str, Any], pod: Mapping[str, Any] | None, pod_deleted: bool) -> None:
    meta, status = run["metadata"], run.get("status") or {}
    ns = meta["namespace"]
    if pod is not None and pod["metadata"]["name"] != status["podName"]:
        pod = None  # a warm pod given up for a cold start: not this run's pod any more
    if pod is None and not pod_deleted:
        pod = ctl.api.get_pod(ns, status["podName"])  # not in the store (yet): ask before calling it gone
        if pod is not None and owner_uid(pod) != meta["uid"]:
            pod = None  # a pod under its name that is not this run's: this run's pod is gone
        if pod is not None:
            ctl.store.put_pod(pod)
    if pod is None:
        ctl.finish(run, Outcome(Phase.FAILED, Reason.POD_DELETED,
                                f"the sandbox pod {status['podName']} was deleted before the program finished; "
                                "create the CodeRun again"))
        return
    if terminated(pod):
        collect(ctl, run, pod)
        return
    failure = pod_level_failure(pod, status.get("effectiveLimits"))
    if failure:
        ctl.finish(run, failure)
        ctl.api.delete_pod(ns, pod["metadata"]["name"])
        return
    if is_running(pod):
        if status.get("phase") != Phase.RUNNING and not warm.answering_soon(ctl, run):
            ctl.write_status(run, running_status(run, ctl.now()))
        if status.get("startMode") == StartMode.WARM:
            warm.recover(ctl, ctl.store.run(meta["uid"]) or run, pod)
        return
    started = parse_time(status.get("startTime")) or ctl.now()
    from .admission import decide
    _, decision = decide(run, ctl.store.policies(ns))
    deadline = (decision.policy if isinstance(decision, Decision) else DEFAULT_POLICY).start_deadline_seconds
    verdict = never_fits(pod, [n.get("status", {}).get("allocatable") or {} for n in ctl.api.nodes()]) \
        if unschedulable(pod) else None
    verdict = verdict or pending_verdict(pod, (ctl.now() - started).total_seconds(), deadline)
    if verdict:
        ctl.finish(run, verdict)
        ctl.api.delete_pod(ns, pod["metadata"]["name"])


def collect(ctl: core.Controller, run: Mapping[str, Any], pod: Mapping[str, Any]) -> None:
    """The container ended: read the log once and trust only the frame the termination message vouches for."""
    state = terminated(pod) or {}
    text, complete = ctl.api.read_log(run["metadata"]["namespace"], pod["metadata"]["name"], CONTAINER_NAME,
                                      LOG_LIMIT_BYTES)
    try:
        frame = parse_frame(text, state.get("message"), complete)
    except FrameError as e:
        frame = e
    finish_from_frame(ctl, run, pod, frame, oom_killed=state.get("reason") == "OOMKilled")


def collect_streamed(ctl: core.Controller, run: Mapping[str, Any], pod_name: str, text: str, nonce: str) -> None:
    """A warm pod's frame, straight off the attach stream, vouched by the claim's nonce. Anything less is left
    to `collect` when the container ends (the log and the termination message hold the same frame)."""
    status = run.get("status") or {}
    if core.is_terminal(run) or status.get("podName") != pod_name:
        return
    try:
        frame = parse_streamed_frame(text, nonce)
    except FrameError as e:
        core.log.warning("run %s: %s; waiting for the pod's log", run["metadata"]["name"], e)
        return
    pod = ctl.store.pod(run["metadata"]["uid"])
    if pod is None or pod["metadata"]["name"] != pod_name:
        pod = {"metadata": {"name": pod_name}}
    finish_from_frame(ctl, run, pod, frame, oom_killed=False)


def finish_from_frame(ctl: core.Controller, run: Mapping[str, Any], pod: Mapping[str, Any],
                      frame: RunnerFrame | FrameError, oom_killed: bool) -> None:
    """Store artifacts, write the status, delete the pod, in that order (a crash in between is repaired)."""
    from .admission import decide
    meta, status = run["metadata"], run.get("status") or {}
    ns, pod_name = meta["namespace"], pod["metadata"]["name"]
    if isinstance(frame, RunnerFrame) and status.get("startMode") == StartMode.WARM:
        if warm.incomplete_input(frame):
            warm.go_cold(ctl, run, pod_name, "the warm pod's input was cut short; the program did not run")
            return
        if not warm.ran_this_claim(frame, pod):
            warm.go_cold(ctl, run, pod_name, "the warm pod ran an input that was not this run's (someone attached "
                         "to it first); this run's program did not run there")
            return
    spec, decision = decide(run, ctl.store.policies(ns))
    policy = decision.policy if isinstance(decision, Decision) else None
    effective = status.get("effectiveLimits")
    if isinstance(frame, FrameError):
        outcome = eviction(pod, effective) or outcome_without_frame(str(frame), frame.truncated,
                                                                      container_status(pod), effective)
    else:
        try:
            artifacts, skipped, conflict = *store_artifacts(ctl, run, frame.artifacts), None
        except ArtifactsConflict as e:
            artifacts, skipped, conflict = [], [], e
        outcome = outcome_from_frame(spec, frame, redactor(policy, ctl.store.policies(ns)), oom_killed, effective,
                                     parse_time(status.get("startTime")), artifacts,
                                     [s.model_dump() for s in frame.artifactsSkipped] + skipped)
        if conflict:
            outcome.phase, outcome.reason, outcome.message = Phase.FAILED, Reason.NAME_CONFLICT, str(conflict)
    image = image_with_digest(pod, status.get("image") or "")
    outcome.fields["image"] = image
    outcome.fields["metrics"] = {**(status.get("metrics") or {}), **(outcome.fields.get("metrics") or {})}
    key = cache_key(spec, decision, image_digest(image)) if isinstance(decision, Decision) and spec else None
    outcome.fields["cacheKey"] = key
    written = ctl.finish(run, outcome)
    if key and written and is_reusable(written):
        labelled = ctl.api.label_run(ns, meta["name"], {CACHE_LABEL: label_value(key)})
        if labelled is not None:
            ctl.store.put_run(labelled)
    ctl.api.delete_pod(ns, pod_name)


def redactor(policy, live_policies: Mapping[str, Any]) -> Redactor:
    """The redactor the loaded policy compiled, when the run's recorded policy is still the live one (same
    digest); else one for this result only (the policy changed or went: its patterns are not kept for it)."""
    live = live_policies.get(policy.name) if policy else None
    if policy and getattr(live, "digest", None) == policy.digest and live.compiled_patterns:
        return live.compiled_patterns.redactor
    return Redactor(policy.redaction_patterns if policy else ())


def store_artifacts(ctl: core.Controller, run: Mapping[str, Any], artifacts) -> tuple[list[dict], list[dict]]:
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
    return save_artifacts(ctl, run, contents, listed), skipped


def save_artifacts(ctl: core.Controller, run: Mapping[str, Any], contents: dict[str, bytes],
                   listed: list[dict]) -> list[dict[str, Any]]:
    """One ConfigMap owned by the run holds the bytes; the status lists where each artifact is. A same-named
    ConfigMap that is not this run's is never used: the artifacts are then reported as skipped instead."""
    if not listed:
        return []
    from .admission import not_ours
    configmap = build_artifacts_configmap(run, contents)
    if not_ours(ctl.api.create_or_get(configmap), run["metadata"]["uid"]):
        raise ArtifactsConflict(configmap["metadata"]["name"])
    return [{**a, "configMap": configmap["metadata"]["name"]} for a in listed]


class ArtifactsConflict(Exception):
    """The artifacts ConfigMap's name is taken by an object that is not this run's."""

    def __init__(self, name: str):
        super().__init__(f"the program ran, but a ConfigMap named {name} already exists and does not belong to "
                         "this run, so its artifacts were not stored; delete that ConfigMap or use another name")


def copy_artifacts(ctl: core.Controller, run: Mapping[str, Any], source: Mapping[str, Any]) -> list[dict] | None:
    """This run's own copy of the earlier run's artifacts, so deleting either run keeps the other whole. None
    when they cannot be copied as the earlier run recorded them: gone, or a ConfigMap under their name that is
    not the earlier run's or does not hold the bytes its status vouches for (sha256 of each)."""
    listed = source["status"].get("artifacts") or []
    if not listed:
        return []
    configmap = ctl.api.read_configmap(source["metadata"]["namespace"], listed[0]["configMap"])
    contents = genuine_artifacts(configmap, source["metadata"]["uid"], listed)
    if contents is None:
        return None
    return save_artifacts(ctl, run, contents, listed)


def genuine_artifacts(configmap: Mapping[str, Any] | None, owner_uid: str,
                      listed: list[Mapping[str, Any]]) -> dict[str, bytes] | None:
    """The listed artifacts' bytes, if the ConfigMap is controlled by `owner_uid` and holds each one with the
    size and sha256 recorded; else None (anyone who may create ConfigMaps can squat the name or forge an owner
    reference, but not the content)."""
    if configmap is None or not any(o.get("uid") == owner_uid and o.get("controller")
                                    for o in configmap["metadata"].get("ownerReferences") or ()):
        return None
    stored, contents = configmap.get("binaryData") or {}, {}
    for artifact in listed:
        try:
            content = base64.b64decode(stored.get(artifact["key"]) or "", validate=True)
        except (binascii.Error, ValueError):
            return None
        if artifact["key"] not in stored or len(content) != artifact["size"] or \
                hashlib.sha256(content).hexdigest() != artifact["sha256"]:
            return None
        contents[artifact["key"]] = content
    return contents
