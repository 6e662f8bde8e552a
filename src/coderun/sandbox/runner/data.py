"""The runner's side of the data plane (run.json `data`): a run's inputs streamed from coderun's data service into the
inputs dir before the program starts, and its artifacts past the inline caps streamed to it once every program
process is dead. Only the standard library (http.client). Every transfer is bounded in time (connect, each read,
and a deadline from the object's size, after which its socket is shut) and in bytes (never past the grant's size).
The run's grant (the token) is sent in a header and nowhere else: never printed, never in a message, never in the
program's environment, argv or files (run.json lives in the input dir the program's mount namespace hides)."""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import json
import os
import re
import stat
import threading
import time
import urllib.parse
from typing import Any, Callable

from .protocol import INPUT_MISMATCH, INPUT_TOO_LARGE, INPUT_UNAVAILABLE

CHUNK = 1024 * 1024
MAX_ERROR_BODY_BYTES = 65536
# A reason the data service answers with (`{"reason": "ArtifactTooLarge", ...}`) becomes a skipped artifact's `why`
# in kebab case; anything else is `store-failed`.
SERVICE_REASON = re.compile(r"^[A-Z][A-Za-z]{0,47}$")
STORE_FAILED = "store-failed"
TEMP_PREFIX = ".coderun-partial-"


@dataclasses.dataclass(frozen=True)
class Bounds:
    """How long one transfer may take: to connect, for each read, and in all (base + size at the slowest rate the
    data service is expected to keep up). A stalled or dripping service ends the transfer, never the run's wait."""
    connect_seconds: float = 10.0
    read_seconds: float = 60.0
    base_seconds: float = 30.0
    bytes_per_second: float = 5e6

    def deadline(self, size: int) -> float:
        return time.monotonic() + self.base_seconds + size / self.bytes_per_second


BOUNDS = Bounds()


class InputFailure(Exception):
    """One input could not be laid out: the program must not start. `message` names the input and what to check;
    it never holds the token."""

    def __init__(self, path: str, reason: str, message: str):
        super().__init__(message)
        self.path, self.reason, self.message = path, reason, message

    def as_frame_field(self) -> dict:
        return {"path": self.path, "reason": self.reason, "message": self.message}


class Transfer:
    """One HTTP exchange with the data service under a deadline: a timer shuts the socket when the deadline
    passes, so no read or write (however slowly the other side drips) outlives it."""

    def __init__(self, service: "DataService", deadline: float, bounds: Bounds):
        self.deadline, self.bounds = deadline, bounds
        self.connection = http.client.HTTPConnection(service.host, service.port,
                                                     timeout=min(bounds.connect_seconds, self.remaining()))
        self.timer = threading.Timer(max(0.0, self.remaining()), self._shut)
        self.timer.daemon = True
        self.expired = False

    def remaining(self) -> float:
        return max(0.001, self.deadline - time.monotonic())

    def _shut(self) -> None:
        self.expired = True
        sock = self.connection.sock
        if sock is not None:
            try:
                sock.shutdown(2)  # socket.SHUT_RDWR: a blocked recv or send returns at once
            except OSError:
                pass

    def __enter__(self) -> "Transfer":
        self.timer.start()
        try:
            self.connection.connect()
            self.pace()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.timer.cancel()
        self.timer.join()
        self.connection.close()

    def pace(self) -> None:
        """Before each read: the per-read timeout, never past the deadline."""
        if self.expired or time.monotonic() >= self.deadline:
            self.expired = True
            raise TimeoutError("the transfer's deadline passed")
        if self.connection.sock is not None:
            self.connection.sock.settimeout(min(self.bounds.read_seconds, self.remaining()))

    def request(self, method: str, path: str, token: str, length: int | None = None, sha256: str | None = None
                ) -> None:
        self.connection.putrequest(method, path, skip_accept_encoding=True)
        self.connection.putheader("Authorization", f"Bearer {token}")
        if sha256 is not None:
            self.connection.putheader("X-Coderun-Sha256", sha256)
        if length is not None:
            self.connection.putheader("Content-Length", str(length))
            self.connection.putheader("Content-Type", "application/octet-stream")
        self.connection.endheaders()


def service_error(response: http.client.HTTPResponse) -> tuple[str, str]:
    """(reason, message) of an answer that is not 200: the service's JSON, bounded, or what the status says."""
    try:
        body = json.loads(response.read(MAX_ERROR_BODY_BYTES))
        reason, message = body.get("reason"), body.get("message")
    except (ValueError, UnicodeDecodeError, RecursionError, AttributeError, OSError, http.client.HTTPException):
        reason, message = None, None
    reason = reason if isinstance(reason, str) and SERVICE_REASON.match(reason) else f"HTTP{response.status}"
    message = message[:512] if isinstance(message, str) else f"HTTP {response.status} {response.reason[:64]}"
    return reason, message


class Busy(Exception):
    """The data service answered 503 Busy (before any byte of the transfer): asked again after its Retry-After."""

    def __init__(self, retry_after: float):
        super().__init__("busy")
        self.retry_after = retry_after


# A busy data service (a burst of runs) is asked again, after its Retry-After, this long at most in all for one
# transfer; the operator's pod deadline leaves it this much (builders/objects.py TRANSFER_BUSY_SECONDS).
BUSY_SECONDS = 60.0


def busy(response: http.client.HTTPResponse, reason: str) -> Busy | None:
    if response.status != 503 or reason != "Busy":
        return None
    after = response.getheader("Retry-After") or ""
    return Busy(min(max(float(after) if after.isdigit() else 2.0, 0.5), 10.0))


def when_not_busy(attempt: Callable[[], Any]) -> Any:
    """attempt(), again after each Busy's Retry-After, for BUSY_SECONDS at most; then the last Busy is raised."""
    waited = 0.0
    while True:
        try:
            return attempt()
        except Busy as b:
            if waited + b.retry_after > BUSY_SECONDS:
                raise
            time.sleep(b.retry_after)  # the service's own word on when to come back
            waited += b.retry_after


class DataService:
    """The data service at run.json's `data.url` (one ready data pod's address), with the run's grant."""

    def __init__(self, data: dict, bounds: Bounds | None = None):
        parts = urllib.parse.urlsplit(data["url"])
        self.host, self.port = parts.hostname, parts.port or 80
        self.token = data["token"]
        self.bounds = bounds or BOUNDS
        self.broken = False  # a store that failed (not refused) once is not asked again within this run

    def fetch(self, index: int, entry: dict, parent_fd: int, temp_name: str) -> None:
        """Stream input `index` into temp_name (created new, never through a symlink) under parent_fd, checking its
        size and sha256 as it comes; InputFailure (the partial file removed) if it does not arrive whole."""
        path, size, pinned = entry["path"], entry["size"], entry["sha256"]
        fd = os.open(temp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=parent_fd)
        try:
            try:
                digest, written = when_not_busy(lambda: self._stream_into(index, entry, fd))
            except Busy:
                raise InputFailure(path, INPUT_UNAVAILABLE, f"input {path!r}: the data service stayed busy for "
                                   f"{BUSY_SECONDS:.0f} s: try again when fewer runs move data") from None
        except BaseException:
            os.close(fd)
            os.unlink(temp_name, dir_fd=parent_fd)
            raise
        whole = written == size and (not pinned or digest == pinned)
        if whole:
            os.fchmod(fd, 0o444)  # read-only however the program sees the dir (confinement.bind_read_only)
        os.close(fd)
        if whole and not pinned:
            entry["sha256"] = digest  # what the frame reports of an input nobody pinned: the bytes as they came
        if not whole:
            os.unlink(temp_name, dir_fd=parent_fd)
            raise InputFailure(path, INPUT_MISMATCH,
                               f"input {path!r}: the data service sent {written} bytes with sha256 {digest}, not the "
                               f"{size} bytes with sha256 {pinned} the run pinned: the object changed since the run "
                               "was created; create the run again (or pin the object's current sha256)")

    def _stream_into(self, index: int, entry: dict, fd: int) -> tuple[str, int]:
        path, size = entry["path"], entry["size"]
        digest, written = hashlib.sha256(), 0
        transfer = None
        try:
            with Transfer(self, self.bounds.deadline(size), self.bounds) as transfer:
                transfer.request("GET", f"/v1/inputs/{index}", self.token)
                response = transfer.connection.getresponse()
                if response.status != 200:
                    reason, message = service_error(response)
                    if (too_busy := busy(response, reason)) is not None:
                        raise too_busy
                    raise InputFailure(path, input_reason(response.status, reason),
                                       f"input {path!r}: the data service answered {reason}: {message}")
                announced = response.getheader("Content-Length")
                if announced is not None and announced.isdigit() and int(announced) > size:
                    raise InputFailure(path, INPUT_TOO_LARGE,
                                       f"input {path!r}: the data service has {int(announced)} bytes, more than the "
                                       f"{size} the run's grant names: the object changed since the run was created")
                if announced is not None and announced.isdigit() and int(announced) < size:
                    raise InputFailure(path, INPUT_MISMATCH,
                                       f"input {path!r}: the data service has {int(announced)} bytes, not the {size} "
                                       "the run's grant names: the object changed since the run was created")
                pin = response.getheader("X-Coderun-Sha256")
                if pin is not None and entry["sha256"] and pin != entry["sha256"]:
                    raise InputFailure(path, INPUT_MISMATCH,
                                       f"input {path!r}: the data service's sha256 {pin[:64]} is not the "
                                       f"{entry['sha256']} the run pinned")
                while True:
                    transfer.pace()
                    chunk = response.read1(min(CHUNK, size - written + 1))  # one byte past the size tells
                    if not chunk:
                        break
                    if written + len(chunk) > size:  # never written past the grant's size
                        raise InputFailure(path, INPUT_TOO_LARGE,
                                           f"input {path!r}: the data service sent more than the {size} bytes "
                                           "the run's grant names")
                    write_all(fd, chunk)
                    digest.update(chunk)
                    written += len(chunk)
                if transfer.expired:  # the deadline shut the socket: what ended the body was not the service
                    raise TimeoutError("the transfer's deadline passed")
                if response.length:  # the body ended before its Content-Length
                    raise http.client.IncompleteRead(b"", response.length)
        except InputFailure:
            raise
        except (OSError, http.client.HTTPException) as exc:
            raise InputFailure(path, INPUT_UNAVAILABLE,
                               f"input {path!r}: the data service at {self.host}:{self.port} could not be read "
                               f"({transfer_failure(exc, transfer)}) after {written} of {size} bytes") from None
        return digest.hexdigest(), written

    def store(self, name: str, fd: int, size: int) -> dict | str:
        """PUT the artifact open at fd (size bytes, from its start) to the data service: its frame entry, or the
        `why` of a skipped one. The bytes are hashed as they go; the service's answer must agree. A service that
        refuses the artifact may answer before the body is sent, and close: its answer is read even so. A busy
        one is asked again (when_not_busy)."""
        if self.broken:
            return STORE_FAILED
        try:
            return when_not_busy(lambda: self._store(name, fd, size))
        except Busy:
            return "busy"

    def _store(self, name: str, fd: int, size: int) -> dict | str:
        digest, sent = hashlib.sha256(), 0
        try:
            # read once to name its hash up front (the store then takes it as the object's metadata at once, no
            # copy afterwards), once more as it is sent: the two must agree
            declared = hashlib.sha256()
            for offset in range(0, size, CHUNK):
                declared.update(os.pread(fd, min(CHUNK, size - offset), offset))
            with Transfer(self, self.bounds.deadline(size), self.bounds) as transfer:
                transfer.request("PUT", "/v1/artifacts/" + urllib.parse.quote(name, safe="/"), self.token, size,
                                 declared.hexdigest())
                try:
                    while sent < size:
                        transfer.pace()
                        chunk = os.pread(fd, min(CHUNK, size - sent), sent)
                        if not chunk:  # the file shrank: an honest length can no longer be sent
                            raise OSError("the artifact shrank while it was sent")
                        transfer.connection.send(chunk)
                        digest.update(chunk)
                        sent += len(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # an early answer, read below (none: an HTTPException)
                transfer.pace()
                response = transfer.connection.getresponse()
                if response.status != 200:
                    reason, _ = service_error(response)
                    if (too_busy := busy(response, reason)) is not None:
                        raise too_busy
                    return kebab(reason) if SERVICE_REASON.match(reason) else STORE_FAILED
                answer = json.loads(response.read(MAX_ERROR_BODY_BYTES))
        except (OSError, http.client.HTTPException, ValueError, UnicodeDecodeError, RecursionError):
            self.broken = True
            return STORE_FAILED
        local = digest.hexdigest()
        if sent != size or local != declared.hexdigest() or not isinstance(answer, dict) or \
                answer.get("sha256") != local or answer.get("size") != size:
            return STORE_FAILED
        return {"name": name, "size": size, "sha256": local, "stored": True}


def write_all(fd: int, chunk: bytes) -> None:
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view):]


def input_reason(status: int, service_reason: str) -> str:
    if status == 409 or service_reason == INPUT_MISMATCH:
        return INPUT_MISMATCH
    if status == 413 or service_reason == INPUT_TOO_LARGE:
        return INPUT_TOO_LARGE
    return INPUT_UNAVAILABLE


def transfer_failure(exc: BaseException, transfer: Transfer | None) -> str:
    """What went wrong, in words that carry nothing of the request (the token is in its headers)."""
    if isinstance(exc, TimeoutError) or (transfer is not None and transfer.expired):
        return "it did not answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, http.client.IncompleteRead):
        return "the body ended early"
    return type(exc).__name__


def kebab(reason: str) -> str:
    """ArtifactTooLarge -> artifact-too-large."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", reason).lower()


# The inputs dir: what the runner has laid out there, and how


@dataclasses.dataclass(frozen=True)
class HeldInput:
    """An input laid out in the inputs dir: its pin, and the file's identity when laid out, so a file changed
    since (which the program's read-only view should make impossible) is fetched again, never trusted."""
    sha256: str
    identity: tuple


def identity(info: os.stat_result) -> tuple:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, stat.S_IMODE(info.st_mode))


def open_parent(root_fd: int, relative: str) -> int:
    """A descriptor of relative's parent dir under root_fd, made as needed, never through a symlink."""
    fd = os.dup(root_fd)
    for part in relative.split("/")[:-1]:
        try:
            os.mkdir(part, 0o755, dir_fd=fd)
        except FileExistsError:
            pass
        try:
            next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)
        fd = next_fd
    return fd


def remove_stale(inputs_dir: str, held: dict[str, HeldInput], keep: set[str]) -> None:
    """Take out of the inputs dir what an earlier run of the session held and this run does not name (the dir is
    sized for one run's inputs), and any dir left empty."""
    for path in [p for p in held if p not in keep]:
        del held[path]
        try:
            os.unlink(os.path.join(inputs_dir, path))
        except FileNotFoundError:
            pass
        parent = os.path.dirname(path)
        while parent:
            try:
                os.rmdir(os.path.join(inputs_dir, parent))
            except OSError:
                break
            parent = os.path.dirname(parent)


def lay_out_inputs(inputs: list[dict], inputs_dir: str, held: dict[str, HeldInput],
                   service: DataService | None) -> None:
    """Every input of the run in the inputs dir, verified; one the session already holds (same path and sha256,
    the file unchanged) is kept, not fetched again. A new one is written under a temporary name, verified, then
    renamed into place (replacing what an earlier run held at that path). InputFailure for the first that fails."""
    remove_stale(inputs_dir, held, {entry["path"] for entry in inputs})
    if not inputs:
        return
    try:
        os.makedirs(inputs_dir, mode=0o755, exist_ok=True)
        root_fd = os.open(inputs_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise InputFailure(inputs[0]["path"], INPUT_UNAVAILABLE,
                           f"the sandbox's inputs dir {inputs_dir} could not be made ({exc.strerror}): its pod has no "
                           "volume for the run's inputs") from None
    try:
        for index, entry in enumerate(inputs):
            path = entry["path"]
            try:
                parent_fd = open_parent(root_fd, path)
            except OSError as exc:
                raise InputFailure(path, INPUT_UNAVAILABLE,
                                   f"input {path!r}: its dir could not be made in the inputs dir ({exc.strerror}): "
                                   "two inputs' paths conflict (a file where the other needs a dir)") from None
            try:
                lay_out_one(index, entry, parent_fd, held, service)
            finally:
                os.close(parent_fd)
    finally:
        os.close(root_fd)


def lay_out_one(index: int, entry: dict, parent_fd: int, held: dict[str, HeldInput],
                service: DataService | None) -> None:
    path, name = entry["path"], os.path.basename(entry["path"])
    kept = held.get(path)
    # (an input nobody pinned is fetched again: the store may hold other bytes under its name by now)
    if kept is not None and entry["sha256"] and kept.sha256 == entry["sha256"]:
        try:
            if identity(os.stat(name, dir_fd=parent_fd, follow_symlinks=False)) == kept.identity:
                return
        except FileNotFoundError:
            pass
    held.pop(path, None)
    assert service is not None  # a run with inputs has its data plane
    temp_name = f"{TEMP_PREFIX}{index}-{os.urandom(6).hex()}"
    service.fetch(index, entry, parent_fd, temp_name)
    try:
        os.rename(temp_name, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    except OSError as exc:  # a dir in its place
        os.unlink(temp_name, dir_fd=parent_fd)
        raise InputFailure(path, INPUT_UNAVAILABLE, f"input {path!r}: could not be put in place in the inputs dir "
                                                    f"({exc.strerror})") from None
    held[path] = HeldInput(entry["sha256"], identity(os.stat(name, dir_fd=parent_fd, follow_symlinks=False)))
