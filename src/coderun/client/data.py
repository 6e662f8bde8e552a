"""The bytes of a run's uploads and stored artifacts, to and from coderun's data service (docs/data.md), with the
grant the run's status holds as the bearer token: PUT <url>/v1/uploads/<sha256>, GET <url>/v1/artifacts/<name>.

The standard library only (http.client): the light install carries no other HTTP client. Both ways stream in 1 MiB
chunks, so memory stays flat in the file's size; every socket operation is bounded (connect, then each read or
write), and a download is checked against the size and sha256 the run's status recorded before it counts.
The runner has its own transfer code (coderun.sandbox.runner.data): it runs in the sandbox image, on the other side
of the trust boundary, and the import contracts keep the two apart.
"""
from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import select
import socket
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Sequence

from ..api.models import Artifact, DataGrant, UploadWait
from .errors import ArtifactUnavailable, CodeRunError, InputTooLarge, UploadFailed
from .inputs import CHUNK, Upload, asked_for

CONNECT_SECONDS = 10.0
IDLE_SECONDS = 60.0         # a socket silent this long (the service stalled, or the path to it broke) is given up
MAX_ERROR_BODY_BYTES = 64 * 1024
ATTEMPTS = 4                # a busy service (503 Busy, with Retry-After) or a dropped connection is tried again
MAX_RETRY_AFTER_SECONDS = 10.0
CONTINUE_SECONDS = 3.0      # how long an upload waits for 100 Continue before sending its body anyway
MAX_INTERIM_BYTES = 4096
AUTH_FAILURES = (401, 403)  # BadGrant, GrantExpired: the grant in hand no longer opens the door
# Where this caller reaches the data service, when not at the address the run's status names (a ClusterIP, which a
# laptop outside the cluster cannot reach): e.g. a `kubectl port-forward -n coderun-system svc/coderun-data 8080`.
DATA_URL_ENV = "CODERUN_DATA_URL"
REACH_ADVICE = (f"the caller must reach the data service: run inside the cluster, or set {DATA_URL_ENV} (e.g. "
                "http://127.0.0.1:8080 beside `kubectl port-forward -n coderun-system svc/coderun-data 8080`)")


@dataclass(frozen=True)
class Refusal:
    """What the data service answered instead of the bytes: HTTP status, its reason and message."""
    status: int
    reason: str | None
    message: str
    retry_after: float | None = None

    @property
    def retriable(self) -> bool:
        return self.status in (502, 503, 504)


class Unreachable(Exception):
    """No answer from the data service (refused, reset, timed out)."""


def _connect(url: str) -> tuple[http.client.HTTPConnection, str]:
    """A connection to the service at `url` (its path, if any, prefixes every request) and that prefix."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Unreachable(f"the data service's address {url!r} is not an http(s) URL")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, parts.port, timeout=CONNECT_SECONDS)
    try:
        connection.connect()
    except OSError as e:
        connection.close()
        raise Unreachable(f"cannot connect to the data service at {url}: {e}") from None
    assert connection.sock is not None
    connection.sock.settimeout(IDLE_SECONDS)
    return connection, parts.path.rstrip("/")


def _refusal(response: http.client.HTTPResponse) -> Refusal:
    body = response.read(MAX_ERROR_BODY_BYTES)
    reason, message = None, body.decode("utf-8", "replace").strip()[:500] or response.reason
    try:
        answer = json.loads(body)
        if isinstance(answer, dict):
            reason = answer.get("reason") if isinstance(answer.get("reason"), str) else None
            message = str(answer.get("message") or message)[:1000]
    except ValueError:
        pass
    try:
        retry_after = float(response.headers.get("Retry-After") or "")
    except ValueError:
        retry_after = None
    return Refusal(response.status, reason, message, retry_after)


def _answered_early(connection: http.client.HTTPConnection) -> bool:
    """The service answered before the body was all sent (the bytes are there already, or it refuses them)."""
    sock = connection.sock
    return sock is not None and bool(select.select([sock], [], [], 0)[0])


def _put_once(url: str, token: str, upload: Upload) -> dict | Refusal:
    connection, prefix = _connect(url)
    try:
        try:
            connection.putrequest("PUT", f"{prefix}/v1/uploads/{upload.sha256}", skip_accept_encoding=True)
            connection.putheader("Authorization", f"Bearer {token}")
            connection.putheader("Content-Type", "application/octet-stream")
            connection.putheader("Content-Length", str(upload.size))
            plain = type(connection.sock) is socket.socket  # MSG_PEEK: not on TLS sockets
            if plain:
                connection.putheader("Expect", "100-continue")
            connection.endheaders()
            if plain and not _continued(connection.sock):
                return _answer(url, connection)  # refused, or there already: not a byte of the body sent
            with upload.open() as body:
                left = upload.size
                while left > 0 and not _answered_early(connection):
                    chunk = body.read(min(CHUNK, left))
                    if not chunk:
                        raise UploadFailed(upload.path, None, f"the local file ended after {upload.size - left} of "
                                                              f"{upload.size} bytes: it changed while being sent")
                    connection.send(chunk)
                    left -= len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the service may have answered and closed: its answer says why
        return _answer(url, connection)
    except OSError as e:
        raise Unreachable(f"the data service at {url} failed mid-transfer: {e}") from None
    finally:
        connection.close()


def _answer(url: str, connection: http.client.HTTPConnection) -> dict | Refusal:
    try:
        response = connection.getresponse()
    except (OSError, http.client.HTTPException) as e:
        raise Unreachable(f"the data service at {url} did not answer: {e}") from None
    if response.status != 200:
        return _refusal(response)
    try:
        answer = json.loads(response.read(MAX_ERROR_BODY_BYTES) or b"{}")
    except ValueError:
        answer = {}
    return answer if isinstance(answer, dict) else {}


def _continued(sock: socket.socket) -> bool:
    """After `Expect: 100-continue`: True to send the body (the service said 100 Continue, consumed here, or said
    nothing within CONTINUE_SECONDS, as curl does); False when its final answer came instead (it refused the
    upload, or holds those bytes already): the body is not sent at all."""
    if not select.select([sock], [], [], CONTINUE_SECONDS)[0]:
        return True
    seen = b""
    for _ in range(64):  # an interim answer is one short line and a blank one: a few reads at most
        seen = sock.recv(MAX_INTERIM_BYTES, socket.MSG_PEEK)
        if not seen.startswith(b"HTTP/1.1 100"[:len(seen)]) or not seen:
            return False
        end = seen.find(b"\r\n\r\n")
        if end >= 0:
            sock.recv(end + 4)  # what was peeked is there: one read takes it
            return True
        if len(seen) >= MAX_INTERIM_BYTES:
            return False  # no interim answer is that long: let the response parser say what it is
        time.sleep(0.005)  # the rest of the line is on its way (the socket stays readable meanwhile)
    return False


def upload(url: str, token: str, file: Upload, *, attempts: int = ATTEMPTS,
           sleep: Callable[[float], None] | None = None) -> dict:
    """PUT one file to the data service (content-addressed: a file already there is answered at once). Raises
    InputTooLarge when the service refuses its size, UploadFailed for any other failure, naming the file."""
    sleep = sleep or time.sleep
    for attempt in range(1, attempts + 1):
        try:
            answer = _put_once(url, token, file)
        except Unreachable as e:
            if attempt == attempts:
                raise UploadFailed(file.path, None, f"{e}; {REACH_ADVICE}") from None
            sleep(min(2.0 ** attempt, MAX_RETRY_AFTER_SECONDS))
            continue
        if isinstance(answer, dict):
            return answer
        if answer.status == 413:
            raise InputTooLarge(file.path, file.size, f"the data service refused it ({answer.reason}): "
                                                      f"{answer.message}")
        if answer.retriable and attempt < attempts:
            sleep(min(answer.retry_after or 2.0 ** attempt, MAX_RETRY_AFTER_SECONDS))
            continue
        advice = {401: "; the upload grant is no longer valid (the run stopped waiting for its uploads): create "
                       "the run again",
                  400: "; the bytes sent were not the ones hashed: the local file changed while being sent, run again",
                  }.get(answer.status, "" if answer.status < 500 else "; the data service failed: try again later")
        raise UploadFailed(file.path, answer.reason, f"{answer.status} {answer.message}{advice}",
                           status=answer.status)
    raise AssertionError("unreachable")


def download(grant: DataGrant, run: str, artifact: Artifact, sink: BinaryIO) -> Refusal | None:
    """GET one stored artifact into `sink`, checking as it streams that it is exactly the bytes the run recorded
    (never more than the recorded size is read). None when written; the Refusal when the service refused it
    (the caller may retry with a fresh grant); ArtifactUnavailable for anything else."""
    try:
        connection, prefix = _connect(grant.url)
    except Unreachable as e:
        raise ArtifactUnavailable(run, artifact.name, f"{e}; {REACH_ADVICE}") from None
    try:
        connection.request("GET", f"{prefix}/v1/artifacts/{urllib.parse.quote(artifact.name, safe='/')}",
                           headers={"Authorization": f"Bearer {grant.token}"})
        response = connection.getresponse()
        if response.status != 200:
            return _refusal(response)
        announced = response.headers.get("X-Coderun-Sha256")
        if announced and announced != artifact.sha256:
            raise _mismatch(run, artifact, f"the data service holds sha256 {announced}")
        digest, size = hashlib.sha256(), 0
        while size <= artifact.size:
            chunk = response.read(min(CHUNK, artifact.size + 1 - size))
            if not chunk:
                break
            digest.update(chunk)
            try:
                sink.write(chunk)
            except OSError as e:  # the caller's disk, not the service: said apart
                raise CodeRunError(f"artifact {artifact.name} of run {run}: cannot write it here: "
                                   f"{e.strerror or e}") from None
            size += len(chunk)
        if size != artifact.size or digest.hexdigest() != artifact.sha256:
            raise _mismatch(run, artifact, f"got {'more than ' if size > artifact.size else ''}{size} bytes"
                                           + (f" with sha256 {digest.hexdigest()}" if size == artifact.size else ""))
        return None
    except (OSError, http.client.HTTPException) as e:
        raise ArtifactUnavailable(run, artifact.name, f"the data service at {grant.url} failed mid-transfer: {e}; "
                                                      "try again") from None
    finally:
        connection.close()


def _mismatch(run: str, artifact: Artifact, what: str) -> ArtifactUnavailable:
    return ArtifactUnavailable(run, artifact.name, f"the store no longer holds the bytes the run recorded ({what}; "
                                                   f"recorded {artifact.size} bytes, sha256 {artifact.sha256}): "
                                                   "they were changed after the run; nothing was kept")


def send_uploads(wait: UploadWait, uploads: Sequence[Upload], url: str | None = None) -> list[str]:
    """Upload every file the run waits for (status.upload), one after the other, to `url` (default: the one the
    status names); the paths sent."""
    sent = []
    for file in asked_for(wait, uploads):
        upload(url or wait.url, wait.token, file)
        sent.append(file.path)
    return sent


def fetch(grant: DataGrant | None, run: str, artifact: Artifact, path: str | Path | None,
          url: str | None = None) -> bytes | Path | Refusal:
    """A stored artifact's bytes, or with `path` the file written there (through a temporary file beside it,
    renamed into place only once the bytes are checked: a mismatch leaves no file and an existing file as it
    was). A Refusal when the data service refused the grant: the caller reads the run again for a fresh one."""
    if grant is None:
        raise ArtifactUnavailable(run, artifact.name, "the run's status has no dataGrant to read stored artifacts "
                                                      "with (the operator has not written it yet, or the artifacts "
                                                      "expired with the policy's artifactTTLSeconds)")
    if url:
        grant = grant.model_copy(update={"url": url})
    if path is None:
        buffer = io.BytesIO()
        refusal = download(grant, run, artifact, buffer)
        return refusal or buffer.getvalue()
    return _written(path, lambda handle: download(grant, run, artifact, handle))


def save(path: str | Path, data: bytes) -> Path:
    """An artifact's bytes written to `path` whole or not at all."""
    def write(handle: BinaryIO) -> None:
        handle.write(data)
    written = _written(path, write)
    assert isinstance(written, Path)
    return written


def _written(path: str | Path, write: Callable[[BinaryIO], Refusal | None]) -> Path | Refusal:
    """`write` into a temporary file beside `path`, renamed into place only when it returned None (no refusal)
    and raised nothing: a refused or mismatched artifact leaves no file, and a file already at `path` as it was."""
    target = Path(path)
    try:
        handle = tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", suffix=".part",
                                             delete=False)
    except OSError as e:
        raise CodeRunError(f"cannot write {target}: {e.strerror or e}") from None
    try:
        with handle:
            refusal = write(handle)  # type: ignore[arg-type]
        if refusal is None:
            os.replace(handle.name, target)
            return target
        return refusal
    except OSError as e:
        raise CodeRunError(f"cannot write {target}: {e.strerror or e}") from None
    finally:
        if os.path.exists(handle.name):
            os.unlink(handle.name)


def refused(run: str, artifact: Artifact, refusal: Refusal) -> ArtifactUnavailable:
    advice = {404: "it is gone from the store (expired with the run or the policy's artifactTTLSeconds)",
              401: "the run's grant is no longer valid: the run may have expired",
              403: "the run's grant is no longer valid: the run may have expired"}.get(refusal.status, "try again")
    return ArtifactUnavailable(run, artifact.name, f"the data service answered {refusal.status}"
                                                   + (f" {refusal.reason}" if refusal.reason else "")
                                                   + f": {refusal.message}; {advice}", status=refusal.status)
