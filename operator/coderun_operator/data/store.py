"""The S3-compatible store as the data service and the operator reach it: a boto3 client from the store's Secret
(mounted as files, or read from the API), with bounded timeouts and path-style addressing (the embedded versitygw
has no per-bucket host names), and the few small calls the operator makes (HEAD, list, delete). boto3 does all
of S3; its errors come out as StoreUnavailable or ObjectUnavailable, so no caller needs botocore's."""
from __future__ import annotations

import base64
import binascii
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, NamedTuple

# boto3 ships no types, nor stubs we install: its client is Any here.
import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
import botocore.exceptions  # type: ignore[import-untyped]

ENTRIES = ("endpoint", "region", "access-key-id", "secret-access-key")
MAX_ENTRY_BYTES = 4096
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 60.0
MISSING_CODES = frozenset({"404", "NoSuchKey", "NoSuchBucket", "NotFound"})
DENIED_CODES = frozenset({"403", "AccessDenied", "Forbidden"})


class StoreMisconfigured(ValueError):
    """The store's Secret lacks an entry or holds one that cannot work; the message names it."""


class StoreUnavailable(Exception):
    """The store cannot be reached, timed out or failed (5xx): worth trying again later."""


class ObjectUnavailable(Exception):
    """The store answered that the object (or its bucket) is not there, or not readable with our credentials."""

    def __init__(self, message: str, missing: bool):
        super().__init__(message)
        self.missing = missing


@dataclass(frozen=True)
class StoreSettings:
    endpoint: str
    region: str
    access_key_id: str
    secret_access_key: str = field(repr=False)

    @classmethod
    def from_dir(cls, path: str) -> StoreSettings:
        """The Secret mounted at `path`, one file an entry (CODERUN_STORE_DIR)."""
        values = {}
        for entry in ENTRIES:
            try:
                with open(os.path.join(path, entry), "rb") as f:
                    values[entry] = f.read(MAX_ENTRY_BYTES + 1)
            except FileNotFoundError:
                raise StoreMisconfigured(f"the store's Secret mounted at {path} has no entry {entry!r}") from None
        return cls._of(values, f"mounted at {path}")

    @classmethod
    def from_secret_data(cls, data: Mapping[str, str]) -> StoreSettings:
        """The Secret's `data` as the API server returns it (base64 values)."""
        values = {}
        for entry in ENTRIES:
            try:
                values[entry] = base64.b64decode(data[entry], validate=True)
            except KeyError:
                raise StoreMisconfigured(f"the store's Secret has no entry {entry!r}") from None
            except (binascii.Error, ValueError, TypeError):
                raise StoreMisconfigured(f"the store's Secret entry {entry!r} is not base64") from None
        return cls._of(values, "")

    @classmethod
    def _of(cls, values: Mapping[str, bytes], where: str) -> StoreSettings:
        text = {}
        for entry, value in values.items():
            try:
                text[entry] = value.decode().strip()
            except UnicodeDecodeError:
                text[entry] = ""
            if not text[entry] or len(value) > MAX_ENTRY_BYTES:
                raise StoreMisconfigured(f"the store's Secret {where} has an empty, unreadable or over "
                                         f"{MAX_ENTRY_BYTES}-byte entry {entry!r}".replace("  ", " "))
        if not text["endpoint"].startswith(("http://", "https://")):
            raise StoreMisconfigured("the store's Secret entry 'endpoint' is not an http:// or https:// URL")
        return cls(text["endpoint"], text["region"], text["access-key-id"], text["secret-access-key"])


def client(settings: StoreSettings, read_timeout: float = READ_TIMEOUT, max_pool_connections: int = 10) -> Any:
    """A boto3 S3 client (boto3 ships no types: Any). Checksums only where S3 requires them: stores other than
    AWS (GCS, older MinIO) refuse the ones boto3 adds by default."""
    config = botocore.config.Config(
        connect_timeout=CONNECT_TIMEOUT, read_timeout=read_timeout, retries={"max_attempts": 2, "mode": "standard"},
        s3={"addressing_style": "path"}, max_pool_connections=max_pool_connections,
        request_checksum_calculation="when_required", response_checksum_validation="when_required")
    return boto3.session.Session().client(
        "s3", endpoint_url=settings.endpoint, region_name=settings.region, aws_access_key_id=settings.access_key_id,
        aws_secret_access_key=settings.secret_access_key, config=config)


@contextmanager
def translated(what: str) -> Iterator[None]:
    """botocore's errors while doing `what` (e.g. "reading s3://b/k") as ObjectUnavailable or StoreUnavailable."""
    try:
        yield
    except botocore.exceptions.ClientError as e:
        code = str((e.response.get("Error") or {}).get("Code") or "")
        status = int((e.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
        if code in MISSING_CODES or status == 404:
            raise ObjectUnavailable(f"{what}: the store has no such object or bucket ({code})", True) from None
        if code in DENIED_CODES or status == 403:
            raise ObjectUnavailable(f"{what}: the store refused our credentials ({code}): give them access",
                                    False) from None
        raise StoreUnavailable(f"{what}: the store failed ({code or status})") from None
    except botocore.exceptions.BotoCoreError as e:
        raise StoreUnavailable(f"{what}: the store cannot be reached ({type(e).__name__})") from None


def head(s3: Any, bucket: str, key: str) -> tuple[int, str | None] | None:
    """(size, the sha256 in its metadata or None) of an object, or None when it is not there."""
    try:
        with translated(f"reading s3://{bucket}/{key}"):
            answer = s3.head_object(Bucket=bucket, Key=key)
    except ObjectUnavailable as e:
        if e.missing:
            return None
        raise
    sha = (answer.get("Metadata") or {}).get("sha256")
    return int(answer["ContentLength"]), sha if isinstance(sha, str) else None


class Listed(NamedTuple):
    """What is under a prefix: the sizes by key, and whether the listing stopped before its end."""
    sizes: dict[str, int]
    truncated: bool


def list_prefix(s3: Any, bucket: str, prefix: str, max_objects: int) -> Listed:
    """The objects under `prefix`, at most `max_objects` of them (pages of up to 1000)."""
    sizes: dict[str, int] = {}
    token: str | None = None
    with translated(f"listing s3://{bucket}/{prefix}"):
        while True:
            page = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=min(1000, max_objects - len(sizes) + 1),
                                      **({"ContinuationToken": token} if token else {}))
            for item in page.get("Contents") or ():
                sizes[str(item["Key"])] = int(item["Size"])
            token = page.get("NextContinuationToken")
            if len(sizes) > max_objects:
                return Listed(dict(list(sizes.items())[:max_objects]), True)
            if not page.get("IsTruncated") or not token:
                return Listed(sizes, False)


class Deleted(NamedTuple):
    objects: int
    complete: bool  # False: more objects remain under the prefix (call again)


def delete_prefix(s3: Any, bucket: str, prefix: str, max_pages: int = 10) -> Deleted:
    """Delete what is under `prefix` (a non-empty one ending with "/": never a whole bucket by mistake), up to
    `max_pages` pages of 1000 objects a call."""
    if not prefix or not prefix.endswith("/"):
        raise ValueError(f"a prefix to delete ends with '/', not {prefix!r}")
    objects = 0
    with translated(f"deleting s3://{bucket}/{prefix}"):
        for _ in range(max_pages):
            page = s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1000)
            keys = [{"Key": item["Key"]} for item in page.get("Contents") or ()]
            if not keys:
                return Deleted(objects, True)
            answer = s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise StoreUnavailable(f"deleting s3://{bucket}/{first.get('Key')}: {first.get('Code')}")
            objects += len(keys)
    return Deleted(objects, False)


def ensure_bucket(s3: Any, bucket: str) -> bool:
    """The bucket, created when it is not there (the embedded store); True if it was created. A bucket another
    replica created meanwhile is as good."""
    try:
        with translated(f"reading bucket {bucket}"):
            s3.head_bucket(Bucket=bucket)
        return False
    except ObjectUnavailable as e:
        if not e.missing:
            raise
    try:
        with translated(f"creating bucket {bucket}"):
            s3.create_bucket(Bucket=bucket)
    except StoreUnavailable:  # e.g. BucketAlreadyOwnedByYou: there now, or the store's error stands
        with translated(f"creating bucket {bucket}"):
            s3.head_bucket(Bucket=bucket)
        return False
    return True
