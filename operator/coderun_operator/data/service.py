"""The data service's HTTP server: the runner fetches a run's inputs and stores its artifacts here, callers upload
files and read stored artifacts, each with a grant (grant.py) the operator minted; this process alone holds the
store's credentials for them. Every caller is hostile: bodies stream in 1 MiB chunks (memory flat in the object's
size), at most `max_transfers` at once (beyond: 503 Busy), sockets idle 60 s at most, and an upload that fails
for any reason, or whose bytes are not the ones promised, leaves nothing in the store (docs/data.md).

    GET /healthz                 200 once the store answers (and the bucket is there), else 503
    GET /v1/inputs/<index>       RunGrant: the run's input, pinned by X-Coderun-Sha256
    PUT /v1/artifacts/<name>     RunGrant: one artifact under the run's prefix, within its caps
    PUT /v1/uploads/<sha256>     UploadGrant: a file the grant names, to uploads/<namespace>/<sha256>
    GET /v1/artifacts/<name>     ReadGrant: a stored artifact
"""
from __future__ import annotations

import hashlib
import json
import logging
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Mapping
from urllib.parse import unquote, urlsplit

from .grant import (MAX_KEY_BYTES, SHA256_PATTERN, Grant, GrantRefused, ReadGrant, RunGrant, StoredObject,
                    UploadGrant, artifact_name_problem, verify)
from .store import ObjectUnavailable, StoreUnavailable, ensure_bucket, head, list_prefix, translated

log = logging.getLogger("coderun.data")

CHUNK = 1 << 20
PART_BYTES = 8 << 20  # a multipart upload's part (S3 wants 5 MiB or more but for the last)
IDLE_TIMEOUT = 60.0
# A request's line and headers must all come within this (a slow drip of header bytes would otherwise hold a
# connection slot a minute per byte: the sandboxes' programs reach this port), and no one address holds more than
# MAX_CONNECTIONS_PER_ADDRESS connections (a run's runner and a caller's SDK each hold one at a time).
HEADER_SECONDS = 10.0
MAX_CONNECTIONS_PER_ADDRESS = 8
MAX_TRANSFERS = 16  # each may hold ~17 MiB (a multipart part and its copy): 16 fit the chart's 512Mi
RETRY_AFTER = 2
# A body answered before it was read (refused, or already stored) is read and dropped after the answer, this much
# at most: a caller still sending then reads the answer instead of a connection reset (which may drop it).
LINGER_BYTES = 64 << 20
LINGER_SECONDS = 5.0


class Answer(Exception):
    """An error answer: `{"reason", "message"}` with `status`."""

    def __init__(self, status: int, reason: str, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status, self.reason, self.headers = status, reason, dict(headers or {})


@dataclass
class Service:
    """What the handlers share: the store (`s3`, a boto3 client; `health_s3` with a shorter read timeout), the
    signing keys as they are now, and the bounds."""
    s3: Any
    keys: Callable[[], Mapping[str, bytes]]
    bucket: str
    health_s3: Any = None
    max_transfers: int = MAX_TRANSFERS
    part_bytes: int = PART_BYTES
    clock: Callable[[], float] = time.time
    transfers: threading.BoundedSemaphore = field(init=False)

    def __post_init__(self) -> None:
        self.transfers = threading.BoundedSemaphore(self.max_transfers)

    @contextmanager
    def transfer(self) -> Iterator[None]:
        if not self.transfers.acquire(blocking=False):
            raise Answer(503, "Busy", f"the data service moves {self.max_transfers} transfers at once already: "
                         f"try again in a few seconds", {"Retry-After": str(RETRY_AFTER)})
        try:
            yield
        finally:
            self.transfers.release()


@dataclass
class Transfer:
    """One request as its log line tells it (never the token)."""
    run: str = "-"
    object: str = "-"
    bytes: int = 0
    outcome: str = "ok"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version, sys_version = "coderun-data", ""  # no Python version for callers to read
    timeout = IDLE_TIMEOUT
    server: DataServer

    def do_GET(self) -> None:
        self._serve("GET")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def handle_one_request(self) -> None:
        """One request, its line and headers within HEADER_SECONDS in all (a timer shuts the socket), its body then
        within IDLE_TIMEOUT a read."""
        timer = threading.Timer(HEADER_SECONDS, self._too_slow)
        timer.daemon = True
        self._header_timer = timer
        timer.start()
        try:
            super().handle_one_request()
        finally:
            timer.cancel()

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the headers
        self._header_timer.cancel()
        return parsed

    def _too_slow(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def handle_expect_100(self) -> bool:
        # 100 Continue goes out once the request passed every check (_chunks): a refused body is never sent.
        return True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s: " + format, self.address_string(), *args)

    def _serve(self, method: str) -> None:
        service = self.server.service
        self._started, self._body_read = False, False
        path = urlsplit(self.path).path
        if method == "GET" and path == "/healthz":
            return self._health(service)
        transfer, begun = Transfer(), time.monotonic()
        try:
            self._route(service, method, path, transfer)
        except Answer as a:
            transfer.outcome = a.reason
            self._refuse(a)
        except ObjectUnavailable as e:  # a store call no route expected to miss
            transfer.outcome = "StoreUnavailable"
            self._refuse(Answer(503, "StoreUnavailable", str(e)))
        except StoreUnavailable as e:
            transfer.outcome = "StoreUnavailable"
            self._refuse(Answer(503, "StoreUnavailable", f"{e}: try again later"))
        except OSError as e:  # the caller's socket: gone or idle past the timeout
            transfer.outcome = f"connection-{type(e).__name__}"
            self.close_connection = True
        except Exception:  # a bug of ours: said, and this request alone ends
            log.exception("transfer of %s failed", transfer.object)
            transfer.outcome = "InternalError"
            self._refuse(Answer(500, "InternalError", "the data service failed: see its log"))
        log.info("transfer run=%s object=%r bytes=%d seconds=%.3f outcome=%s", transfer.run, transfer.object,
                 transfer.bytes, time.monotonic() - begun, transfer.outcome)

    def _route(self, service: Service, method: str, path: str, transfer: Transfer) -> None:
        kind, _, rest = path.removeprefix("/v1/").partition("/")
        if not path.startswith("/v1/") or kind not in ("inputs", "artifacts", "uploads"):
            raise Answer(404, "NotFound", f"no such path {path[:200]!r}: the paths are /v1/inputs/<index>, "
                         "/v1/artifacts/<name> and /v1/uploads/<sha256>")
        if (method, kind) not in (("GET", "inputs"), ("GET", "artifacts"), ("PUT", "artifacts"), ("PUT", "uploads")):
            raise Answer(405, "MethodNotAllowed", f"{method} is not served on /v1/{kind}/: GET inputs and "
                         "artifacts, PUT artifacts and uploads")
        grant = self._grant(service)
        if isinstance(grant, RunGrant):
            transfer.run = f"{grant.namespace}/{grant.name}"
        elif isinstance(grant, ReadGrant):
            transfer.run = f"{grant.namespace}/{grant.uid}"
        else:
            transfer.run = f"{grant.namespace}/(uploads)"
        if kind == "inputs" and method == "GET":
            self._get_input(service, need(grant, RunGrant, "reading a run's inputs"), rest, transfer)
        elif kind == "uploads":
            self._put_upload(service, need(grant, UploadGrant, "uploading a run's files"), rest, transfer)
        elif method == "PUT":
            self._put_artifact(service, need(grant, RunGrant, "storing a run's artifacts"), artifact_name(rest),
                               transfer)
        else:
            self._get_artifact(service, need(grant, ReadGrant, "reading a run's stored artifacts"),
                               artifact_name(rest), transfer)

    def _grant(self, service: Service) -> Grant:
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Answer(401, "BadGrant", "send the grant as `Authorization: Bearer <grant>`",
                         {"WWW-Authenticate": "Bearer"})
        try:
            return verify(token.strip(), service.keys(), service.clock())
        except GrantRefused as e:
            raise Answer(401, e.reason, str(e), {"WWW-Authenticate": "Bearer"}) from None

    # The four transfers.

    def _get_input(self, service: Service, grant: RunGrant, index: str, transfer: Transfer) -> None:
        if not (index.isascii() and index.isdigit()) or len(index) > 4 or int(index) >= len(grant.inputs):
            raise Answer(403, "NotGranted", f"the run's grant names {len(grant.inputs)} inputs (0 to "
                         f"{len(grant.inputs) - 1}), not {index[:20]!r}")
        obj = grant.inputs[int(index)]
        transfer.object = f"s3://{obj.bucket}/{obj.key}"
        with service.transfer():
            self._send(service, obj, f"input {index} (s3://{obj.bucket}/{obj.key})", "Input", transfer)

    def _get_artifact(self, service: Service, grant: ReadGrant, name: str, transfer: Transfer) -> None:
        problem = artifact_name_problem(name)
        if problem:
            raise Answer(400, "BadArtifactName", f"artifact name {name[:200]!r}: {problem}: read the names in the "
                         "run's status (artifacts with stored: true)")
        key = grant.prefix + name
        transfer.object = f"s3://{grant.bucket}/{key}"
        with service.transfer():
            found = head(service.s3, grant.bucket, key)
            if found is None:
                raise Answer(404, "ArtifactUnavailable", f"the run has no stored artifact {name[:200]!r}: read the "
                             "names in the run's status (artifacts with stored: true)")
            self._send(service, StoredObject(grant.bucket, key, found[0], found[1] or ""), f"artifact {name!r}",
                       "Artifact", transfer)

    def _put_artifact(self, service: Service, grant: RunGrant, name: str, transfer: Transfer) -> None:
        key = grant.artifacts_prefix + name
        if len(key.encode()) > MAX_KEY_BYTES:
            raise Answer(400, "BadArtifactName", f"artifact {name[:200]!r}: its key would be over {MAX_KEY_BYTES} "
                         "bytes: give it a shorter path")
        transfer.object = f"s3://{grant.bucket}/{key}"
        length = self._length()
        if length > grant.max_file_bytes:
            raise Answer(413, "ArtifactTooLarge", f"artifact {name!r} is {length} bytes, over the policy's "
                         f"data.artifacts.maxFileBytes ({grant.max_file_bytes}): write a smaller file")
        with service.transfer():
            stored = list_prefix(service.s3, grant.bucket, grant.artifacts_prefix, grant.max_files + 1)
            others = {k: size for k, size in stored.sizes.items() if k != key}
            if stored.truncated or len(others) >= grant.max_files:
                raise Answer(413, "TooManyArtifacts", f"artifact {name!r} would be one more than the policy's "
                             f"data.artifacts.maxFiles ({grant.max_files}): write fewer files")
            if sum(others.values()) + length > grant.max_total_bytes:
                raise Answer(413, "ArtifactsTooLarge", f"artifact {name!r} ({length} bytes) would take the run's "
                             f"stored artifacts over the policy's data.artifacts.maxTotalBytes "
                             f"({grant.max_total_bytes}): write less")
            # The runner names the hash it read (X-Coderun-Sha256): the store gets it as metadata from the start
            # and the bytes must have it, so no copy of the object onto itself is needed to set it afterwards.
            declared = self.headers.get("X-Coderun-Sha256") or ""
            sha = self._store(service, grant.bucket, key, length, declared if SHA256_PATTERN.fullmatch(declared) else None,
                              f"artifact {name!r}", transfer)
        self._reply({"name": name, "key": key, "size": length, "sha256": sha})

    def _put_upload(self, service: Service, grant: UploadGrant, sha: str, transfer: Transfer) -> None:
        sizes = [size for granted, size in grant.files if granted == sha]
        if not sizes:
            raise Answer(403, "NotGranted", f"the upload grant names no file of sha256 {sha[:64]!r}: upload the "
                         "files the run's status.upload lists")
        key = f"uploads/{grant.namespace}/{sha}"
        transfer.object = f"s3://{grant.bucket}/{key}"
        length = self._length()
        if length not in sizes:
            raise Answer(400, "InputMismatch", f"the upload of sha256 {sha} is {length} bytes, not the "
                         f"{sizes[0]} the run names: send the file the run's input names")
        with service.transfer():
            there = head(service.s3, grant.bucket, key)
            stored = there is not None and there[0] == length and there[1] in (None, sha)
            if not stored:
                self._store(service, grant.bucket, key, length, sha, f"the upload of sha256 {sha}", transfer)
        if not stored:
            return self._reply({"sha256": sha, "size": length, "key": key})
        transfer.outcome = "already-there"
        self.close_connection = True  # its body is never read
        self._reply({"sha256": sha, "size": length, "key": key}, {"Connection": "close"})
        self._linger()

    # Their parts.

    def _send(self, service: Service, obj: StoredObject, what: str, noun: str, transfer: Transfer) -> None:
        """Stream an object the grant names, after checking it is the one it names."""
        try:
            with translated(f"reading {what}"):
                answer = service.s3.get_object(Bucket=obj.bucket, Key=obj.key)
        except ObjectUnavailable as e:
            raise Answer(404, f"{noun}Unavailable", f"{e}: it is gone or was never there") from None
        body = answer["Body"]
        try:
            size = int(answer["ContentLength"])
            pinned = (answer.get("Metadata") or {}).get("sha256")
            if size != obj.size or (obj.sha256 and pinned and pinned != obj.sha256):
                raise Answer(409, f"{noun}Mismatch", f"{what} in the store is {size} bytes, sha256 {pinned or '?'}; "
                             f"the grant names {obj.size} bytes, sha256 {obj.sha256 or '?'}: it changed in the "
                             "store since the grant was minted")
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            if obj.sha256 or pinned:
                self.send_header("X-Coderun-Sha256", obj.sha256 or str(pinned))
            self.end_headers()
            self._started = True
            while transfer.bytes < size:
                with translated(f"reading {what}"):
                    chunk = body.read(min(CHUNK, size - transfer.bytes))
                if not chunk:
                    raise StoreUnavailable(f"reading {what}: the store's stream ended early")
                self.wfile.write(chunk)
                transfer.bytes += len(chunk)
        finally:
            body.close()

    def _length(self) -> int:
        if self.headers.get("Transfer-Encoding"):
            raise Answer(411, "LengthRequired", "send the body with a Content-Length, not chunked")
        length = self.headers.get("Content-Length") or ""
        if not (length.isascii() and length.isdigit()) or len(length) > 15:
            raise Answer(411, "LengthRequired", "send a Content-Length header with the body's size in bytes")
        return int(length)

    def _chunks(self, length: int, what: str, transfer: Transfer) -> Iterator[bytes]:
        """The request's body in chunks; a body that ends before its Content-Length raises (400 BodyCutShort)."""
        if (self.headers.get("Expect") or "").lower() == "100-continue":
            self.send_response_only(100)
            self.end_headers()
        while transfer.bytes < length:
            chunk = self.rfile.read(min(CHUNK, length - transfer.bytes))
            if not chunk:
                raise Answer(400, "BodyCutShort", f"{what}: the body ended after {transfer.bytes} of its "
                             f"{length} bytes: nothing was stored; send it again")
            transfer.bytes += len(chunk)
            yield chunk
        self._body_read = True

    def _store(self, service: Service, bucket: str, key: str, length: int, expected: str | None, what: str,
               transfer: Transfer) -> str:
        """Stream the body to s3://bucket/key, hashing as it goes; metadata sha256. Nothing is left when it fails
        or its sha256 is not `expected`. Small bodies in one PUT, larger ones in parts (an artifact's hash is
        known only at its end: its metadata is set by copying the completed object onto itself)."""
        digest = hashlib.sha256()
        s3 = service.s3

        def check() -> str:
            sha = digest.hexdigest()
            if expected is not None and sha != expected:
                if what.startswith("artifact"):
                    raise Answer(400, "ArtifactMismatch", f"{what}: the bytes sent have sha256 {sha}, not the "
                                 f"{expected} declared: nothing was stored")
                raise Answer(400, "InputMismatch", f"{what}: the bytes sent have sha256 {sha}, not {expected}: "
                             "nothing was stored; send the file the run's input names")
            return sha

        if length <= service.part_bytes:
            data = bytearray()
            for chunk in self._chunks(length, what, transfer):
                digest.update(chunk)
                data += chunk
            sha = check()
            with translated(f"storing {what}"):
                s3.put_object(Bucket=bucket, Key=key, Body=bytes(data), Metadata={"sha256": sha})
            return sha
        with translated(f"storing {what}"):
            upload = s3.create_multipart_upload(Bucket=bucket, Key=key,
                                                Metadata={"sha256": expected} if expected else {})["UploadId"]
        # One part goes to the store while the next is read from the caller (two parts held at most): the store's
        # write and the caller's send overlap, as a client's parallel parts would.
        sending = ThreadPoolExecutor(max_workers=1, thread_name_prefix="coderun-data-part")
        in_flight: Future[str] | None = None

        def send(number: int, body: bytes) -> str:
            with translated(f"storing {what}"):
                return str(s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number,
                                          Body=body)["ETag"])
        try:
            parts: list[dict[str, Any]] = []
            part = bytearray()
            for chunk in self._chunks(length, what, transfer):
                digest.update(chunk)
                part += chunk
                if len(part) >= service.part_bytes or transfer.bytes == length:
                    if in_flight is not None:
                        parts.append({"ETag": in_flight.result(), "PartNumber": len(parts) + 1})
                    in_flight = sending.submit(send, len(parts) + 1, bytes(part))
                    part = bytearray()
            if in_flight is not None:
                parts.append({"ETag": in_flight.result(), "PartNumber": len(parts) + 1})
                in_flight = None
            sha = check()
            with translated(f"storing {what}"):
                s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload,
                                             MultipartUpload={"Parts": parts})
        except BaseException:
            if in_flight is not None:
                in_flight.cancel()
                wait([in_flight])  # a part still being sent goes before the upload is aborted
            try:
                s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
            except Exception as e:  # the store's lifecycle must then clear it; the answer stays the first error
                log.warning("aborting the upload of s3://%s/%s failed: %s", bucket, key, type(e).__name__)
            raise
        finally:
            sending.shutdown(wait=False)
        if expected is None:
            try:
                with translated(f"storing {what}"):
                    s3.copy_object(Bucket=bucket, Key=key, CopySource={"Bucket": bucket, "Key": key},
                                   Metadata={"sha256": sha}, MetadataDirective="REPLACE")
            except BaseException:
                try:
                    s3.delete_object(Bucket=bucket, Key=key)
                except Exception as e:
                    log.warning("deleting s3://%s/%s failed: %s", bucket, key, type(e).__name__)
                raise
        return sha

    # Answers.

    def _health(self, service: Service) -> None:
        try:
            ensure_bucket(service.health_s3 or service.s3, service.bucket)
        except (StoreUnavailable, ObjectUnavailable) as e:
            return self._refuse(Answer(503, "StoreUnavailable", str(e)))
        self._reply({"status": "ok"})

    def _reply(self, document: Mapping[str, Any], headers: Mapping[str, str] | None = None, status: int = 200
               ) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, a: Answer) -> None:
        if self._started:  # the headers went out: all that is left is to cut the body short
            self.close_connection = True
            return
        headers, unread = dict(a.headers), self.command == "PUT" and not self._body_read
        if unread:  # this connection cannot go on
            headers["Connection"] = "close"
            self.close_connection = True
        try:
            self._reply({"reason": a.reason, "message": str(a)}, headers, a.status)
        except OSError:
            self.close_connection = True
            return
        if unread:
            self._linger()

    def _linger(self) -> None:
        """The answer ends here (our side shut); what the caller still sends is dropped, bounded in bytes and
        time, so closing does not reset the connection under an answer the caller has yet to read."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(LINGER_SECONDS)
            left, deadline = LINGER_BYTES, time.monotonic() + LINGER_SECONDS
            while left > 0 and time.monotonic() < deadline:
                chunk = self.rfile.read1(min(CHUNK, left))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass


def need(grant: Grant, kind: type[Any], doing: str) -> Any:
    if not isinstance(grant, kind):
        raise Answer(403, "NotGranted", f"{doing} takes a {kind.__name__}, not the {type(grant).__name__} sent: "
                     "use the grant meant for it")
    return grant


def artifact_name(quoted: str) -> str:
    try:
        name = unquote(quoted, errors="strict")
    except UnicodeDecodeError:
        raise Answer(400, "BadArtifactName", "the artifact name is not UTF-8 once unquoted") from None
    problem = artifact_name_problem(name)
    if problem:
        raise Answer(400, "BadArtifactName", f"artifact {name[:200]!r} cannot be stored: {problem}: name it by "
                     "a relative path without '.' or '..' segments")
    return name


class DataServer(ThreadingHTTPServer):
    """Threads bounded too: past `max_connections` open connections, a new one gets 503 Busy and is closed."""
    daemon_threads = True

    def __init__(self, address: tuple[str, int], service: Service, max_connections: int | None = None):
        self.service = service
        self.connections = threading.BoundedSemaphore(max_connections or 2 * service.max_transfers + 16)
        self.by_address: dict[str, int] = {}
        self.by_address_lock = threading.Lock()
        super().__init__(address, Handler)

    def _take(self, address: str) -> bool:
        with self.by_address_lock:
            if self.by_address.get(address, 0) >= MAX_CONNECTIONS_PER_ADDRESS:
                return False
            self.by_address[address] = self.by_address.get(address, 0) + 1
            return True

    def _give_back(self, address: str) -> None:
        with self.by_address_lock:
            left = self.by_address.get(address, 1) - 1
            if left:
                self.by_address[address] = left
            else:
                self.by_address.pop(address, None)

    def process_request(self, request: Any, client_address: Any) -> None:
        address = str(client_address[0]) if isinstance(client_address, tuple) else str(client_address)
        if not self._take(address):
            self._busy(request)
            return
        if not self.connections.acquire(blocking=False):
            self._give_back(address)
            self._busy(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.release()
            self._give_back(address)
            raise

    def _busy(self, request: Any) -> None:
        """503 Busy, and the connection closed: too many open, in all or from its address."""
        body = json.dumps({"reason": "Busy", "message": "the data service has too many connections open: try "
                                                        "again in a few seconds"}).encode()
        try:
            request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                            b"Retry-After: %d\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
                            % (RETRY_AFTER, len(body), body))
        except OSError:
            pass
        self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release()
            self._give_back(str(client_address[0]) if isinstance(client_address, tuple) else str(client_address))
