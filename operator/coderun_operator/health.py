"""The probes of a replicated operator, served from a thread before kopf starts (a standby never starts kopf).

- `/readyz`: 200 while the process serves, standby or leader: a rolling update must be able to count a new
  standby as ready, or it would wait forever for the old leader to step down.
- `/healthz`: a standby is live; a leader is live when kopf's own liveness endpoint answers (its event loop
  runs), with a grace period while kopf starts.
"""
from __future__ import annotations

import http.server
import threading
import time
import urllib.request
from typing import Any

KOPF_START_GRACE_SECONDS = 60
KOPF_PROBE_TIMEOUT_SECONDS = 5


class Health:
    def __init__(self, kopf_liveness_url: str):
        self.kopf_liveness_url = kopf_liveness_url
        self.leading_since: float | None = None

    def lead(self) -> None:
        self.leading_since = time.monotonic()

    def _kopf_answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.kopf_liveness_url, timeout=KOPF_PROBE_TIMEOUT_SECONDS) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def liveness(self) -> tuple[int, str]:
        if self.leading_since is None:
            return 200, "standby"
        if self._kopf_answers():
            return 200, "leader"
        if time.monotonic() - self.leading_since < KOPF_START_GRACE_SECONDS:
            return 200, "leader, starting"
        return 503, "leader, but kopf's liveness endpoint does not answer"

    def readiness(self) -> tuple[int, str]:
        return 200, "leader" if self.leading_since is not None else "standby"


def serve(port: int, health: Health) -> None:
    probes = {"/healthz": health.liveness, "/readyz": health.readiness}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            probe = probes.get(self.path)
            code, text = probe() if probe else (404, "not found")
            body = text.encode() + b"\n"
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:  # probes every few seconds would flood the log
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
