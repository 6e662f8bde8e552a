"""A random key the operator keeps in a Secret of its own namespace (the egress proxy's signing key, the audit
agent's key): created once when absent and the chart asked for that (nothing secret is in the chart's render),
read back as bytes. Replicas racing: the first create wins, the others find it."""
from __future__ import annotations

import base64
import binascii
import logging
import secrets
from typing import TYPE_CHECKING

from .builders.names import LABEL_MANAGED_BY, MANAGER

if TYPE_CHECKING:
    from .kube_api import KubeApi

log = logging.getLogger("coderun")

KEY_BYTES = 32


def ensure_key(api: KubeApi, namespace: str, name: str, entry: str, what: str) -> None:
    """The Secret `name` with a random key under `entry`, created if it is absent; an existing one is never
    touched. `what` names the key in the log line."""
    if api.read_secret(namespace, name) is not None:
        return
    secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"labels": {LABEL_MANAGED_BY: MANAGER}},
              "data": {entry: base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()}}
    try:
        api.write_secret(namespace, name, secret, None)
        log.info("%s created in Secret %s/%s", what, namespace, name)
    except api.Conflict:
        pass


def read_key(api: KubeApi, namespace: str, name: str, entry: str) -> bytes:
    """The key's bytes, or b"" when the Secret or its entry is missing or not base64."""
    secret = api.read_secret(namespace, name)
    try:
        return base64.b64decode(((secret or {}).get("data") or {})[entry], validate=True)
    except (KeyError, binascii.Error, ValueError, TypeError):
        return b""
