"""The bearer the operator presents to the node audit agents: an HMAC of a fixed label under a key both mount
from one Secret. Standard library only, so the operator (which never decodes protobuf) can import it."""

from __future__ import annotations

import hashlib
import hmac

MIN_KEY_BYTES = 32
# What the key signs: the agent's name, so the same Secret's key used elsewhere yields a different token.
LABEL = b"coderun-audit-agent"


def agent_bearer(key: bytes) -> str:
    """hmac_sha256(key, b"coderun-audit-agent"), hex."""
    return hmac.new(key, LABEL, hashlib.sha256).hexdigest()


def authorization_header(key: bytes) -> str:
    return f"Bearer {agent_bearer(key)}"


def is_authorized(header: str | None, key: bytes) -> bool:
    """Whether an Authorization header carries the key's bearer (an empty key authorizes nothing)."""
    if not key or not header:
        return False
    return hmac.compare_digest(header.encode("latin-1", "replace"), authorization_header(key).encode())
