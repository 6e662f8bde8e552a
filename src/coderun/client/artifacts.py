"""Where a run's artifacts are: a small one in a ConfigMap the operator wrote, a larger one in the store (data.py
reads those), each named in the run's status. Pure."""
from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Mapping

from ..api.models import Artifact
from .errors import CodeRunError
from .result import RunResult


def find_artifact(result: RunResult, name: str) -> Artifact:
    artifact = next((a for a in result.artifacts or () if a.name == name), None)
    if artifact is None:
        offered = ", ".join(a.name for a in result.artifacts or ()) or "none"
        raise KeyError(f"run {result.name} has no artifact {name!r} (artifacts: {offered})")
    return artifact


def artifact_bytes(artifact: Artifact, binary_data: Mapping[str, str] | None) -> bytes:
    """The artifact's bytes from its ConfigMap's binaryData, only if they are the bytes the run's status vouches
    for (size and sha256): whoever may write ConfigMaps in the namespace could replace them after the run."""
    encoded = (binary_data or {}).get(artifact.key) if artifact.key else None
    if encoded is None:
        raise CodeRunError(f"ConfigMap {artifact.config_map} has no key {artifact.key} for artifact {artifact.name}")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        data = None
    if data is None or len(data) != artifact.size or hashlib.sha256(data).hexdigest() != artifact.sha256:
        raise CodeRunError(f"artifact {artifact.name}: ConfigMap {artifact.config_map} no longer holds the bytes the "
                           "run recorded (size and sha256 differ); it was changed after the run")
    return data
