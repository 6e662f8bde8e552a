"""A stand-in for coderun's data service (docs/data.md), the half callers meet, on 127.0.0.1 over real HTTP:
PUT /v1/uploads/<sha256> with an upload grant, GET /v1/artifacts/<name> with a read grant, answering as the contract
says (JSON {reason, message} on refusals, X-Coderun-Sha256 on downloads)."""
from __future__ import annotations

import hashlib
import http.server
import json
import threading
import urllib.parse
from typing import Any, Callable

UPLOAD_TOKEN = "d1.k.upload.sig"
READ_TOKEN = "d1.k.read.sig"
EXPIRES = "2026-12-01T00:00:00Z"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class DataService:
    """The data service's caller-facing half: PUT /v1/uploads/<sha256> (upload grant), GET /v1/artifacts/<name>
    (read grant). `upload_mode`: ok, 413 (refused at once, body unread), present (200 at once, body unread).
    `continue_mode`: checked (as the real service: 100 Continue only once the upload will be read), at-once (as
    http.server does by default, before any check), never (an HTTP/1.0-minded server that ignores Expect)."""

    def __init__(self) -> None:
        self.uploads: dict[str, bytes] = {}
        self.artifacts: dict[str, bytes] = {}
        self.requests: list[tuple[str, str, str | None, str | None]] = []  # method, path, Authorization, length
        self.upload_mode = "ok"
        self.continue_mode = "checked"
        self.expects: list[str | None] = []  # each PUT's Expect header
        self.keep_bodies = True  # False: an upload is hashed as it streams and only its size kept (memory flat)
        self.sizes: dict[str, int] = {}
        self.read_tokens = {READ_TOKEN}
        self.on_upload: Callable[[str], None] = lambda digest: None
        service = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle_expect_100(self) -> bool:
                if service.continue_mode == "at-once":
                    return super().handle_expect_100()
                return True  # checked: do_PUT says it when it reads the body; never: not at all

            def answer(self, status: int, body: dict[str, Any], close: bool = False) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if close:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                service.requests.append(("PUT", self.path, self.headers.get("Authorization"),
                                         self.headers.get("Content-Length")))
                service.expects.append(self.headers.get("Expect"))
                digest = self.path.removeprefix("/v1/uploads/")
                if self.headers.get("Authorization") != f"Bearer {UPLOAD_TOKEN}":
                    return self.answer(401, {"reason": "BadGrant", "message": "no upload grant"}, close=True)
                if service.upload_mode == "413":
                    return self.answer(413, {"reason": "InputTooLarge", "message": f"upload {digest} is larger "
                                             "than the policy's maxInputBytes (1048576)"}, close=True)
                if service.upload_mode == "present":
                    return self.answer(200, {"sha256": digest, "size": 0, "key": f"uploads/ns/{digest}"}, close=True)
                if service.continue_mode == "checked" and self.headers.get("Expect") == "100-continue":
                    self.send_response_only(100)
                    self.end_headers()
                left, hashed, kept = int(self.headers["Content-Length"]), hashlib.sha256(), []
                while left:
                    chunk = self.rfile.read(min(left, 1 << 20))
                    if not chunk:
                        return self.answer(400, {"reason": "BodyCutShort", "message": "the body ended early"})
                    hashed.update(chunk)
                    left -= len(chunk)
                    if service.keep_bodies:
                        kept.append(chunk)
                if hashed.hexdigest() != digest:
                    return self.answer(400, {"reason": "InputMismatch", "message": "the bytes differ"})
                size = int(self.headers["Content-Length"])
                service.sizes[digest] = size
                if service.keep_bodies:
                    service.uploads[digest] = b"".join(kept)
                self.answer(200, {"sha256": digest, "size": size, "key": f"uploads/ns/{digest}"})
                service.on_upload(digest)

            def do_GET(self) -> None:
                service.requests.append(("GET", self.path, self.headers.get("Authorization"), None))
                name = urllib.parse.unquote(self.path.removeprefix("/v1/artifacts/"))
                if self.headers.get("Authorization", "").removeprefix("Bearer ") not in service.read_tokens:
                    return self.answer(401, {"reason": "GrantExpired", "message": "the grant expired"})
                if name not in service.artifacts:
                    return self.answer(404, {"reason": "ArtifactUnavailable", "message": f"no artifact {name}"})
                data = service.artifacts[name]
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("X-Coderun-Sha256", sha(data))
                self.end_headers()
                view = memoryview(data)
                for start in range(0, len(data), 1 << 20):  # in chunks, as the service streams
                    self.wfile.write(view[start:start + (1 << 20)])

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def puts(self) -> list[tuple[str, str, str | None, str | None]]:
        return [r for r in self.requests if r[0] == "PUT"]

    def __enter__(self) -> DataService:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
