"""AsyncCodeRunClient: the SDK on asyncio, over the kubernetes package's own asyncio API (kubernetes.aio, aiohttp).

A wait holds one watch connection and no thread, so one event loop keeps hundreds of runs in flight (an MCP server,
an agent framework). The logic is the sync client's: both run the same plans (steps.py: waiting.wait_plan,
creating.create_plan) and the same pure helpers; only the performing of a step is awaited here. Cancelling an
awaiting task returns at once and closes its watch connection.

One client per event loop (its aiohttp session belongs to the loop of its first request). Close it with
`await client.close()`, or use it as `async with AsyncCodeRunClient() as client:`.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, Sequence

import aiohttp
from kubernetes.aio import client as aio_client
from kubernetes.aio.client.exceptions import ApiException

from ..api.coderunpolicy import POLICY_PLURAL
from ..api.coderunsession import SESSION_PLURAL
from ..api.models import GROUP, PLURAL, VERSION, CodeRunSpec, InputRef, Limits
from .connection import connect_async, default_namespace
from .creating import create_plan
from .data import AUTH_FAILURES, DATA_URL_ENV, fetch, refused, save, send_uploads
from .deleting import delete_plan
from .errors import CodeRunError, RunNotFound, RunRejected, raise_if_rejected, refused_inputs, upload_failed_for
from .inputs import (UPLOAD_RUN_CODE, FileSource, Upload, input_refs, split_files, upload_of_inline, with_inputs,
                     with_kept)
from .sessions import (SessionInfo, batch_labels, batch_requests, batch_wait_seconds, build_session_body, refused_as_ended,
                       run_in_session_spec, why_over, session_info, session_spec)
from .request import (DEFAULT_NAME_PREFIX, SELF_SUBJECT_REVIEW, RunRequest, build_body, creator_of_review,
                      label_selector, unstated_if_forbidden, verdict_patch)
from .artifacts import artifact_bytes, find_artifact
from .result import RunResult, result_from_object, results_from_list
from .runtimes import RuntimeInfo, runtimes_plan
from .steps import (Create, Delete, Fetch, FetchAll, Get, GetPolicy, NextEvent, OpenWatch, Plan, Sleep, Step, T,
                    advance)
from .waiting import (API_REQUEST_TIMEOUT, DEFAULT_WAIT_SECONDS, DEFAULT_WATCH_SECONDS, WaitStats, api_failures,
                      fetched, listed_items, run_wait_seconds, settled_by, upload_settled, wait_all_outcome,
                      wait_all_plan, wait_outcome, wait_plan, watch_event)

# Connections the client may hold open at once: each wait in flight holds one (its watch).
DEFAULT_MAX_CONNECTIONS = 1000

_NETWORK_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)

AsyncWatch = Callable[[OpenWatch], AsyncIterator[tuple[str, Mapping[str, Any]]]]


class AsyncCodeRunClient:
    """CodeRunClient's API, awaitable: the same constructor arguments and methods.

    >>> async with AsyncCodeRunClient() as client:
    ...     results = await asyncio.gather(*(client.run(f"print({n})") for n in range(100)))
    """

    def __init__(self, namespace: str | None = None, *, kubeconfig: str | None = None, context: str | None = None,
                 api_client: aio_client.ApiClient | None = None, client_name: str = "sdk",
                 watch_seconds: float = DEFAULT_WATCH_SECONDS, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 data_url: str | None = None):
        # The namespace is read now (a missing kubeconfig fails here, as with the sync client); the connection
        # is made at the first request, inside the caller's event loop.
        self.namespace = namespace or ("default" if api_client is not None else default_namespace(kubeconfig, context))
        self.client_name = client_name
        self.watch_seconds = watch_seconds
        self.data_url = data_url or os.environ.get(DATA_URL_ENV) or None
        self._kubeconfig, self._context, self._max_connections = kubeconfig, context, max_connections
        self._api_client = api_client
        self._owns_api_client = api_client is None
        self._connecting = asyncio.Lock()
        self._custom: aio_client.CustomObjectsApi | None = None
        self._core: aio_client.CoreV1Api | None = None
        self._creator: dict[str, str] | None = None
        self._learning = asyncio.Lock()  # one SelfSubjectReview however many creates wait for it

    async def __aenter__(self) -> AsyncCodeRunClient:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session (the client connects again if used after)."""
        if self._owns_api_client and self._api_client is not None:
            api_client, self._api_client, self._custom, self._core = self._api_client, None, None, None
            await api_client.close()

    # ---- the one call an agent needs
    async def run(self, code: str, language: str = "python", *,
                  files: Mapping[str, FileSource] | list | None = None,
                  inputs: Sequence[InputRef | Mapping[str, Any]] | None = None,
                  stdin: str | None = None, limits: Limits | Mapping[str, Any] | None = None,
                  timeout: int | None = None, wait: bool = True, wait_timeout: float | None = None,
                  namespace: str | None = None, labels: Mapping[str, str] | None = None,
                  on_update: Callable[[RunResult], None] | None = None) -> RunResult:
        """CodeRunClient.run, awaitable (local files are hashed and uploaded in a worker thread)."""
        inline, uploads = await asyncio.to_thread(split_files, files, code=code, stdin=stdin)
        request = RunRequest(code=code, language=language, files=inline or None, stdin=stdin, timeout=timeout)
        return await self.submit(request, limits=limits, inputs=inputs, uploads=uploads, wait=wait,
                                 wait_timeout=wait_timeout, namespace=namespace, labels=labels, on_update=on_update)

    async def submit(self, request: RunRequest, *, limits: Limits | Mapping[str, Any] | None = None,
                     inputs: Sequence[InputRef | Mapping[str, Any]] | None = None, uploads: Sequence[Upload] = (),
                     wait: bool = True, wait_timeout: float | None = None, namespace: str | None = None,
                     labels: Mapping[str, str] | None = None,
                     on_update: Callable[[RunResult], None] | None = None) -> RunResult:
        spec = with_inputs(request.to_spec(limits), input_refs(inputs), uploads)
        created = await self.create(spec, namespace=namespace, labels=labels)
        wait_seconds = run_wait_seconds(spec, wait_timeout)
        if uploads:
            try:
                created = await self.send_uploads(created, uploads, timeout=wait_seconds, on_update=on_update)
            except RunRejected:
                raise  # refused by the operator: kept, as any refused run
            except CodeRunError as e:
                await self.delete(created.name, namespace=created.namespace)
                raise upload_failed_for(e, created.name)
        if not wait:
            return created
        return raise_if_rejected(await self.wait(created.name, namespace=created.namespace, timeout=wait_seconds,
                                                 on_update=on_update))

    async def send_uploads(self, created: RunResult, uploads: Sequence[Upload], *,
                           timeout: float = DEFAULT_WAIT_SECONDS,
                           on_update: Callable[[RunResult], None] | None = None) -> RunResult:
        """CodeRunClient.send_uploads, awaitable: the transfers run in a worker thread."""
        if not uploads:
            return created
        seen = await self.wait(created.name, namespace=created.namespace, timeout=timeout, on_update=on_update,
                               until=upload_settled)
        if seen.upload is not None:
            await asyncio.to_thread(send_uploads, seen.upload, uploads, self.data_url)
        return refused_inputs(seen)

    # ---- the building blocks
    async def create(self, spec: CodeRunSpec | RunRequest, *, namespace: str | None = None,
                     labels: Mapping[str, str] | None = None, name: str | None = None,
                     name_prefix: str = DEFAULT_NAME_PREFIX,
                     inputs: Sequence[InputRef | Mapping[str, Any]] | None = None) -> RunResult:
        if isinstance(spec, RunRequest):
            spec = spec.to_spec()
        spec = with_inputs(spec, input_refs(inputs))
        body = build_body(spec, client_name=self.client_name, labels=labels, name=name, name_prefix=name_prefix,
                          creator=await self.creator())
        return self._own(result_from_object(await drive_async(create_plan(body),
                                                              self._performer(namespace or self.namespace))))

    async def get(self, name: str, *, namespace: str | None = None) -> RunResult:
        custom = await self._apis()
        obj = await self._call(f"get CodeRun {name}", custom.get_namespaced_custom_object,
                               GROUP, VERSION, namespace or self.namespace, PLURAL, name)
        return self._own(result_from_object(obj))

    async def wait(self, name: str, *, namespace: str | None = None, timeout: float = DEFAULT_WAIT_SECONDS,
                   on_update: Callable[[RunResult], None] | None = None,
                   stats: WaitStats | None = None,
                   until: Callable[[Mapping[str, Any] | None], bool] | None = None) -> RunResult:
        namespace = namespace or self.namespace
        loop = asyncio.get_running_loop()
        started = loop.time()
        notify = (lambda obj: on_update(result_from_object(obj))) if on_update else None
        plan = wait_plan(name, started + timeout, max_watch_seconds=self.watch_seconds, clock=loop.time,
                         on_update=notify, stats=stats, until=until)
        last, finished = await drive_async(plan, self._performer(namespace), self._watcher(namespace))
        return self._own(wait_outcome(name, namespace, loop.time() - started, last, finished))

    async def wait_for(self, name: str, predicate: Callable[[RunResult], bool], *, namespace: str | None = None,
                       timeout: float = DEFAULT_WAIT_SECONDS) -> RunResult:
        """CodeRunClient.wait_for, awaitable."""
        return await self.wait(name, namespace=namespace, timeout=timeout, until=settled_by(predicate))

    async def wait_all(self, names: Iterable[str], *, namespace: str | None = None,
                       timeout: float = DEFAULT_WAIT_SECONDS, labels: Mapping[str, str] | None = None,
                       stats: WaitStats | None = None) -> list[RunResult]:
        names, namespace = list(names), namespace or self.namespace
        loop = asyncio.get_running_loop()
        started = loop.time()
        plan = wait_all_plan(names, label_selector(self.client_name, labels, True), started + timeout,
                             max_watch_seconds=self.watch_seconds, clock=loop.time, stats=stats)
        last = await drive_async(plan, self._performer(namespace), self._watcher(namespace))
        return [self._own(r) for r in wait_all_outcome(names, namespace, loop.time() - started, last)]

    async def list(self, *, namespace: str | None = None, labels: Mapping[str, str] | None = None,
                   mine: bool = False, all_namespaces: bool = False) -> list[RunResult]:
        custom = await self._apis()
        selector = label_selector(self.client_name, labels, mine)
        if all_namespaces:
            listed = await self._call("list CodeRuns", custom.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                                      label_selector=selector)
        else:
            listed = await self._call("list CodeRuns", custom.list_namespaced_custom_object, GROUP, VERSION,
                                      namespace or self.namespace, PLURAL, label_selector=selector)
        return [self._own(r) for r in results_from_list(listed)]

    async def delete(self, name: str, *, namespace: str | None = None, missing_ok: bool = True) -> bool:
        return await drive_async(delete_plan(name, missing_ok=missing_ok),
                                 self._performer(namespace or self.namespace))

    async def decide(self, name: str, approve: bool, *, namespace: str | None = None) -> RunResult:
        """CodeRunClient.decide, awaitable."""
        patch = verdict_patch(await self.creator(), approve)
        custom = await self._apis()
        obj = await self._call(f"{'approve' if approve else 'reject'} CodeRun {name}",
                               custom.patch_namespaced_custom_object, GROUP, VERSION, namespace or self.namespace,
                               PLURAL, name, patch)
        return self._own(result_from_object(obj))

    async def artifact(self, result: RunResult, name: str, path: str | Path | None = None) -> Any:
        """CodeRunClient.artifact, awaitable (a stored artifact streams in a worker thread)."""
        artifact = find_artifact(result, name)
        if not artifact.stored:
            core = await self._core_api()
            configmap = await self._call(f"read ConfigMap {artifact.config_map}", core.read_namespaced_config_map,
                                         artifact.config_map, result.namespace)
            data = artifact_bytes(artifact, configmap.binary_data)
            return data if path is None else await asyncio.to_thread(save, path, data)
        got = await asyncio.to_thread(fetch, result.data_grant, result.name, artifact, path, self.data_url)
        if not isinstance(got, (bytes, Path)) and got.status in AUTH_FAILURES:  # a grant read long ago: read anew
            fresh = await self.get(result.name, namespace=result.namespace)
            got = await asyncio.to_thread(fetch, fresh.data_grant, result.name, artifact, path, self.data_url)
        if isinstance(got, (bytes, Path)):
            return got
        raise refused(result.name, artifact, got)

    async def artifacts(self, result: RunResult) -> Mapping[str, bytes]:
        names = [a.name for a in result.artifacts or ()]
        return dict(zip(names, await asyncio.gather(*(self.artifact(result, n) for n in names))))

    async def runtimes(self, namespace: str | None = None, policy: str | None = None) -> list[RuntimeInfo]:
        return await drive_async(runtimes_plan(policy), self._performer(namespace or self.namespace))

    # ---- sessions: many runs, one sandbox (docs/sessions.md)
    async def session(self, language: str = "python", *, policy: str | None = None, keep_state: bool = False,
                      limits: Limits | Mapping[str, Any] | None = None, idle_timeout: int | None = None,
                      max_lifetime: int | None = None, namespace: str | None = None,
                      labels: Mapping[str, str] | None = None, name: str | None = None) -> AsyncSession:
        """CodeRunClient.session, awaitable: `async with await client.session() as s: await s.run(...)`."""
        spec = session_spec(language, policy=policy, keep_state=keep_state, limits=limits,
                            idle_timeout=idle_timeout, max_lifetime=max_lifetime)
        namespace = namespace or self.namespace
        body = build_session_body(spec, client_name=self.client_name, labels=labels, name=name,
                                  creator=await self.creator())
        custom = await self._apis()
        created = await self._call("create CodeRunSession", custom.create_namespaced_custom_object,
                                   GROUP, VERSION, namespace, SESSION_PLURAL, body)
        return AsyncSession(self, created["metadata"]["name"], namespace, language)

    async def creator(self) -> dict[str, str]:
        """CodeRunClient.creator, awaitable: who this client is (a SelfSubjectReview, asked once)."""
        async with self._learning:
            if self._creator is None:
                await self._apis()
                # Its models import slowly, as CoreV1Api's: in a thread, so the event loop never stalls on it.
                api = (await asyncio.to_thread(lambda: aio_client.AuthenticationV1Api))(self._api_client)
                try:
                    review = await self._call("learn this client's identity (SelfSubjectReview)",
                                              api.create_self_subject_review, SELF_SUBJECT_REVIEW)
                except CodeRunError as e:
                    self._creator = unstated_if_forbidden(e)
                else:
                    self._creator = creator_of_review(review)
        return self._creator

    # ---- API plumbing
    def _own(self, result: RunResult) -> RunResult:
        """The result, able to read its artifacts through this client (`await result.artifact(name)`)."""
        result._reader = self.artifact
        return result

    async def _apis(self) -> aio_client.CustomObjectsApi:
        """The CodeRun API; the first call connects (once, however many calls wait for it)."""
        if self._custom is None:
            async with self._connecting:
                if self._custom is None:
                    if self._api_client is None:
                        self._api_client = await connect_async(self._kubeconfig, self._context,
                                                               self._max_connections)
                    self._custom = aio_client.CustomObjectsApi(self._api_client)
        return self._custom

    async def _core_api(self) -> aio_client.CoreV1Api:
        """The core API, for artifacts' ConfigMaps only. Importing its models takes seconds: done in a thread,
        at the first artifact, so the event loop never stalls on it."""
        await self._apis()
        if self._core is None:
            self._core = (await asyncio.to_thread(lambda: aio_client.CoreV1Api))(self._api_client)
        return self._core

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with _api_failures(what):
            return await fn(*args, _request_timeout=float(API_REQUEST_TIMEOUT), **kwargs)

    def _performer(self, namespace: str) -> Callable[[Step], Any]:
        """Performs a plan's steps (steps.py) in `namespace`."""
        async def perform(step: Step) -> Any:
            if isinstance(step, Sleep):
                return await asyncio.sleep(step.seconds)
            custom = await self._apis()
            if isinstance(step, Create):
                return await self._call("create CodeRun", custom.create_namespaced_custom_object,
                                        GROUP, VERSION, namespace, PLURAL, step.body)
            if isinstance(step, Get):
                return await self._call(f"get CodeRun {step.name}", custom.get_namespaced_custom_object,
                                        GROUP, VERSION, namespace, PLURAL, step.name)
            if isinstance(step, Delete):
                return await self._call(f"delete CodeRun {step.name}", custom.delete_namespaced_custom_object,
                                        GROUP, VERSION, namespace, PLURAL, step.name,
                                        propagation_policy="Background")
            if isinstance(step, GetPolicy):
                return await self._call(f"get CodeRunPolicy {step.name}", custom.get_namespaced_custom_object,
                                        GROUP, VERSION, namespace, POLICY_PLURAL, step.name)
            if isinstance(step, FetchAll):
                with _api_failures(f"list CodeRuns {step.labels}", waiting=True):
                    listed = await custom.list_namespaced_custom_object(
                        GROUP, VERSION, namespace, PLURAL, label_selector=step.labels,
                        _request_timeout=float(API_REQUEST_TIMEOUT))
                return listed_items(listed)
            assert isinstance(step, Fetch), step
            with _api_failures(f"list CodeRun {step.name}", waiting=True):
                listed = await custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, field_selector=f"metadata.name={step.name}",
                    _request_timeout=float(API_REQUEST_TIMEOUT))
            return fetched(listed)
        return perform

    def _watcher(self, namespace: str) -> AsyncWatch:
        # The watch stream is read here, not with kubernetes.aio.watch.Watch: each Watch builds an ApiClient and
        # so an SSL context (about 30 ms of blocked event loop apiece), which made 300 waits take seconds to start.
        async def watch_from(step: OpenWatch) -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
            custom = await self._apis()
            what = f"watch CodeRun {step.name}"
            with _api_failures(what, waiting=True):
                response = await custom.list_namespaced_custom_object_without_preload_content(
                    GROUP, VERSION, namespace, PLURAL, watch=True, **step.selector(),
                    resource_version=step.resource_version, allow_watch_bookmarks=True,
                    timeout_seconds=max(1, int(step.seconds)),
                    # A connection that goes silent is noticed instead of hanging past the deadline.
                    _request_timeout=float(step.seconds + API_REQUEST_TIMEOUT))
                try:
                    if response.status >= 300:
                        raise ApiException(status=response.status, reason=response.reason,
                                           body=await response.text())
                    async for line in response.content:
                        if line.strip():
                            yield watch_event(what, line)
                finally:
                    response.release()  # closes the connection of an unfinished stream: no watch outlives its wait
        return watch_from


async def drive_async(plan: Plan[T], perform: Callable[[Step], Any], watch: AsyncWatch | None = None) -> T:
    """steps.drive, awaiting: `perform` answers every step but the watch's; `watch` opens event streams."""
    events: AsyncIterator[tuple[str, Mapping[str, Any]]] | None = None
    answer, failure_ = None, None
    try:
        while True:
            done, step = advance(plan, answer, failure_)
            if done:
                return step
            answer, failure_ = None, None
            try:
                if isinstance(step, OpenWatch):
                    await _aclose(events)
                    events = watch(step)
                elif isinstance(step, NextEvent):
                    answer = await anext(events, None)
                else:
                    answer = await perform(step)
            except Exception as e:  # the plan decides what a failed step means
                failure_ = e
    finally:
        await _aclose(events)  # also when the task is cancelled: the watch connection does not outlive it
        plan.close()


async def _aclose(events: AsyncIterator[Any] | None) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose:
        await aclose()


def _api_failures(what: str, *, waiting: bool = False):
    return api_failures(what, ApiException, _NETWORK_ERRORS, waiting=waiting)


class AsyncSession:
    """Session (the sync client's), awaitable."""

    def __init__(self, client: AsyncCodeRunClient, name: str, namespace: str, language: str):
        self.client, self.name, self.namespace, self.language = client, name, namespace, language
        self.uploaded: dict[str, Upload] = {}  # what upload() sent: every later run has it at its path

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.delete()

    async def run(self, code: str, *, files: Mapping[str, FileSource] | list | None = None,
                  inputs: Sequence[InputRef | Mapping[str, Any]] | None = None,
                  stdin: str | None = None, timeout: int | None = None, wait: bool = True,
                  wait_timeout: float | None = None, labels: Mapping[str, str] | None = None,
                  on_update: Callable[[RunResult], None] | None = None) -> RunResult:
        inline, uploads = await asyncio.to_thread(split_files, files, code=code, stdin=stdin)
        return await self._submit(RunRequest(code=code, language=self.language, files=inline or None, stdin=stdin,
                                             timeout=timeout), inputs, uploads, wait, wait_timeout, labels, on_update)

    async def _submit(self, request: RunRequest, inputs: Sequence[InputRef | Mapping[str, Any]] | None,
                      uploads: Sequence[Upload], wait: bool = True, wait_timeout: float | None = None,
                      labels: Mapping[str, str] | None = None,
                      on_update: Callable[[RunResult], None] | None = None) -> RunResult:
        uploads = with_kept(uploads, self.uploaded)
        spec = with_inputs(run_in_session_spec(request, self.name), input_refs(inputs), uploads)
        created = await self._create(spec, labels)
        wait_seconds = run_wait_seconds(spec, wait_timeout)
        if uploads:
            try:
                created = await self.client.send_uploads(created, uploads, timeout=wait_seconds, on_update=on_update)
            except RunRejected:
                raise  # refused by the operator: kept, as any refused run
            except CodeRunError as e:
                await self.client.delete(created.name, namespace=self.namespace)
                raise upload_failed_for(e, created.name)
        if not wait:
            return created
        result = await self.client.wait(created.name, namespace=self.namespace, timeout=wait_seconds,
                                        on_update=on_update)
        over = await self.why_over() if refused_as_ended(result) else None
        if over is not None:
            raise over
        return raise_if_rejected(result)

    async def upload(self, files: Mapping[str, FileSource] | list, timeout: int | None = None) -> RunResult:
        """Session.upload (the sync client's), awaitable."""
        inline, uploads = await asyncio.to_thread(split_files, files, code=UPLOAD_RUN_CODE)
        everything = uploads + [upload_of_inline(f) for f in inline]
        result = await self._submit(RunRequest(code=UPLOAD_RUN_CODE, language=self.language, timeout=timeout),
                                    None, everything)
        if result.phase == "Succeeded":
            self.uploaded.update({u.path: u for u in everything})
        return result

    async def map(self, programs: Iterable[str | RunRequest], *, timeout: int | None = None,
                  wait_timeout: float | None = None, labels: Mapping[str, str] | None = None) -> list[RunResult]:
        """Session.map (the sync client's), awaitable."""
        requests, tagged = batch_requests(programs, self.language, timeout), batch_labels(labels)
        specs = [run_in_session_spec(request, self.name) for request in requests]  # all refused before any is made
        names = []
        for spec in specs:  # one at a time: their creation order is the order they run in
            names.append((await self._create(spec, tagged)).name)
        return await self.client.wait_all(names, namespace=self.namespace, labels=tagged,
                                          timeout=batch_wait_seconds(requests, wait_timeout))

    async def _create(self, spec: CodeRunSpec, labels: Mapping[str, str] | None) -> RunResult:
        try:
            return await self.client.create(spec, namespace=self.namespace, labels=labels)
        except CodeRunError:
            over = await self.why_over()  # the API server refuses a run naming an ended session: say how it ended
            if over is not None:
                raise over from None
            raise

    async def info(self) -> SessionInfo:
        custom = await self.client._apis()
        return session_info(await self.client._call(f"get CodeRunSession {self.name}",
                                                    custom.get_namespaced_custom_object, GROUP, VERSION,
                                                    self.namespace, SESSION_PLURAL, self.name))

    async def why_over(self) -> CodeRunError | None:
        """Why the session takes no more runs (ended, or deleted), or None while it lives."""
        try:
            info = await self.info()
        except RunNotFound:
            info = None
        return why_over(info, self.namespace, self.name)

    async def delete(self) -> bool:
        custom = await self.client._apis()
        try:
            await self.client._call(f"delete CodeRunSession {self.name}", custom.delete_namespaced_custom_object,
                                    GROUP, VERSION, self.namespace, SESSION_PLURAL, self.name,
                                    propagation_policy="Background")
            return True
        except RunNotFound:
            return False
