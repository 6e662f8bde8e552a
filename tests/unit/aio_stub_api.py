"""A stub Kubernetes API server on aiohttp.web, in the test's own event loop, for AsyncCodeRunClient: create, get,
list by name and watch (streamed until timeoutSeconds) for CodeRuns, nothing else. The test plays the operator with
`finish` and scripts create's answers with `create_answers`; asyncio Events tell it when watches open and close,
so tests synchronise on what the server saw, never on sleeps.

Also used by e2e/bench/client_overhead.py to measure the client's own overhead without a cluster.
"""
from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from coderun.api.models import GROUP, KIND, PLURAL, VERSION

PREFIX = f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}"
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


@dataclass
class CreateAnswer:
    """How the stub answers one create: `status` (201 stores and answers the object); `store` stores the object
    before answering an error (the create landed but its answer was lost); `drop` closes the connection
    instead of answering."""
    status: int = 201
    store: bool = False
    drop: bool = False


@dataclass
class StubApi:
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # by name; one namespace is enough
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    create_answers: list[CreateAnswer] = field(default_factory=list)  # then 201s
    posted_names: list[str] = field(default_factory=list)
    open_watches: int = 0
    max_open_watches: int = 0
    on_create: Callable[[str], None] = lambda name: None  # called with each created run's name (a bench's operator)
    user: tuple[str, list[str]] = ("agent-7", ["agents", "system:authenticated"])  # who the client is
    reviews: int = 0  # SelfSubjectReviews asked

    def __post_init__(self) -> None:
        self._changed = asyncio.Condition()
        self._watch_counts: dict[int, asyncio.Event] = {}
        self.watch_closed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""

    # ---- the operator's part, played by a test
    def add(self, name: str, namespace: str = "agents", annotations: dict[str, str] | None = None) -> None:
        self._store("ADDED", {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                              "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {},
                                           "creationTimestamp": "2026-01-01T00:00:00Z"},
                              "spec": {"language": "python", "code": "print(1)"}})

    async def finish(self, *names: str, status: dict[str, Any] | None = None) -> None:
        """Write a terminal status on each run (one MODIFIED event each), and wake the watches once."""
        for name in names:
            obj = copy.deepcopy(self.runs[name])
            obj["status"] = status or {"phase": "Succeeded", "reason": "Completed", "exitCode": 0, "stdout": "1\n"}
            self._store("MODIFIED", obj)
        async with self._changed:
            self._changed.notify_all()

    def watching(self, count: int) -> asyncio.Event:
        """Set once `count` watches are open at the same time."""
        event = self._watch_counts.setdefault(count, asyncio.Event())
        if self.open_watches >= count:
            event.set()
        return event

    def _store(self, event: str, obj: dict[str, Any]) -> None:
        version = len(self.events) + 1
        obj["metadata"]["resourceVersion"] = str(version)
        self.runs[obj["metadata"]["name"]] = obj
        self.events.append((version, event, copy.deepcopy(obj)))

    # ---- serving
    async def start(self) -> StubApi:
        app = web.Application()
        app.router.add_post(PREFIX, self._create)
        app.router.add_get(PREFIX, self._list_or_watch)
        app.router.add_get(PREFIX + "/{name}", self._get)
        app.router.add_post(SELF_SUBJECT_REVIEWS, self._review)
        # A client that goes away cancels its handler: a closed watch is seen at once.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        await self._runner.cleanup()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "stub",
            "clusters": [{"name": "stub", "cluster": {"server": self.url}}],
            "users": [{"name": "stub", "user": {"token": "stub-token"}}],
            "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub", "namespace": "agents"}}]}))
        return path

    async def _review(self, request: web.Request) -> web.StreamResponse:
        """A SelfSubjectReview: the client learns who it is (every create states it)."""
        self.reviews += 1
        return web.json_response({**await request.json(), "status": {"userInfo": {
            "username": self.user[0], "groups": self.user[1]}}}, status=201)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        name = body["metadata"]["name"]
        self.posted_names.append(name)
        answer = self.create_answers.pop(0) if self.create_answers else CreateAnswer()
        if name in self.runs:
            return _status(409, "AlreadyExists", f'{PLURAL}.{GROUP} "{name}" already exists')
        if answer.status == 201 or answer.store:
            obj = copy.deepcopy(body)
            obj["metadata"].update(namespace=request.match_info["namespace"],
                                   creationTimestamp="2026-01-01T00:00:00Z")
            self._store("ADDED", obj)
            self.on_create(name)
        if answer.drop:
            request.transport.close()  # no answer at all: the client sees the connection end
            return web.Response()
        if answer.status != 201:
            return _status(answer.status, "TooManyRequests" if answer.status == 429 else "InternalError",
                           "scripted refusal")
        return web.json_response(self.runs[name], status=201)

    async def _get(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.runs:
            return _status(404, "NotFound", f'{PLURAL}.{GROUP} "{name}" not found')
        return web.json_response(self.runs[name])

    async def _list_or_watch(self, request: web.Request) -> web.StreamResponse:
        name = request.query["fieldSelector"].removeprefix("metadata.name=")
        if request.query.get("watch") not in ("true", "True", "1"):
            items = [self.runs[name]] if name in self.runs else []
            return web.json_response({"kind": f"{KIND}List", "items": items,
                                      "metadata": {"resourceVersion": str(len(self.events))}})
        return await self._watch(request, name, int(request.query.get("resourceVersion") or 0),
                                 float(request.query.get("timeoutSeconds") or 5))

    async def _watch(self, request: web.Request, name: str, since: int, seconds: float) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        self.open_watches += 1
        self.max_open_watches = max(self.max_open_watches, self.open_watches)
        for count, event in self._watch_counts.items():
            if self.open_watches >= count:
                event.set()
        deadline = asyncio.get_running_loop().time() + seconds

        def news() -> list[tuple[int, str, dict[str, Any]]]:
            return [e for e in self.events if e[0] > since and e[2]["metadata"]["name"] == name]

        try:
            while True:
                async with self._changed:
                    try:
                        await asyncio.wait_for(self._changed.wait_for(news),
                                               deadline - asyncio.get_running_loop().time())
                    except TimeoutError:
                        break
                    new = news()
                for version, event_type, obj in new:
                    await response.write(json.dumps({"type": event_type, "object": obj}).encode() + b"\n")
                    since = version
            await response.write_eof()
            return response
        finally:
            self.open_watches -= 1
            self.watch_closed.set()


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                              "reason": reason, "code": code}, status=code)
