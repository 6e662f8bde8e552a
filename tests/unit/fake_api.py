"""A fake Kubernetes API server for CodeRuns over real HTTP, so the SDK and the CLI are tested through their own
kubeconfig loading, requests and watches (fake_k8s.py stands in for the operator's seam instead).

It keeps CodeRuns in memory and answers create (generateName), get, list (label and field selectors, one
namespace or all), watch (events after a resourceVersion, streamed as they happen until timeoutSeconds) and
delete, a merge patch of a run's annotations, a SelfSubjectReview (answering `user`), with the API server's
Status bodies on refusals; it reads the CodeRunPolicies and ConfigMaps a test puts
in `policies` and `config_maps`. A test plays the operator: `finish(ns, name, status)` writes a status (a
MODIFIED event), `refuse_create` answers a create the way an admission webhook or the schema would.
"""
from __future__ import annotations

import copy
import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from coderun.api.coderunpolicy import POLICY_PLURAL
from coderun.api.coderunsession import SESSION_PLURAL
from coderun.api.models import GROUP, KIND, PLURAL, VERSION

PREFIX = f"/apis/{GROUP}/{VERSION}"
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


# What a watch streams each event through (one chunk of the HTTP answer).
Stream = Callable[[dict[str, Any]], None]


class FakeApiServer:
    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], dict[str, Any]] = {}
        self.sessions: dict[tuple[str, str], dict[str, Any]] = {}  # CodeRunSessions: create, get, delete
        self.events: list[tuple[int, str, dict[str, Any]]] = []  # (resourceVersion, type, object)
        self.requests: list[tuple[str, str]] = []  # (method, path with query)
        self.user: tuple[str, list[str]] = ("agent-7", ["agents", "system:authenticated"])  # who the caller is
        self.refuse_review = False  # RBAC without system:basic-user: the caller may not ask who it is
        # Read-only objects a test sets: CodeRunPolicies and ConfigMaps (artifacts), by (namespace, name)
        self.policies: dict[tuple[str, str], dict[str, Any]] = {}
        self.config_maps: dict[tuple[str, str], dict[str, Any]] = {}
        # create body -> (HTTP status, message) to refuse it, or None to accept
        self.refuse_create: Callable[[dict[str, Any]], tuple[int, str] | None] = lambda body: None
        # called with each created object (under the lock): a test may give it a status at once
        self.on_create: Callable[[dict[str, Any]], None] = lambda obj: None
        self.on_create_session: Callable[[dict[str, Any]], None] = lambda obj: None  # the same, for a session
        # An API server that stores a create and then fails to answer it (a 503 from a proxy in front of it):
        # every create of that name keeps getting this status, so a client retries until it gives up.
        self.answer_stored_creates_with: int | None = None
        self._versions = itertools.count(1)
        self._names = itertools.count(1)
        self._changed = threading.Condition()  # over an RLock: a create stores and notifies under it
        self._stopping = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    def kubeconfig(self, path: Path, namespace: str = "agents") -> Path:
        return write_kubeconfig(path, self.url, namespace)

    # ---- the operator's part, played by a test
    def add(self, namespace: str, name: str, status: dict[str, Any] | None = None,
            labels: dict[str, str] | None = None) -> dict[str, Any]:
        obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
               "metadata": {"name": name, "namespace": namespace, "labels": labels or {},
                            "creationTimestamp": "2026-01-01T00:00:00Z"},
               "spec": {"language": "python", "code": "print(1)"}, **({"status": status} if status else {})}
        with self._changed:
            self._store("ADDED", obj)
        return obj

    def finish(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        with self._changed:
            obj = copy.deepcopy(self.runs[(namespace, name)])
            obj["status"] = status
            self._store("MODIFIED", obj)

    def remove(self, namespace: str, name: str) -> None:
        """Delete a run as someone else would (a DELETED event)."""
        with self._changed:
            self._store("DELETED", copy.deepcopy(self.runs[(namespace, name)]))

    def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until `predicate()` holds over the stored runs (checked on every change), at most `timeout`."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def _store(self, event: str, obj: dict[str, Any]) -> None:
        version = next(self._versions)
        obj["metadata"]["resourceVersion"] = str(version)
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if event == "DELETED":
            self.runs.pop(key, None)
        else:
            self.runs[key] = obj
        self.events.append((version, event, copy.deepcopy(obj)))
        self._changed.notify_all()

    # ---- the API
    def handle(self, method: str, path: str, query: dict[str, str], body: Any,
               stream: Stream) -> tuple[int, Any]:
        parts = path.removeprefix(PREFIX).strip("/").split("/")
        if method == "POST" and path == SELF_SUBJECT_REVIEWS and self.refuse_review:
            return 403, _status(403, "Forbidden", "selfsubjectreviews.authentication.k8s.io is forbidden")
        if method == "POST" and path == SELF_SUBJECT_REVIEWS:
            return 201, {**body, "status": {"userInfo": {"username": self.user[0], "groups": self.user[1]}}}
        readable = self._read_only(path)
        if readable is not None:
            return (200, copy.deepcopy(readable)) if readable else (404, _status(404, "NotFound", f"{path} not found"))
        if not path.startswith(PREFIX):
            return 404, _status(404, "NotFound", f"the server could not find the requested resource ({path})")
        if len(parts) >= 3 and parts[0] == "namespaces" and parts[2] == SESSION_PLURAL:
            return self._session(method, parts[1], parts[3] if len(parts) > 3 else None, body)
        if parts == [PLURAL]:  # every namespace
            return self._list(None, query, stream)
        if len(parts) < 3 or parts[0] != "namespaces" or parts[2] != PLURAL:
            return 404, _status(404, "NotFound", f"the server could not find the requested resource ({path})")
        namespace, name = parts[1], (parts[3] if len(parts) > 3 else None)
        with self._changed:
            if method == "POST" and name is None:
                return self._create(namespace, body)
            if method == "GET" and name is None:
                pass  # a list or a watch, outside the lock
            elif name is None or (namespace, name) not in self.runs:
                return 404, _status(404, "NotFound", f'{PLURAL}.{GROUP} "{name}" not found')
            elif method == "GET":
                return 200, copy.deepcopy(self.runs[(namespace, name)])
            elif method == "DELETE":
                self._store("DELETED", copy.deepcopy(self.runs[(namespace, name)]))
                return 200, _status(200, "", "", status="Success")
            elif method == "PATCH":  # a merge patch of annotations: all the SDK patches (approve, reject)
                run = copy.deepcopy(self.runs[(namespace, name)])
                annotations = run["metadata"].setdefault("annotations", {})
                annotations.update(((body or {}).get("metadata") or {}).get("annotations") or {})
                self._store("MODIFIED", run)
                return 200, copy.deepcopy(run)
        return self._list(namespace, query, stream)

    def _session(self, method: str, namespace: str, name: str | None, body: Any) -> tuple[int, Any]:
        with self._changed:
            if method == "POST" and name is None:
                obj = copy.deepcopy(body)
                obj["metadata"]["namespace"] = namespace
                self.sessions[(namespace, obj["metadata"]["name"])] = obj
                self.on_create_session(obj)
                return 201, copy.deepcopy(obj)
            if name is None or (namespace, name) not in self.sessions:
                return 404, _status(404, "NotFound", f'{SESSION_PLURAL}.{GROUP} "{name}" not found')
            if method == "DELETE":
                del self.sessions[(namespace, name)]
                return 200, _status(200, "", "", status="Success")
            return 200, copy.deepcopy(self.sessions[(namespace, name)])

    def _read_only(self, path: str) -> dict[str, Any] | None:
        """A CodeRunPolicy or ConfigMap GET: the object, {} when absent; None for any other path."""
        for prefix, plural, store in ((PREFIX, POLICY_PLURAL, self.policies),
                                      ("/api/v1", "configmaps", self.config_maps)):
            parts = path.removeprefix(prefix).strip("/").split("/")
            if path.startswith(prefix) and len(parts) == 4 and parts[0] == "namespaces" and parts[2] == plural:
                return store.get((parts[1], parts[3]), {})
        return None

    def _create(self, namespace: str, body: dict[str, Any]) -> tuple[int, Any]:
        refusal = self.refuse_create(body)
        if refusal:
            code, message = refusal
            return code, _status(code, {403: "Forbidden", 422: "Invalid"}.get(code, "Unknown"), message)
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("name", f"{meta.pop('generateName', 'run-')}{next(self._names):05d}")
        meta.update(namespace=namespace, creationTimestamp="2026-01-01T00:00:00Z")
        if self.answer_stored_creates_with:
            if (namespace, meta["name"]) not in self.runs:
                self._store("ADDED", obj)
            return self.answer_stored_creates_with, _status(self.answer_stored_creates_with, "ServiceUnavailable",
                                                            "the server is currently unable to handle the request")
        if (namespace, meta["name"]) in self.runs:
            return 409, _status(409, "AlreadyExists", f'{PLURAL}.{GROUP} "{meta["name"]}" already exists')
        self._store("ADDED", obj)
        self.on_create(obj)
        return 201, copy.deepcopy(self.runs[(namespace, meta["name"])])

    def _list(self, namespace: str | None, query: dict[str, str], stream: Stream) -> tuple[int, Any]:
        def wanted(obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            return (namespace in (None, meta["namespace"]) and _selected(query.get("labelSelector"),
                                                                         meta.get("labels") or {})
                    and _selected(query.get("fieldSelector"), {"metadata.name": meta["name"]}))
        if query.get("watch") in ("true", "1"):
            since, seconds = int(query.get("resourceVersion") or 0), float(query.get("timeoutSeconds") or 5)
            self._watch(since, seconds, wanted, stream)
            return 200, None
        with self._changed:
            items = [copy.deepcopy(o) for o in self.runs.values() if wanted(o)]
            version = str(self.events[-1][0] if self.events else 0)
        return 200, {"apiVersion": f"{GROUP}/{VERSION}", "kind": f"{KIND}List",
                     "metadata": {"resourceVersion": version}, "items": items}

    def _watch(self, since: int, seconds: float, wanted: Callable[[dict[str, Any]], bool], stream: Stream) -> None:
        deadline = threading.Event()

        def end() -> None:
            deadline.set()
            self._notify()
        timer = threading.Timer(seconds, end)
        timer.start()
        try:
            while not deadline.is_set() and not self._stopping:
                with self._changed:
                    new = [(v, t, o) for v, t, o in self.events if v > since and wanted(o)]
                    if not new:
                        self._changed.wait(seconds)
                        continue
                since = new[-1][0]
                for _, event_type, obj in new:
                    stream({"type": event_type, "object": obj})
        finally:
            timer.cancel()

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()


def write_kubeconfig(path: Path, server: str, namespace: str = "agents") -> Path:
    """A kubeconfig with two contexts on `server`: `fake` (namespace `namespace`, current) and `other`
    (namespace `other`)."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {"token": "fake-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}},
                     {"name": "other", "context": {"cluster": "fake", "user": "fake", "namespace": "other"}}],
    }))
    return path


def _selected(selector: str | None, values: dict[str, str]) -> bool:
    """Equality selectors only (`a=b,c=d`), what the SDK sends."""
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        if values.get(key) != value.lstrip("="):
            return False
    return True


def _status(code: int, reason: str, message: str, status: str = "Failure") -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": status, "message": message,
            "reason": reason, "code": code}


def _handler(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked watches need it
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _serve(self, method: str) -> None:
            url = urlsplit(self.path)
            api.requests.append((method, self.path))
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            streaming = query.get("watch") in ("true", "1")
            if streaming:  # chunked, one event a chunk, as the API server sends them
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.close_connection = True

            def stream(event: dict[str, Any]) -> None:
                data = json.dumps(event).encode() + b"\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            try:
                code, answer = api.handle(method, url.path, query, body, stream)
                if streaming:
                    self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                return
            if not streaming:
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

    return Handler
