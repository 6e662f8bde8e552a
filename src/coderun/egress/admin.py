"""The proxy pod's admin endpoint, for the operator only: when a run ends it revokes the run's credential here and
fetches what this pod logged of the run. A second container of the proxy pod runs it (`coderun-egress-proxy
admin`), sharing the state directory with squid.

    POST /runs/<uid>/revoke   {"expires": <the token's exp>}   -> 204; the helpers refuse it on its next request,
                                                                 the tunnel relay closes its open tunnels
    GET  /runs/<uid>/log                                      -> 200, the run's JSON lines; X-Coderun-Requests,
                                                                 X-Coderun-Bytes-Sent, X-Coderun-Bytes-Received:
                                                                 what this pod logged; X-Coderun-Dropped: what it
                                                                 could not keep; X-Coderun-Admitted: the requests
                                                                 its acl helper counted, which the log is waited
                                                                 for (LOG_WAIT_SECONDS) to reach (run_logs.py)

Every request needs `Authorization: Bearer <credential.admin_bearer(key)>` for one of the signing keys the proxy
holds, compared in constant time; bodies are small (MAX_BODY_BYTES), headers are bounded by http.server, and a
slow client is cut off (TIMEOUT_SECONDS). The revocation list (the file the helpers watch) is written here,
atomically; entries drop out once the token expired anyway.
"""
from __future__ import annotations

import hmac
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Mapping

from .credential import UID_PATTERN, admin_bearer, read_revocations, render_revocations
from .files import MAX_REVOCATIONS_BYTES, write_atomically
from .run_logs import RunLogs

MAX_BODY_BYTES = 1024
TIMEOUT_SECONDS = 10
# How long a log fetch waits for the log daemon to have logged every request the acl helper admitted for the run
# (its credential is revoked first: the count stops growing); within the operator's END_RUN_SECONDS.
LOG_WAIT_SECONDS = 5
# The longest a revocation is kept: a token never lives longer than its run's deadline (at most an hour of
# program, the start deadline and margins), so an expiry beyond this is a mistake, not a reason to keep it.
MAX_REVOCATION_SECONDS = 24 * 3600
_RUN_PATH = re.compile(r"^/runs/([^/]{1,64})/(log|revoke)$")


class Revocations:
    """The revocation list as a file the helpers watch, kept in memory by its only writer."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        try:  # what this container wrote before it restarted (the emptyDir outlives it)
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read(MAX_REVOCATIONS_BYTES).splitlines()
        except FileNotFoundError:
            lines = []
        now = time.time()
        self._entries = read_revocations(lines, now)
        write_atomically(self.path, render_revocations(self._entries, now))

    def revoke(self, uid: str, expires: int, now: float) -> None:
        with self._lock:
            self._entries[uid] = min(expires, int(now) + MAX_REVOCATION_SECONDS)
            self._entries = {u: e for u, e in self._entries.items() if e > now}
            write_atomically(self.path, render_revocations(self._entries, now))


def authorised(header: str | None, keys: Mapping[str, bytes]) -> bool:
    """A bearer derived from any key the proxy holds (keys rotate); every key is compared, in constant time."""
    if not header or not header.startswith("Bearer "):
        return False
    offered = header.removeprefix("Bearer ").encode()
    return any([hmac.compare_digest(offered, admin_bearer(key).encode()) for key in keys.values()])


def handler(keys: Callable[[], Mapping[str, bytes]], revocations: Revocations, runs: RunLogs,
            revoked: Callable[[str], None] = lambda uid: None) -> type[BaseHTTPRequestHandler]:
    """`revoked(uid)` is told of each revocation once it is written (the tunnel relay closes the run's tunnels)."""
    class Admin(BaseHTTPRequestHandler):
        timeout = TIMEOUT_SECONDS
        protocol_version = "HTTP/1.1"
        server_version = "coderun-egress-admin"
        sys_version = ""

        def do_GET(self):  # noqa: N802 - http.server's name
            uid = self._run("log")
            if uid is None:
                return
            admitted, _ = runs.wait_logged(uid, LOG_WAIT_SECONDS)
            lines, usage = runs.read(uid)
            self._answer(200, lines, {"Content-Type": "application/x-ndjson", "X-Coderun-Requests": str(usage.requests),
                                      "X-Coderun-Admitted": str(admitted),
                                      "X-Coderun-Bytes-Sent": str(usage.bytes_sent),
                                      "X-Coderun-Bytes-Received": str(usage.bytes_received),
                                      "X-Coderun-Dropped": str(usage.dropped)})

        def do_POST(self):  # noqa: N802
            uid = self._run("revoke")
            if uid is None:
                return
            length = self.headers.get("Content-Length", "")
            if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                self._answer(413, b"a revocation is a small JSON object\n")
                return
            try:
                expires = json.loads(self.rfile.read(int(length)))["expires"]
                if not isinstance(expires, int):
                    raise TypeError("expires")
            except (ValueError, TypeError, KeyError):
                self._answer(400, b'the body is {"expires": <seconds since the epoch>}\n')
                return
            revocations.revoke(uid, expires, time.time())
            revoked(uid)
            self._answer(204, b"")

        def _run(self, action: str) -> str | None:
            """The run uid the path names for `action`, once the caller is authorised; else answered already."""
            if not authorised(self.headers.get("Authorization"), keys()):
                self._answer(401, b"unauthorised\n")
                return None
            found = _RUN_PATH.match(self.path)
            if not found or found.group(2) != action or not UID_PATTERN.match(found.group(1)):
                self._answer(404, b"no such endpoint\n")
                return None
            return found.group(1)

        def _answer(self, status: int, body: bytes, headers: Mapping[str, str] = ()) -> None:
            self.send_response(status)
            for name, value in dict(headers).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
            print(f"coderun-egress-admin: {self.address_string()} {format % args}", file=sys.stderr)

    return Admin


def make_server(listen: str, keys: Callable[[], Mapping[str, bytes]], revocations_path: str,
                runs_directory: str, revoked: Callable[[str], None] = lambda uid: None) -> ThreadingHTTPServer:
    """The admin server on `listen` (host:port), bound and not yet serving (serve_forever)."""
    host, _, port = listen.rpartition(":")
    server = ThreadingHTTPServer((host.strip("[]") or "0.0.0.0", int(port)),
                                 handler(keys, Revocations(revocations_path), RunLogs(runs_directory), revoked))
    server.daemon_threads = True
    return server
