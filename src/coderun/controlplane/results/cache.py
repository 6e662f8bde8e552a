"""The result cache, pure: which earlier run has the same inputs and a result worth reusing.

The key covers everything that decides what the program does and sees: language, the image by digest (a tag
can be rebuilt; a result of the old image must not answer for the new one), command, code, stdin, files and
the effective limits. Without a known digest there is no key, and the run simply runs. Runs are looked up in the same namespace only, so a
cached result never crosses a tenancy boundary.
"""
from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any, Iterable, Mapping

from coderun.api.models import CodeRunSpec
from coderun.api.reasons import INFRASTRUCTURE_REASONS, Phase
from ..builders import code_hash
from ..policy import Decision
from .status import Outcome, parse_time
from .validate import validate_output

CACHE_LABEL = "coderun.io/cache-key"
# Result fields copied from the earlier run; timings of the program itself come along, the rest is ours.
_COPIED = ("exitCode", "signal", "stdout", "stderr", "stdoutBytes", "stderrBytes", "stdoutTruncated",
           "stderrTruncated", "stdoutSha256", "stderrSha256", "redactions", "error", "artifactsSkipped",
           "artifactsSkippedUnlisted", "image",
           "runtimeClass", "policy", "effectiveLimits", "codeHash")


def image_digest(image: str, node_images: Iterable[Mapping[str, Any]] = ()) -> str | None:
    """sha256:... of the image a run would get: pinned in the reference, or a node's record of the tag."""
    if "@sha256:" in image:
        return image[image.rindex("@") + 1:]
    repository = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    for entry in node_images:
        names = entry.get("names") or ()
        if image in names:
            for name in names:
                if name.startswith(repository + "@sha256:"):
                    return name[len(repository) + 1:]
    return None


def cache_key(spec: CodeRunSpec, decision: Decision, digest: str | None) -> str | None:
    if not digest:
        return None
    payload = {"inputs": code_hash(spec), "image": digest, "command": decision.runtime.command,
               "codeFile": decision.runtime.code_file, "limits": decision.limits.model_dump()}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def label_value(key: str) -> str:
    return key[:63]  # label values hold 63 characters; the full key is compared from status.cacheKey


def is_reusable(status: Mapping[str, Any]) -> bool:
    """Programs' own outcomes are reusable; platform failures and refusals never are."""
    return (status.get("phase") in (Phase.SUCCEEDED, Phase.FAILED)
            and status.get("reason") not in INFRASTRUCTURE_REASONS and not status.get("cachedFrom"))


def pick_reusable(runs: Iterable[Mapping[str, Any]], key: str, ttl_seconds: int,
                  now: datetime) -> Mapping[str, Any] | None:
    """The most recent finished run with this key, finished within the TTL."""
    best, best_time = None, None
    for run in runs:
        status = run.get("status") or {}
        finished = parse_time(status.get("completionTime"))
        if status.get("cacheKey") != key or not is_reusable(status) or finished is None:
            continue
        if (now - finished).total_seconds() > ttl_seconds:
            continue
        if best_time is None or finished > best_time:
            best, best_time = run, finished
    return best


def reused_outcome(source: Mapping[str, Any], spec: CodeRunSpec, artifacts: list[dict], now: datetime) -> Outcome:
    """The earlier run's result as this run's outcome; validation is redone against this run's expect."""
    status = source["status"]
    fields = {k: status[k] for k in _COPIED if k in status}
    fields["artifacts"] = artifacts
    metrics = status.get("metrics") or {}
    fields["metrics"] = {k: metrics[k] for k in ("wallMillis", "cpuMillis", "maxRSSBytes") if k in metrics}
    fields["cachedFrom"] = source["metadata"]["name"]
    validation = validate_output(spec.expect, status.get("exitCode"), status.get("stdout") or "",
                                 bool(status.get("stdoutTruncated")))  # stdout here is already redacted
    if validation is not None:
        fields["validation"] = validation.model_dump()
    age = round((now - parse_time(status["completionTime"])).total_seconds())
    message = f"{status.get('message', '')} (result reused from {source['metadata']['name']}, " \
              f"which ran the same inputs {age}s ago)".lstrip()
    return Outcome(status["phase"], status["reason"], message, fields)
