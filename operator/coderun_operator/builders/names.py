"""Deterministic names and labels for a run's children, so creation is idempotent and lookups need no state."""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_RUN = "coderun.io/run"
LABEL_RUN_UID = "coderun.io/run-uid"
LABEL_SANDBOX = "coderun.io/sandbox"
MANAGER = "coderun"
# A CodeRunSession's sandbox pod: the session (name, fitted to a label) and its uid, which routes the pod's events.
LABEL_SESSION = "coderun.io/session"
LABEL_SESSION_UID = "coderun.io/session-uid"
# The sandbox pod's one container (the runner and the program under it).
CONTAINER_NAME = "run"
RUN_JSON = "run.json"  # the key of a run's input that tells the runner what to do (objects.build_input_configmap)
# On a sandbox pod: the policy it was built for.
ANNOTATION_POLICY = "coderun.io/policy"
# Warm pool pods: the policy (name, fitted to a label) and language they serve, and the exact pool key
# (policy digest, runtime, limits) in an annotation, so a changed policy's old pods are told apart.
LABEL_POOL = "coderun.io/pool"
LABEL_POOL_LANGUAGE = "coderun.io/pool-language"
ANNOTATION_POOL_KEY = "coderun.io/pool-key"
# On a claimed pool pod: sha256 of the nonce sent with the run's input (the runner puts the nonce in its frame).
ANNOTATION_NONCE_SHA256 = "coderun.io/input-nonce-sha256"

_MAX_NAME = 63  # pod hostnames and label values are limited to 63 characters


def _fit(base: str, suffix: str, limit: int) -> str:
    """base-suffix, shortened with a hash of base when too long, so distinct runs never collide."""
    name = f"{base}-{suffix}" if suffix else base
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(base.encode()).hexdigest()[:10]
    keep = limit - len(digest) - (len(suffix) + 2 if suffix else 1)
    head = base[:keep].rstrip("-.")
    return f"{head}-{digest}-{suffix}" if suffix else f"{head}-{digest}"


def fit_name(name: str, limit: int = _MAX_NAME) -> str:
    return _fit(name, "", limit)


def child_name(run_name: str, suffix: str) -> str:
    return _fit(run_name, suffix, _MAX_NAME)


def run_labels(run_name: str, run_uid: str) -> dict[str, str]:
    return {
        LABEL_MANAGED_BY: MANAGER,
        LABEL_RUN: _fit(run_name, "", _MAX_NAME),
        LABEL_RUN_UID: run_uid,
    }


def laid_run_json(input_configmap: Mapping[str, Any]) -> dict[str, Any]:
    """run.json as an earlier start laid it in the run's input ConfigMap ({} when it holds none). Written by
    whoever could write the ConfigMap: callers believe only what they verify in it. Malformed: ValueError."""
    document = json.loads((input_configmap.get("data") or {}).get(RUN_JSON) or "{}")
    if not isinstance(document, dict):
        raise ValueError("run.json is not an object")
    return document
