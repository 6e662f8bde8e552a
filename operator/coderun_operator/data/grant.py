"""The data plane's grants: what the operator lets a runner or a caller do at the data service, signed with a key
the two share (Secret coderun-data-keys), so the service checks a request without calling the API server.

    d1.<key id>.<payload: base64url of compact JSON>.<HMAC-SHA256 of everything before it, base64url>

The egress credential's format (coderun.egress.signed); the signed `d1` keeps the two kinds apart. Three grants:
a RunGrant (the runner's: read the run's inputs, store its artifacts), an UploadGrant (a caller's: upload the
files a waiting run names) and a ReadGrant (a caller's: read a run's stored artifacts). Pure: no I/O.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from coderun.egress.signed import NOT_OURS, Unsealed, seal, unb64, unseal

VERSION = "d1"
MAX_TOKEN_CHARS = 16000
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
NAMESPACE_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
UID_PATTERN = re.compile(r"^[a-z0-9-]{1,64}$")
# S3's rule, with GCS's underscore.
BUCKET_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
MAX_KEY_BYTES = 1024  # S3's longest key, in UTF-8
MAX_NAME_CHARS = 1024

BAD_GRANT, GRANT_EXPIRED = "BadGrant", "GrantExpired"


@dataclass(frozen=True)
class StoredObject:
    """One object a grant names. `sha256` is 64 lowercase hex, or "" for an input nobody pinned (an S3 object
    without a pin in the run or a sha256 in its metadata): the runner then hashes what it gets, unchecked."""
    bucket: str
    key: str
    size: int
    sha256: str


@dataclass(frozen=True)
class RunGrant:
    """The runner's (run.json), never the program's nor a caller's: GET /v1/inputs/<index>, and PUT
    /v1/artifacts/<name> under `artifacts_prefix` within the caps."""
    namespace: str
    name: str
    uid: str
    expires: int  # seconds since the epoch
    inputs: tuple[StoredObject, ...]
    bucket: str
    artifacts_prefix: str  # runs/<ns>/<uid>/artifacts/
    max_file_bytes: int
    max_total_bytes: int
    max_files: int


@dataclass(frozen=True)
class UploadGrant:
    """A caller's, in the status of a run waiting for its uploads: PUT /v1/uploads/<sha256> of these files only,
    each to uploads/<namespace>/<sha256>."""
    namespace: str
    expires: int
    bucket: str
    files: tuple[tuple[str, int], ...]  # (sha256, size)


@dataclass(frozen=True)
class ReadGrant:
    """A caller's, in the status of a run whose artifacts are stored: GET /v1/artifacts/<name> of what is under
    the run's artifacts prefix. It names the prefix, not each artifact, so it stays small however many a run
    stored; the caller checks the bytes against the size and sha256 the run's status lists."""
    namespace: str
    uid: str
    expires: int
    bucket: str
    prefix: str  # runs/<ns>/<uid>/artifacts/


Grant = RunGrant | UploadGrant | ReadGrant


class GrantRefused(Exception):
    """The token does not open the data service; `reason` is BadGrant or GrantExpired, the message says why."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def mint(key_id: str, key: bytes, grant: Grant) -> str:
    """The operator's side: the token of one grant. A grant the service would refuse to read raises ValueError."""
    payload = _payload(grant)
    try:
        _grant(payload)
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"the data grant is malformed: {e}") from None
    token = seal(VERSION, key_id, key, json.dumps(payload, separators=(",", ":")).encode())
    if len(token) > MAX_TOKEN_CHARS:
        raise ValueError(f"the data grant would be {len(token)} characters, above {MAX_TOKEN_CHARS}: it names too "
                         "many objects or too long names")
    return token


def verify(token: str, keys: Mapping[str, bytes], now: float) -> Grant:
    """The service's side: the grant a token carries, or GrantRefused. Nothing longer than MAX_TOKEN_CHARS is
    decoded, and the signature is checked before any of the payload is parsed."""
    if len(token) > MAX_TOKEN_CHARS:
        raise GrantRefused(BAD_GRANT, f"the data grant is longer than {MAX_TOKEN_CHARS} characters")
    try:
        payload = unseal(token, VERSION, keys)
    except Unsealed as e:
        raise GrantRefused(BAD_GRANT, "the data grant is not a coderun data grant (d1)" if e.what == NOT_OURS
                           else "the data grant's signature does not verify: ask for a fresh grant") from None
    try:
        grant = _grant(json.loads(unb64(payload)))
    except (ValueError, TypeError, KeyError) as e:  # signed, so only a broken operator gets here
        raise GrantRefused(BAD_GRANT, f"the data grant's payload is malformed ({e})") from None
    if now >= grant.expires:
        raise GrantRefused(GRANT_EXPIRED, "the data grant expired: read a fresh one from the run's status")
    return grant


def artifact_name_problem(name: str) -> str | None:
    """Why `name` cannot name a stored artifact (a relative path under the run's prefix), or None."""
    if not name:
        return "it is empty"
    if len(name) > MAX_NAME_CHARS:
        return f"it is longer than {MAX_NAME_CHARS} characters"
    if "\0" in name:
        return "it holds a NUL character"
    if name.startswith("/"):
        return "it is absolute"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "it has an empty, '.' or '..' segment"
    return None


def _payload(grant: Grant) -> dict[str, Any]:
    if isinstance(grant, RunGrant):
        return {"k": "run", "ns": grant.namespace, "name": grant.name, "uid": grant.uid, "exp": grant.expires,
                "in": [_object(o) for o in grant.inputs], "b": grant.bucket, "ap": grant.artifacts_prefix,
                "mfb": grant.max_file_bytes, "mtb": grant.max_total_bytes, "mf": grant.max_files}
    if isinstance(grant, UploadGrant):
        return {"k": "up", "ns": grant.namespace, "exp": grant.expires, "b": grant.bucket,
                "f": [[sha, size] for sha, size in grant.files]}
    return {"k": "read", "ns": grant.namespace, "uid": grant.uid, "exp": grant.expires, "b": grant.bucket,
            "p": grant.prefix}


def _object(o: StoredObject) -> list[Any]:
    return [o.bucket, o.key, o.size, o.sha256]


def _grant(payload: Any) -> Grant:
    """Every field checked: a payload of the wrong shape is refused, never half used."""
    if not isinstance(payload, dict):
        raise TypeError("not an object")
    kind, ns, expires = payload["k"], _text(payload["ns"], NAMESPACE_PATTERN, "ns"), _count(payload["exp"], "exp")
    if kind == "run":
        prefix = _key(payload["ap"])
        if not prefix.endswith("/"):
            raise ValueError("the artifacts prefix does not end with /")
        return RunGrant(ns, _text(payload["name"], NAME_PATTERN, "name"), _text(payload["uid"], UID_PATTERN, "uid"),
                        expires, tuple(_stored(o, pinned=False) for o in _list(payload["in"])),
                        _text(payload["b"], BUCKET_PATTERN, "bucket"), prefix, _count(payload["mfb"], "mfb"),
                        _count(payload["mtb"], "mtb"), _count(payload["mf"], "mf"))
    if kind == "up":
        files = []
        for item in _list(payload["f"]):
            sha, size = _list(item, 2)
            files.append((_text(sha, SHA256_PATTERN, "sha256"), _count(size, "size")))
        return UploadGrant(ns, expires, _text(payload["b"], BUCKET_PATTERN, "bucket"), tuple(files))
    if kind == "read":
        prefix = _key(payload["p"])
        if not prefix.endswith("/"):
            raise ValueError("the artifacts prefix does not end with /")
        return ReadGrant(ns, _text(payload["uid"], UID_PATTERN, "uid"), expires,
                         _text(payload["b"], BUCKET_PATTERN, "bucket"), prefix)
    raise ValueError(f"no grant kind {kind!r}")


def _stored(item: Any, pinned: bool) -> StoredObject:
    bucket, key, size, sha = _list(item, 4)
    if not (sha == "" and not pinned):
        _text(sha, SHA256_PATTERN, "sha256")
    return StoredObject(_text(bucket, BUCKET_PATTERN, "bucket"), _key(key), _count(size, "size"), sha)


def _list(value: Any, length: int | None = None) -> list[Any]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise TypeError("a list of the wrong shape")
    return value


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} is not a whole number >= 0")
    return value


def _text(value: Any, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"{what} is malformed")
    return value


def _key(value: Any) -> str:
    if not isinstance(value, str) or not value or "\0" in value or len(value.encode()) > MAX_KEY_BYTES:
        raise ValueError("an object key is malformed")
    return value
