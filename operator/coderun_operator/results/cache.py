"""The result cache, pure: which earlier run has the same inputs and a result worth reusing.

The key covers everything that decides what the program does and sees and what the status shows of it: the
inputs (code, stdin, files), the image by digest (a tag can be rebuilt; a result of the old image must not
answer for the new one) and the whole recorded decision: the policy and its digest, runtime, limits, egress,
redaction patterns, process and inode limits. So a run of a redacting policy is never answered by a plain one,
a run without egress never by one that had network, a run capped at 8 processes never by one allowed 128; and
limit outcomes (DiskLimitExceeded, OOMKilled, ...) are reused only under exactly the same limits. Without a
known digest there is no key, and the run simply runs. Runs are looked up in the same namespace only, so a
cached result never crosses a tenancy boundary.

What is reused is the program's own outcome only (its output, exit, error, artifacts); what decided the run
(policy, digest, decision, limits, runtime class, image) is always this run's own, and the output is redacted
again with this run's redactor.
"""
from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

from coderun.api.models import CodeRunSpec
from coderun.api.reasons import Phase
from ..builders import code_hash
from ..policy import Decision
from ..policy.redact import Redactor
from .status import (PROGRAM_REASONS, Outcome, decision_fields, head_bytes, parse_time, redacted_error,
                     redacted_names, redacted_validation)
from .validate import validate_output

CACHE_LABEL = "coderun.io/cache-key"
# The program's own result, copied from the earlier run (its text is redacted again below).
_PROGRAM_FIELDS = ("exitCode", "signal", "stdoutBytes", "stderrBytes", "stdoutTruncated", "stderrTruncated",
                   "stdoutSha256", "stderrSha256", "artifactsSkippedUnlisted")


def image_digest(image: str, node_images: Iterable[Mapping[str, Any]] = ()) -> str | None:
    """sha256:... of the image a run would get: pinned in the reference, or a node's record of the tag."""
    if "@sha256:" in image:
        return image[image.rindex("@") + 1:]
    repository = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    for entry in node_images:
        names: Sequence[str] = entry.get("names") or ()
        if image in names:
            for name in names:
                if name.startswith(repository + "@sha256:"):
                    return name[len(repository) + 1:]
    return None


def cache_key(spec: CodeRunSpec, decision: Decision, digest: str | None) -> str | None:
    if not digest:
        return None
    payload = {"inputs": code_hash(spec), "image": digest,
               "decision": decision.record().model_dump(mode="json", by_alias=True, exclude_none=True)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def label_value(key: str) -> str:
    return key[:63]  # label values hold 63 characters; the full key is compared from status.cacheKey


def is_reusable(status: Mapping[str, Any]) -> bool:
    """Only the program's own outcomes are reusable (never a platform failure, a refusal or a copy); the limit
    outcomes among them only because the key holds the limits exactly."""
    return (status.get("phase") in (Phase.SUCCEEDED, Phase.FAILED)
            and status.get("reason") in PROGRAM_REASONS and not status.get("cachedFrom"))


def pick_reusable(runs: Iterable[Mapping[str, Any]], key: str, ttl_seconds: int,
                  now: datetime) -> Mapping[str, Any] | None:
    """The most recent finished run with this key, finished within the TTL (from the store's projections)."""
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


def is_same_source(fetched: Mapping[str, Any] | None, picked: Mapping[str, Any], key: str) -> bool:
    """The run fetched by name is the one picked (not a new run that took its name) and still answers `key`."""
    if fetched is None or fetched["metadata"].get("uid") != picked["metadata"]["uid"]:
        return False
    status = fetched.get("status") or {}
    return status.get("cacheKey") == key and is_reusable(status) and parse_time(status.get("completionTime")) \
        is not None


def reused_outcome(source: Mapping[str, Any], spec: CodeRunSpec, decision: Decision, digest: str,
                   artifacts: list[dict[str, Any]], redactor: Redactor, now: datetime) -> Outcome:
    """The earlier run's program outcome as this run's: its text redacted again with this run's redactor,
    validation redone against this run's expect, and everything that decided the run this run's own."""
    status, again = source["status"], redactor.again()
    fields = {k: status[k] for k in _PROGRAM_FIELDS if k in status}
    limit = decision.limits.output_bytes
    redactions = status.get("redactions") or 0
    for stream in ("stdout", "stderr"):
        if stream in status:
            text, n = again.redact(status[stream] or "")
            fields[stream], cut = head_bytes(text, limit)
            fields[f"{stream}Truncated"] = bool(status.get(f"{stream}Truncated")) or cut
            redactions += n
    fields["error"], n_error = redacted_error(status.get("error"), again)
    fields["artifacts"], n_artifacts = redacted_names(artifacts, again)
    fields["artifactsSkipped"], n_skipped = redacted_names(status.get("artifactsSkipped") or [], again)
    fields["redactions"] = redactions + n_error + n_artifacts + n_skipped
    metrics = status.get("metrics") or {}
    fields["metrics"] = {k: metrics[k] for k in ("wallMillis", "cpuMillis", "maxRSSBytes") if k in metrics}
    fields["cachedFrom"] = source["metadata"]["name"]
    validation = validate_output(spec.expect, status.get("exitCode"), fields.get("stdout") or "",
                                 bool(fields.get("stdoutTruncated")))  # stdout here is already redacted
    if validation is not None:
        fields["validation"] = redacted_validation(validation, redactor)
    fields.update(decision_fields(decision), image=f"{decision.runtime.image.split('@')[0]}@{digest}",
                  codeHash=code_hash(spec))
    finished = parse_time(status["completionTime"])  # a reusable run has finished: never None here
    age = round((now - finished).total_seconds()) if finished else 0
    said = again.redact(status.get("message") or "")[0]
    message = f"{said} (result reused from {source['metadata']['name']}, which ran the same inputs {age}s ago)"
    return Outcome(status["phase"], status["reason"], message.lstrip(), {k: v for k, v in fields.items()
                                                                        if v is not None})
