"""A stand-in for coderun's data service (issue 37's contract) on 127.0.0.1, for the runner's tests: it serves a run's
inputs (GET /v1/inputs/<i>) and takes its artifacts (PUT /v1/artifacts/<name>), and misbehaves on request."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import urllib.parse

TOKEN = "d1.test-key.eyJraW5kIjoicnVuIn0.c2lnbmF0dXJl"


class DataStandIn:
    """inputs: the objects by index. input_modes[i] / artifact_mode say how to answer:
    inputs: "ok", "wrong-bytes" (same size, other bytes), "404", "409", "stall-headers" (answers nothing),
    "stall-body" (headers and half the body, then nothing), "cut" (half the body, then the connection closed), "announce-longer" (a Content-Length past the grant's
    size), "chunked-longer" (no length, more bytes than the grant's size);
    artifacts: "ok", "413" (ArtifactTooLarge), "lie" (answers another sha256)."""

    def __init__(self, inputs: list[bytes] | None = None):
        self.inputs = list(inputs or [])
        self.input_modes: dict[int, str] = {}
        self.artifact_mode = "ok"
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        self.stored: dict[str, bytes] = {}
        self.release = threading.Event()  # ends every stall
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def answer(self, status: int, body: dict, extra: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (extra or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                standin.requests.append(("GET", self.path, self.headers.get("Authorization")))
                index = int(self.path.rsplit("/", 1)[1])
                content = standin.inputs[index]
                mode = standin.input_modes.get(index, "ok")
                if mode == "busy-once":  # a burst elsewhere: 503 Busy, then the bytes
                    standin.input_modes[index] = "ok"
                    return self.answer(503, {"reason": "Busy", "message": "busy"}, {"Retry-After": "1"})
                if mode in ("404", "409"):
                    reason = "InputUnavailable" if mode == "404" else "InputMismatch"
                    return self.answer(int(mode), {"reason": reason, "message": f"input {index}: {reason}"})
                if mode == "stall-headers":
                    standin.release.wait(60)
                    return
                if mode == "wrong-bytes":
                    content = bytes(b ^ 0xFF for b in content)
                self.send_response(200)
                self.send_header("X-Coderun-Sha256", hashlib.sha256(standin.inputs[index]).hexdigest())
                if mode == "chunked-longer":
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    body = content + b"x" * 4096
                    self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
                    return
                length = len(content) + (10 if mode == "announce-longer" else 0)
                self.send_header("Content-Length", str(length))
                self.end_headers()
                if mode == "cut":
                    self.wfile.write(content[:len(content) // 2])
                    self.close_connection = True
                    return
                if mode == "stall-body":
                    self.wfile.write(content[:len(content) // 2])
                    self.wfile.flush()
                    standin.release.wait(60)
                    return
                self.wfile.write(content + (b"x" * 10 if mode == "announce-longer" else b""))

            def do_PUT(self):
                name = urllib.parse.unquote(self.path[len("/v1/artifacts/"):])
                standin.requests.append(("PUT", self.path, self.headers.get("Authorization")))
                if standin.artifact_mode == "busy-once":
                    standin.artifact_mode = "ok"
                    self.close_connection = True
                    return self.answer(503, {"reason": "Busy", "message": "busy"},
                                       {"Retry-After": "1", "Connection": "close"})
                if standin.artifact_mode == "413":
                    self.close_connection = True
                    return self.answer(413, {"reason": "ArtifactTooLarge", "message": f"{name}: too large"},
                                       {"Connection": "close"})
                length = int(self.headers["Content-Length"])
                body = self.rfile.read(length)
                standin.stored[name] = body
                digest = hashlib.sha256(body).hexdigest()
                if standin.artifact_mode == "lie":
                    digest = hashlib.sha256(body + b"!").hexdigest()
                self.answer(200, {"name": name, "key": f"runs/ns/uid/artifacts/{name}", "size": len(body),
                                  "sha256": digest})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def data(self, paths: list[str], artifacts_to_store: bool = False) -> dict:
        """run.json's `data` for these inputs at these paths."""
        return {"url": self.url, "token": TOKEN, "artifactsToStore": artifacts_to_store,
                "inputs": [{"path": path, "size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
                           for path, content in zip(paths, self.inputs)]}

    def gets(self) -> list[str]:
        return [path for method, path, _ in self.requests if method == "GET"]

    def __enter__(self) -> "DataStandIn":
        self.thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
