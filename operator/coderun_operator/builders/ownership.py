"""Whether an object found under a child's deterministic name is this run's own. Pure: an owner reference can be
forged by anyone who can create objects in the namespace, the content cannot, so both are checked."""
from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any, Mapping

from .names import LABEL_MANAGED_BY, MANAGER


def not_ours(existing: Mapping[str, Any] | None, run_uid: str, wanted: Mapping[str, Any] | None = None) -> str | None:
    """None when the child was just created or is this run's own; else why it cannot be used. Own means
    controlled by this run's uid and, where we know what it must hold, holding exactly that."""
    if existing is None:
        return None
    if controlled_by(existing, run_uid) and (wanted is None or _same_content(existing, wanted)):
        return None
    kind, name = existing.get("kind") or "object", existing["metadata"]["name"]
    return (f"a {kind} named {name} already exists in this namespace and does not belong to this run, so the "
            "sandbox cannot be created; delete that object or create the run under another name")


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(o.get("uid") == uid and o.get("controller") for o in obj["metadata"].get("ownerReferences") or ())


def is_managed(obj: Mapping[str, Any]) -> bool:
    return (obj["metadata"].get("labels") or {}).get(LABEL_MANAGED_BY) == MANAGER


def _same_content(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """What decides what the sandbox runs and reaches, compared field by field (the API server adds defaults
    elsewhere, so whole objects never compare equal)."""
    kind = wanted["kind"]
    if kind == "ConfigMap":
        return all((existing.get(f) or {}) == (wanted.get(f) or {}) for f in ("data", "binaryData"))
    if kind == "NetworkPolicy":
        return same_rules(existing.get("spec") or {}, wanted["spec"])
    have, want = existing.get("spec") or {}, wanted["spec"]

    def pick(c: Mapping[str, Any]) -> tuple[Any, ...]:
        return c.get("image"), c.get("command"), c.get("args"), c.get("env") or []
    return (have.get("runtimeClassName") == want.get("runtimeClassName")
            and [pick(c) for c in have.get("containers") or ()] == [pick(c) for c in want["containers"]]
            and [v.get("configMap", {}).get("name") for v in have.get("volumes") or ()]
            == [v.get("configMap", {}).get("name") for v in want["volumes"]])


def same_rules(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    # The API server omits empty rule lists when it answers; missing and [] mean the same: deny.
    fields = ("podSelector", "policyTypes", "ingress", "egress")
    return all((have.get(f) or None) == (want.get(f) or None) for f in fields)


def genuine_artifacts(configmap: Mapping[str, Any] | None, owner_uid: str,
                      listed: list[Mapping[str, Any]]) -> dict[str, bytes] | None:
    """The listed artifacts' bytes, if the ConfigMap is controlled by `owner_uid` and holds each one with the
    size and sha256 recorded; else None (anyone who may create ConfigMaps can squat the name or forge an owner
    reference, but not the content)."""
    if configmap is None or not controlled_by(configmap, owner_uid):
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
