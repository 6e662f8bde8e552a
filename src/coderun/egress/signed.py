"""Signed tokens: `<version>.<key id>.<payload: base64url>.<HMAC-SHA256 of everything before it, base64url>`.

Two kinds share this one format and its code: the egress credential (`credential.py`, version `v1`) and the data
plane's grants (coderun_operator.data.grant, version `d1`). The version is signed, so a token of one kind never
verifies as the other even under the same key. It lives in this package because the egress proxy's image ships
`coderun.egress` alone (standard library only).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from typing import Mapping

KEY_ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
MIN_KEY_BYTES = 32


class Unsealed(Exception):
    """The token is not one of `version` (`NOT_OURS`) or no key we hold signed it (`BAD_SIGNATURE`)."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


NOT_OURS, BAD_SIGNATURE = "not-ours", "bad-signature"


def check_key(key_id: str, key: bytes) -> None:
    if not KEY_ID_PATTERN.match(key_id) or len(key) < MIN_KEY_BYTES:
        raise ValueError(f"a key id matches {KEY_ID_PATTERN.pattern} and a key has {MIN_KEY_BYTES} bytes or more")


def seal(version: str, key_id: str, key: bytes, payload: bytes) -> str:
    """The token carrying `payload`, signed with `key`."""
    check_key(key_id, key)
    body = f"{version}.{key_id}.{b64(payload)}"
    return f"{body}.{b64(sign(key, body))}"


def unseal(token: str, version: str, keys: Mapping[str, bytes]) -> str:
    """The payload part (still base64url) of a token of `version` signed by one of `keys`; its signature is
    checked before anything of the payload is read."""
    parts = token.split(".")
    if len(parts) != 4 or parts[0] != version:
        raise Unsealed(NOT_OURS)
    key = keys.get(parts[1])
    expected = sign(key, ".".join(parts[:3])) if key is not None else b""
    try:
        signature = unb64(parts[3])
    except ValueError:
        signature = b"-"
    if key is None or not hmac.compare_digest(signature, expected):
        raise Unsealed(BAD_SIGNATURE)
    return parts[2]


def sign(key: bytes, body: str) -> bytes:
    return hmac.new(key, body.encode(), hashlib.sha256).digest()


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as e:
        raise ValueError("not base64url") from e
