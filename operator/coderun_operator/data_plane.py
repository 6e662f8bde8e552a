"""The data plane as the operator uses it (docs/data.md): it resolves a run's inputs by reference to objects in the
store (HEAD, never the bytes), mints the grants the runner and the callers take to the data service, and deletes a
run's stored artifacts when the run goes. The bytes themselves move between the store, the data service and the
runner (or the caller): never through the operator, the API server or etcd.

The chart configures it through the environment; without CODERUN_DATA_SERVICE there is no data plane and a run
naming spec.inputs fails InputUnavailable, saying so.

    CODERUN_DATA_SERVICE       <namespace>/<Service> of the data service (a port named `data`)
    CODERUN_DATA_KEYS_SECRET   the Secret of grant signing keys in that namespace, one entry per key id
    CODERUN_DATA_KEY_ID        the entry that signs
    CODERUN_DATA_KEYS_CREATE   true: the operator creates that Secret with a random key if it is absent
    CODERUN_STORE_SECRET       <namespace>/<Secret> with endpoint, region, access-key-id, secret-access-key
    CODERUN_STORE_BUCKET       the bucket of runs' artifacts and callers' uploads (default coderun)
    CODERUN_DATA_URL           where callers reach the data service (default http://<Service ClusterIP>:<port>)
"""
from __future__ import annotations

import base64
import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from coderun.api.models import Artifact, ArtifactCaps, CodeRunSpec, InputRef
from coderun.api.reasons import TERMINAL_PHASES
from .builders.egress import ProxyRoute, pinned_pod, socket_address
from .builders.names import laid_run_json
from .builders.objects import transfer_seconds
from .data.grant import GrantRefused, ReadGrant, RunGrant, StoredObject, UploadGrant, mint, verify
from .data.store import (ObjectUnavailable, StoreMisconfigured, StoreSettings, StoreUnavailable, client as store_client,
                         delete_prefix, head, translated)
from .key_secret import ensure_key, read_key
from .proxy import target_port
from .policy import Decision

if TYPE_CHECKING:
    from .kube_api import KubeApi

log = logging.getLogger("coderun")

CACHE_SECONDS = 60
OPERATOR_READ_SECONDS = 10.0  # the operator's store calls (HEAD, list, delete): never the bytes
MAX_SWEPT_OBJECTS = 10000  # a sweep's bound; the next sweep goes on where the store's listing is then
UPLOAD_TTL_SECONDS = 86400  # an upload kept for the runs that name it after it came (content-addressed, shared)
# Reasons a run fails with when its inputs cannot be had (docs/data.md); the message names the input.
INPUT_UNAVAILABLE, INPUT_MISMATCH, INPUT_TOO_LARGE, INPUT_NOT_ALLOWED = (
    "InputUnavailable", "InputMismatch", "InputTooLarge", "InputNotAllowed")
INPUT_REASONS = frozenset({INPUT_UNAVAILABLE, INPUT_MISMATCH, INPUT_TOO_LARGE, INPUT_NOT_ALLOWED})
# The inline caps: what still travels as it always did (the artifacts ConfigMap); past them, the store.
INLINE_FILE_BYTES = 256 * 1024
INLINE_TOTAL_BYTES = 512 * 1024


class DataUnavailable(Exception):
    """The data service's Service, its key or the store's Secret is missing or malformed."""


# What the data plane raises when it cannot answer now (the store, its Secret, the data service): the run's
# reason then says so; anything else is a bug, handled as every bug is (reconcile.py's _guarded).
DATA_ERRORS = (DataUnavailable, StoreUnavailable, ObjectUnavailable, StoreMisconfigured)


@dataclass(frozen=True)
class InputProblem:
    """Why a run cannot have its inputs: a terminal reason and a message that names the input."""
    reason: str
    message: str


@dataclass(frozen=True)
class UploadsAwaited:
    """The run waits for its caller's uploads: the status.upload to write."""
    upload: dict[str, Any]


@dataclass(frozen=True)
class DataSettings:
    namespace: str
    service: str
    keys_secret: str
    key_id: str
    create_keys: bool
    store_namespace: str
    store_secret: str
    bucket: str
    url: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "DataSettings | None":
        namespace, _, service = (env.get("CODERUN_DATA_SERVICE") or "").partition("/")
        store_namespace, _, store_secret = (env.get("CODERUN_STORE_SECRET") or "").partition("/")
        if not service or not store_secret:
            return None
        return cls(namespace, service, env.get("CODERUN_DATA_KEYS_SECRET") or "coderun-data-keys",
                   env.get("CODERUN_DATA_KEY_ID") or "k1", env.get("CODERUN_DATA_KEYS_CREATE") == "true",
                   store_namespace, store_secret, env.get("CODERUN_STORE_BUCKET") or "coderun",
                   env.get("CODERUN_DATA_URL") or None)


def artifacts_prefix(namespace: str, uid: str) -> str:
    return f"runs/{namespace}/{uid}/artifacts/"


def run_prefix(namespace: str, uid: str) -> str:
    return f"runs/{namespace}/{uid}/"


def upload_key(namespace: str, sha256: str) -> str:
    return f"uploads/{namespace}/{sha256}"


def allowed_by(decision: Decision, bucket: str, key: str, own_bucket: str) -> bool:
    """An S3 input's object is under one of the policy's buckets and prefixes: never one with a '.', '..' or empty
    segment (a posix-backed store would resolve it outside the prefix), never coderun's own bucket (every
    namespace's runs and uploads are there)."""
    if bucket == own_bucket or any(part in ("", ".", "..") for part in key.split("/")):
        return False
    return any(b.bucket == bucket and key.startswith(b.prefix) for b in decision.policy.data.buckets or ())


def _iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_environment(api: "KubeApi", env: Mapping[str, str]) -> "DataPlane | None":
    settings = DataSettings.from_env(env)
    return DataPlane(api, settings) if settings else None


class DataPlane:
    def __init__(self, api: "KubeApi", settings: DataSettings, clock: Callable[[], float] = time.monotonic,
                 store: Any = None):
        self.api, self.settings, self._clock = api, settings, clock
        self._lock = threading.Lock()
        self._cached: tuple[float, ProxyRoute, str, bytes] | None = None  # (read at, route, caller url, key)
        self._store = store  # a boto3 S3 client; made from the store's Secret on first use

    # ------------------------------------------------------------------ settings, read from the API
    def ensure_keys(self) -> None:
        s = self.settings
        if s.create_keys:
            ensure_key(self.api, s.namespace, s.keys_secret, s.key_id, "data service grant signing key")

    def route(self) -> ProxyRoute:
        """Where the data service's pods are (sandbox pods are let reach their data port)."""
        return self._read()[0]

    def _read(self) -> tuple[ProxyRoute, str, bytes]:
        with self._lock:
            cached = self._cached
            if cached is not None and self._clock() - cached[0] <= CACHE_SECONDS:
                return cached[1], cached[2], cached[3]
        s = self.settings
        service = self.api.read_service(s.namespace, s.service)
        if service is None:
            raise DataUnavailable(f"the data service's Service {s.namespace}/{s.service} does not exist")
        spec = service.get("spec") or {}
        ports = {p.get("name"): p for p in spec.get("ports") or ()}
        if "data" not in ports or not spec.get("selector"):
            raise DataUnavailable(f"the data service's Service {s.namespace}/{s.service} needs a pod selector and "
                                  "a port named data")
        route = ProxyRoute(s.namespace, tuple(sorted(spec["selector"].items())), target_port(ports["data"]))
        cluster_ip = spec.get("clusterIP")
        url = s.url or (f"http://{socket_address(cluster_ip, int(ports['data']['port']))}"
                        if cluster_ip and cluster_ip != "None" else "")
        if s.create_keys and self.api.read_secret(s.namespace, s.keys_secret) is None:
            self.ensure_keys()
        key = read_key(self.api, s.namespace, s.keys_secret, s.key_id)
        if len(key) < 32:
            raise DataUnavailable(f"the data service's Secret {s.namespace}/{s.keys_secret} has no key "
                                  f"{s.key_id!r} of 32 bytes or more")
        with self._lock:
            self._cached = (self._clock(), route, url, key)
        return route, url, key

    def store(self) -> Any:
        if self._store is None:
            s = self.settings
            secret = self.api.read_secret(s.store_namespace, s.store_secret)
            if secret is None:
                raise DataUnavailable(f"the store's Secret {s.store_namespace}/{s.store_secret} does not exist")
            # short reads: the operator's calls are small (HEAD, list, delete) and run on its tick
            self._store = store_client(StoreSettings.from_secret_data(secret.get("data") or {}),
                                       read_timeout=OPERATOR_READ_SECONDS)
        return self._store

    def _pod_address(self, route: ProxyRoute, uid: str) -> str:
        """One ready data pod's address, the same for a run every time it is asked (sandboxes resolve no names)."""
        chosen = pinned_pod(self.api.list_pods(route.namespace, dict(route.pod_labels)), uid)
        if chosen is None:
            raise DataUnavailable(f"no pod of the data service (Service {self.settings.namespace}/"
                                  f"{self.settings.service}) is ready")
        return f"http://{socket_address(chosen[1], route.port)}"

    # ------------------------------------------------------------------ a run's inputs
    def prepare(self, run: Mapping[str, Any], spec: CodeRunSpec, decision: Decision, expires: int,
                find_run: Callable[[str, str], Mapping[str, Any] | None],
                same_creator: Callable[[Mapping[str, Any]], bool], now: float | None = None
                ) -> dict[str, Any] | InputProblem | UploadsAwaited:
        """run.json's `data` section for a run (its inputs resolved to objects, its grant minted: valid until
        `expires` plus the time its transfers may take), or why it cannot start (InputProblem), or the uploads it
        waits for (from `now` on). Raises DataUnavailable when the data plane is broken."""
        meta = run["metadata"]
        ns, uid = meta["namespace"], meta["uid"]
        limits = decision.policy.data
        objects: list[tuple[InputRef, StoredObject]] = []
        missing: list[InputRef] = []
        for ref in spec.inputs or ():
            found = self._resolve(ns, ref, decision, find_run, same_creator)
            if isinstance(found, InputProblem):
                return found
            if found is None:
                missing.append(ref)
                continue
            if found.size > limits.max_input_bytes:
                return InputProblem(INPUT_TOO_LARGE, f"input {ref.path} ({ref.source()}) is {found.size} bytes, over "
                                    f"the policy's data.maxInputBytes ({limits.max_input_bytes}): send a smaller "
                                    "file or ask the platform team for a larger cap")
            if ref.sha256 and found.sha256 and ref.sha256 != found.sha256:
                return InputProblem(INPUT_MISMATCH, f"input {ref.path} ({ref.source()}) has sha256 {found.sha256}, "
                                    f"not the pin {ref.sha256}: fix the pin or the object")
            objects.append((ref, StoredObject(found.bucket, found.key, found.size, ref.sha256 or found.sha256)))
        total = sum(o.size for _, o in objects) + sum(r.upload.size for r in missing if r.upload)
        if total > limits.max_inputs_total_bytes:
            return InputProblem(INPUT_TOO_LARGE, f"the inputs are {total} bytes together, over the policy's "
                                f"data.maxInputsTotalBytes ({limits.max_inputs_total_bytes}): send fewer or smaller "
                                "files")
        route, url, key = self._read()
        if missing:
            return self._awaited(ns, missing, url, key, limits.upload_wait_seconds,
                                 time.time() if now is None else now)
        caps = limits.artifacts or ArtifactCaps()
        section = {"url": self._pod_address(route, uid), "token": "",
                   "inputs": [{"path": r.path, "size": o.size, "sha256": o.sha256} for r, o in objects],
                   "artifactsToStore": True}
        grant = RunGrant(namespace=ns, name=meta["name"], uid=uid,
                         expires=expires + transfer_seconds(decision.policy, section),
                         inputs=tuple(o for _, o in objects), bucket=self.settings.bucket,
                         artifacts_prefix=artifacts_prefix(ns, uid), max_file_bytes=caps.max_file_bytes,
                         max_total_bytes=caps.max_total_bytes, max_files=caps.max_files)
        try:
            section["token"] = mint(self.settings.key_id, key, grant)
        except ValueError:  # over the grant's length: the inputs' keys are too long together
            return InputProblem(INPUT_TOO_LARGE, "the inputs' object keys are too long together for the run's grant "
                                "(16,000 characters): name fewer inputs, or objects with shorter keys")
        return section

    def laid(self, run: Mapping[str, Any], input_configmap: Mapping[str, Any], fresh: Mapping[str, Any],
             now: float) -> dict[str, Any] | None:
        """The data section an earlier start of this run laid in its input (run.json), to lay again instead of
        the `fresh` one: a start retried after a crash (a new leader) then finds its own input, not a conflict
        (a fresh grant expires at another second; the pinned data pod may differ). Only when it carries a grant
        this installation minted for this run, still valid, for the same inputs: anything else in a ConfigMap a
        namespace member could have written is not believed. None otherwise."""
        try:
            section: dict[str, Any] = laid_run_json(input_configmap).get("data") or {}
            _, _, key = self._read()
            grant = verify(str(section["token"]), {self.settings.key_id: key}, now)
        except (ValueError, TypeError, KeyError, AttributeError, GrantRefused, DataUnavailable):
            return None
        same = all(section.get(k) == fresh.get(k) for k in ("inputs", "artifactsToStore"))
        if not (isinstance(grant, RunGrant) and grant.uid == run["metadata"]["uid"] and same):
            return None
        # the data pod it names: the sandbox's NetworkPolicy lets it reach the data service's pods alone
        return {**fresh, "url": section.get("url") or fresh.get("url"), "token": section["token"]}

    def _awaited(self, ns: str, missing: Sequence[InputRef], url: str, key: bytes, wait_seconds: int,
                 now: float) -> UploadsAwaited:
        """The upload grant of a run that waits from `now` (the first time it is written: reconcile keeps it)."""
        expires = int(now) + wait_seconds
        files = tuple(sorted({(r.upload.sha256, r.upload.size) for r in missing if r.upload}))
        token = mint(self.settings.key_id, key, UploadGrant(namespace=ns, expires=expires,
                                                            bucket=self.settings.bucket, files=files))
        return UploadsAwaited({"url": url, "token": token, "expires": _iso(expires),
                               "files": [{"path": r.path, "sha256": r.upload.sha256, "size": r.upload.size}
                                         for r in missing if r.upload]})

    def _resolve(self, ns: str, ref: InputRef, decision: Decision,
                 find_run: Callable[[str, str], Mapping[str, Any] | None],
                 same_creator: Callable[[Mapping[str, Any]], bool]) -> StoredObject | InputProblem | None:
        """The object an input names, HEADed in the store (size, sha256 metadata); None: an upload not there yet."""
        bucket = self.settings.bucket
        if ref.s3 is not None:
            if not allowed_by(decision, ref.s3.bucket, ref.s3.key, self.settings.bucket):
                return InputProblem(INPUT_NOT_ALLOWED, f"input {ref.path}: s3://{ref.s3.bucket}/{ref.s3.key} is not "
                                    f"under a bucket and prefix of policy {decision.policy.name!r} (spec.data.buckets)"
                                    ": name an allowed object or ask the platform team to allow it")
            bucket, key = ref.s3.bucket, ref.s3.key
        elif ref.upload is not None:
            key = upload_key(ns, ref.upload.sha256)
        else:
            assert ref.artifact is not None
            found = self._artifact(ns, ref, find_run, same_creator)
            if isinstance(found, InputProblem):
                return found
            key, listed = found
            answer = head(self.store(), bucket, key)
            if answer is None or answer[0] != listed.size or (answer[1] or listed.sha256) != listed.sha256:
                return InputProblem(INPUT_MISMATCH, f"input {ref.path}: the store no longer holds the bytes run "
                                    f"{ref.artifact.run} recorded for {ref.artifact.name!r} (size and sha256)")
            return StoredObject(bucket, key, listed.size, listed.sha256)  # pinned to what the earlier run recorded
        answer = head(self.store(), bucket, key)
        if answer is None:
            if ref.upload is not None:
                return None
            return InputProblem(INPUT_UNAVAILABLE, f"input {ref.path}: {ref.source()} does not exist in the store: "
                                "name an existing object")
        size, sha = answer
        if ref.upload is not None and (size != ref.upload.size or (sha and sha != ref.upload.sha256)):
            return InputProblem(INPUT_MISMATCH, f"input {ref.path}: the upload {ref.upload.sha256} in the store is "
                                f"{size} bytes, not {ref.upload.size}: upload the file again")
        return StoredObject(bucket, key, size, sha or "")

    def _artifact(self, ns: str, ref: InputRef, find_run: Callable[[str, str], Mapping[str, Any] | None],
                  same_creator: Callable[[Mapping[str, Any]], bool]) -> tuple[str, Artifact] | InputProblem:
        """The store key of an earlier run's artifact, and the artifact as that run recorded it; one that was kept
        inline is copied into the store first."""
        assert ref.artifact is not None
        earlier = find_run(ns, ref.artifact.run)
        if earlier is None or not same_creator(earlier):
            return InputProblem(INPUT_NOT_ALLOWED, f"input {ref.path}: there is no CodeRun {ref.artifact.run} in "
                                f"namespace {ns} that this run's creator created: name one of your own runs")
        status = earlier.get("status") or {}
        if status.get("phase") not in TERMINAL_PHASES:
            return InputProblem(INPUT_UNAVAILABLE, f"input {ref.path}: run {ref.artifact.run} has not finished: "
                                "create this run once it has")
        listed = next((a for a in status.get("artifacts") or () if a.get("name") == ref.artifact.name), None)
        if listed is None:
            offered = ", ".join(a.get("name", "") for a in status.get("artifacts") or ()) or "none"
            return InputProblem(INPUT_UNAVAILABLE, f"input {ref.path}: run {ref.artifact.run} has no artifact "
                                f"{ref.artifact.name!r} (artifacts: {offered[:200]})")
        key = artifacts_prefix(ns, earlier["metadata"]["uid"]) + ref.artifact.name
        recorded = Artifact.model_validate(listed)
        if not recorded.stored:
            problem = self._promote(ns, recorded, key, ref)
            if problem is not None:
                return problem
        return key, recorded

    def _promote(self, ns: str, artifact: Artifact, key: str, ref: InputRef) -> InputProblem | None:
        """An inline artifact (at most INLINE_FILE_BYTES, in its ConfigMap) copied to the store under the run's
        prefix, so every input reaches the runner one way; the bytes are checked against the earlier status."""
        if head(self.store(), self.settings.bucket, key) is not None:
            return None
        cm = self.api.read_configmap(ns, artifact.config_map or "") if artifact.config_map else None
        encoded = ((cm or {}).get("binaryData") or {}).get(artifact.key or "")
        data = base64.b64decode(encoded) if encoded else None
        if data is None or len(data) != artifact.size or hashlib.sha256(data).hexdigest() != artifact.sha256:
            return InputProblem(INPUT_UNAVAILABLE, f"input {ref.path}: the artifact's ConfigMap no longer holds the "
                                "bytes its run recorded")
        with translated(f"writing s3://{self.settings.bucket}/{key}"):
            self.store().put_object(Bucket=self.settings.bucket, Key=key, Body=data,
                                    Metadata={"sha256": artifact.sha256})
        return None

    # ------------------------------------------------------------------ a run's artifacts
    def read_grant(self, run: Mapping[str, Any], stored: Sequence[Mapping[str, Any]], expires: int
                   ) -> dict[str, Any] | None:
        """status.dataGrant: reads the run's stored artifacts until `expires` (the run's own end)."""
        if not stored:
            return None
        _, url, key = self._read()
        meta = run["metadata"]
        grant = ReadGrant(namespace=meta["namespace"], uid=meta["uid"], expires=expires, bucket=self.settings.bucket,
                          prefix=artifacts_prefix(meta["namespace"], meta["uid"]))
        return {"url": url, "token": mint(self.settings.key_id, key, grant), "expires": _iso(expires)}

    def verify_stored(self, run: Mapping[str, Any], artifact: Mapping[str, Any]) -> bool:
        """The store holds what the runner said it put there (size, and the sha256 the data service computed)."""
        meta = run["metadata"]
        answer = head(self.store(), self.settings.bucket, artifacts_prefix(meta["namespace"], meta["uid"]) +
                      artifact["name"])
        return answer is not None and answer[0] == artifact["size"] and answer[1] == artifact["sha256"]

    def forget(self, namespace: str, uid: str) -> None:
        """Everything the store holds of a run (its artifacts): deleted with the run."""
        delete_prefix(self.store(), self.settings.bucket, run_prefix(namespace, uid))

    def sweep(self, live: Callable[[str], bool], now: datetime) -> int:
        """Delete the objects of runs that are gone (deleted while the operator was away, or by hand) or whose
        artifacts' time has passed (`live` says which to keep): the store keeps nothing of a run that no longer
        exists; and uploads older than UPLOAD_TTL_SECONDS (a run that names one later waits for it again, and the
        SDK sends it again). Returns how many runs' objects went."""
        store, gone = self.store(), 0
        seen: set[tuple[str, str]] = set()
        for item in self._listed("runs/"):
            parts = item["Key"].split("/")
            if len(parts) >= 3:
                seen.add((parts[1], parts[2]))
        for namespace, uid in sorted(seen):
            if not live(uid):
                self.forget(namespace, uid)
                gone += 1
        old = [item["Key"] for item in self._listed("uploads/")
               if (now - item["LastModified"]).total_seconds() > UPLOAD_TTL_SECONDS]
        for start in range(0, len(old), 1000):
            with translated(f"deleting old uploads in s3://{self.settings.bucket}/uploads/"):
                store.delete_objects(Bucket=self.settings.bucket,
                                     Delete={"Objects": [{"Key": k} for k in old[start:start + 1000]], "Quiet": True})
        return gone

    def _listed(self, prefix: str) -> list[dict[str, Any]]:
        """Up to MAX_SWEPT_OBJECTS objects under `prefix` (the next sweep goes on from what is left then)."""
        found: list[dict[str, Any]] = []
        with translated(f"listing s3://{self.settings.bucket}/{prefix}"):
            paginator = self.store().get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.settings.bucket, Prefix=prefix,
                                           PaginationConfig={"MaxItems": MAX_SWEPT_OBJECTS, "PageSize": 1000}):
                found.extend(page.get("Contents") or ())
        return found

