"""`coderun mcp`: the run_code and list_runtimes tools over MCP (stdio, or streamable HTTP).

Built on the MCP SDK's low-level Server so each tool's input schema is exactly the one coderun.tools generates
from RunRequest (the SDK's input model), shaped by the namespace's policy, rather than one re-derived from a
function signature.

What a host can rely on:
- The handshake never needs the cluster: the Kubernetes client is made at the first tool call, and a missing
  kubeconfig or a dead API server is a tool error that says what was tried and what to fix, never a protocol
  error.
- A run sends progress (when the call carries a progressToken) on each phase change and every
  `progress_seconds`, so hosts whose request timeout resets on progress keep waiting for a long run.
- A call the client cancels stops waiting at once and deletes its run: nobody will read the result, and a
  run left going would hold a sandbox and a place under the policy's maxConcurrentRuns.
- `run_code` with `session: true` runs in the conversation's own CodeRunSession (docs/sessions.md): the files
  earlier session runs of the same MCP connection wrote are there. The first such call creates it. It is
  deleted (its pod with it) when the conversation ends: over streamable HTTP when the client ends it
  (`DELETE /mcp`, answered 200) or it has gone CONVERSATION_IDLE_SECONDS without a tool call (the SDK forgets
  the HTTP session after as long without a request), and every one when the server stops.
"""
from __future__ import annotations

import asyncio
import base64
import logging
import os
import time
from typing import Any, Awaitable, Callable

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from . import __version__
from .api.models import CodeRunSpec
from .client import AsyncCodeRunClient, CodeRunError, RunRequest, RunResult
from .client.aio import AsyncSession
from .client.sessions import SessionEnded, refused_as_over, run_in_session_spec
from .client.connection import in_cluster
from .client.request import new_run_name
from .client.runtimes import RuntimeInfo
from .client.artifacts import find_artifact
from .client.sync import default_wait_seconds
from .tools import LIST_RUNTIMES, RUN_CODE, TOOL_INPUTS, input_schema, render_result, render_runtimes, \
    tool_description
from .tools.invoke import InvalidToolCall, error_reply, parse_call
from .tools.policy_schema import fallback_description, policy_description, policy_input_schema
from .tools.structured import RunOutput, RuntimesOutput, Shown, artifact_uri, artifacts_line, dump, guessed_type, \
    output_schema, parse_artifact_uri, run_output, show_artifacts, to_read

log = logging.getLogger("coderun.mcp")

INSTRUCTIONS = ("Runs code in an isolated gVisor sandbox on Kubernetes: no network unless the namespace's policy "
                "names hosts (list_runtimes and run_code's description say), no secrets, bounded CPU, "
                "memory and time. Call run_code with a complete program that prints what you need; read the exit "
                "code, the error type and line, and fix the program when it fails. Images the program writes to "
                "$CODERUN_OUTPUT_DIR come back as images; larger files as resource links (resources/read); files "
                "it wrote but the run did not keep are named with why.")
PROGRESS_SECONDS = 10.0       # common hosts time a request out after 60 s unless progress resets the clock
POLICY_LOOKUP_SECONDS = 10.0  # tools/list waits this long for the policy before it offers the static schema
DELETE_ON_CANCEL_SECONDS = 10.0

TITLES = {RUN_CODE: "Run code in a sandbox", LIST_RUNTIMES: "List sandbox runtimes"}
# Hints for hosts (they decide what to ask the user before a call). run_code creates a CodeRun, adds and never
# destroys; the same code twice is two runs; the sandbox has no network unless the namespace's policy grants
# egress, so its world is closed. list_runtimes only reads the policy.
ANNOTATIONS = {
    RUN_CODE: types.ToolAnnotations(title=TITLES[RUN_CODE], read_only_hint=False, destructive_hint=False,
                                    idempotent_hint=False, open_world_hint=False),
    LIST_RUNTIMES: types.ToolAnnotations(title=TITLES[LIST_RUNTIMES], read_only_hint=True, destructive_hint=False,
                                         idempotent_hint=True, open_world_hint=False),
}
OUTPUTS = {RUN_CODE: RunOutput, LIST_RUNTIMES: RuntimesOutput}
STATIC_SCHEMAS = {name: input_schema(model) for name, model in TOOL_INPUTS.items()}
# MCP's run_code has one argument more than the other tool sets: the conversation's session (MCP knows which
# connection a call comes from; a stateless function-calling API does not).
SESSION_ARGUMENT = "session"
STATIC_SCHEMAS[RUN_CODE]["properties"][SESSION_ARGUMENT] = {
    "type": "boolean", "default": False, "title": "Session",
    "description": ("true: run in this conversation's sandbox session, where the files earlier session runs wrote "
                    "in the working directory are still there (each run is still a fresh process; the namespace's "
                    "policy must allow sessions). The first session call starts it, with its memory and cpu; later "
                    "session calls cannot change them.")}
CONVERSATION_IDLE_SECONDS = 900  # a session whose connection went without a word ends by itself
# resources/read returns an artifact's bytes in the answer (base64): up to this, larger ones through the CLI.
MAX_RESOURCE_BYTES = 8 * 1024 * 1024
ARTIFACT_TEMPLATE = types.ResourceTemplate(
    name="artifact", title="A run's artifact", uri_template="coderun://runs/{namespace}/{run}/artifacts/{name}",
    description=("A file a run wrote to $CODERUN_OUTPUT_DIR (run_code's result links the stored ones), checked "
                 f"against the run's sha256; up to {MAX_RESOURCE_BYTES // 1024 // 1024} MiB."))
IDLE_CHECK_SECONDS = 30.0  # how often the HTTP server looks for conversations that went idle

Report = Callable[[float, str], Awaitable[None]]  # (progress, message): a no-op when the call has no token


class LazyClient:
    """The Kubernetes client, made at the first tool call and kept once it is made: the handshake must not
    depend on a kubeconfig, and a kubeconfig that is missing or unreadable is read again at the next call."""

    def __init__(self, namespace: str | None = None, kubeconfig: str | None = None, context: str | None = None):
        self._arguments = (namespace, kubeconfig, context)
        self._client: AsyncCodeRunClient | None = None
        self.where = configuration_tried(kubeconfig, context)

    def get(self) -> AsyncCodeRunClient:
        if self._client is None:
            namespace, kubeconfig, context = self._arguments
            self._client = AsyncCodeRunClient(namespace, kubeconfig=kubeconfig, context=context, client_name="mcp")
        return self._client

    async def close(self) -> None:
        """The client's HTTP session, if a call made one (in the serving event loop, where it must close)."""
        if self._client is not None:
            await self._client.close()


def configuration_tried(kubeconfig: str | None, context: str | None) -> str:
    """Which configuration the client reads, in the words of the person who fixes it."""
    if in_cluster(kubeconfig, context):
        return "the pod's service account (in-cluster)"
    path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    return f"kubeconfig {path}, " + (f"context {context}" if context else "its current context")


CREATING = "Creating"  # the reporter's phase until the API server has the run


def progress_message(phase: str | None, elapsed: float, timeout: int | None) -> str:
    seconds = f"{elapsed:.0f}s"
    if phase == CREATING:
        return f"Creating the run ({seconds})"
    if phase in (None, "", "Pending"):
        return f"Pending: waiting for a sandbox ({seconds})"
    if phase == "Running":
        return f"Running ({seconds}" + (f"; the program may run {timeout}s" if timeout else "") + ")"
    return f"{phase} ({seconds})"


class CodeRunTools:
    """The two tools over one (lazy) client. Handlers below only translate MCP requests into these calls."""

    def __init__(self, client: LazyClient, progress_seconds: float = PROGRESS_SECONDS,
                 policy_lookup_seconds: float = POLICY_LOOKUP_SECONDS, clock: Callable[[], float] = time.monotonic):
        self.client = client
        self.clock = clock
        self.progress_seconds = progress_seconds
        self.policy_lookup_seconds = policy_lookup_seconds
        self._policy_timeout: int | None = None  # the policy's default timeout, once tools/list has read it
        self._sessions: dict[str, AsyncSession] = {}  # conversation (conversation_of) -> its CodeRunSession
        self._creating: dict[str, asyncio.Lock] = {}  # one creation per conversation, however many calls at once
        self._last_call: dict[str, float] = {}  # conversation -> when its last tool call started or ended (clock)
        self._calls: dict[str, int] = {}  # conversation -> its tool calls in flight

    # ---- tools/list
    async def list_tools(self) -> list[types.Tool]:
        runtimes, why = await self._policy_runtimes()
        if runtimes is not None:
            default = runtimes[0].default_limits.get("timeoutSeconds") if runtimes else None
            self._policy_timeout = default if isinstance(default, int) else None
            run_schema = policy_input_schema(STATIC_SCHEMAS[RUN_CODE], runtimes)
            run_description = policy_description(tool_description(RUN_CODE), runtimes)
        else:
            run_schema = STATIC_SCHEMAS[RUN_CODE]
            run_description = fallback_description(tool_description(RUN_CODE), why)
        schemas = {RUN_CODE: run_schema, LIST_RUNTIMES: STATIC_SCHEMAS[LIST_RUNTIMES]}
        descriptions = {RUN_CODE: run_description, LIST_RUNTIMES: tool_description(LIST_RUNTIMES)}
        return [types.Tool(name=name, title=TITLES[name], description=descriptions[name], input_schema=schemas[name],
                           output_schema=output_schema(OUTPUTS[name]), annotations=ANNOTATIONS[name])
                for name in (RUN_CODE, LIST_RUNTIMES)]

    async def _policy_runtimes(self) -> tuple[list[RuntimeInfo] | None, str]:
        """(the policy's runtimes, or None and why they could not be read), bounded in time."""
        with anyio.move_on_after(self.policy_lookup_seconds):
            try:
                return await self.client.get().runtimes(), ""
            except (CodeRunError, ValueError) as e:  # ValueError: a malformed CodeRunPolicy, named
                return None, f"{e} [tried {self.client.where}]"
        return None, (f"the API server did not answer within {self.policy_lookup_seconds:.0f}s "
                      f"[tried {self.client.where}]")

    # ---- tools/call
    async def call(self, name: str, arguments: dict[str, Any], report: Report,
                   conversation: str | None = "stdio") -> types.CallToolResult:
        if conversation is None:
            return await self._call(name, arguments, report, None)
        self._calls[conversation] = self._calls.get(conversation, 0) + 1
        self._last_call[conversation] = self.clock()
        try:
            return await self._call(name, arguments, report, conversation)
        finally:
            self._last_call[conversation] = self.clock()
            self._calls[conversation] -= 1
            if not self._calls[conversation]:
                del self._calls[conversation]

    async def _call(self, name: str, arguments: dict[str, Any], report: Report,
                    conversation: str | None) -> types.CallToolResult:
        arguments = dict(arguments)
        in_session = arguments.pop(SESSION_ARGUMENT, False) if name == RUN_CODE else False
        if not isinstance(in_session, bool):
            return _error(f"invalid arguments: {SESSION_ARGUMENT} must be true or false")
        if in_session and conversation is None:
            return _error(f"{SESSION_ARGUMENT}: true needs a conversation, and this call came without one (streamable "
                          "HTTP without an Mcp-Session-Id); run without session")
        try:
            request = parse_call(name, arguments)
        except InvalidToolCall as e:
            return _error(str(e))
        try:
            client = self.client.get()
            if request is None:
                return await _list_runtimes(client)
            if not in_session:
                return await self._run_code(client, request, request.to_spec(), report)
            session = await self._session_of(client, conversation, request)
            try:
                return await self._run_code(client, request, run_in_session_spec(
                    request.model_copy(update={"memory": None, "cpu": None}), session.name), report, session)
            except CodeRunError as e:
                ended = e if isinstance(e, SessionEnded) else await session.why_over()
                if ended is None:
                    raise
                self._sessions.pop(conversation, None)  # the next session call starts a new one
                return _error(f"{ended}; the next run_code call with session: true starts a new session (the "
                              "files are gone)")
        except CodeRunError as e:
            return _error(error_reply(e, self.client.where).text)

    async def _session_of(self, client: AsyncCodeRunClient, conversation: str,
                          request: RunRequest) -> AsyncSession:
        """The conversation's session, created at its first session call with that call's memory and cpu."""
        async with self._creating.setdefault(conversation, asyncio.Lock()):
            session = self._sessions.get(conversation)
            if session is None:
                limits = {key: value for key, value in (("memory", request.memory), ("cpu", request.cpu)) if value}
                session = self._sessions[conversation] = await client.session(
                    request.language, limits=limits or None, idle_timeout=CONVERSATION_IDLE_SECONDS,
                    labels={"coderun.io/mcp": "conversation"})
                return session
        if request.memory or request.cpu:
            raise CodeRunError("memory and cpu are the session's, set by its first call; leave them out, or run "
                               "without session")
        if request.language != session.language:
            raise CodeRunError(f"this conversation's session runs {session.language}; run {request.language} "
                               "without session")
        return session

    async def end_conversation(self, conversation: str) -> None:
        """Delete the conversation's session, if it has one (its pod goes with it), and forget the conversation.
        After a session being created for it, if one is (else that one would outlive it)."""
        async with self._creating.get(conversation) or asyncio.Lock():
            session = self._sessions.pop(conversation, None)
        self._creating.pop(conversation, None)
        self._last_call.pop(conversation, None)
        if session is not None:
            try:
                await session.delete()
            except CodeRunError as e:
                log.warning("could not delete session %s (its idle timeout will end it): %s", session.name, e)

    async def end_idle_conversations(self, idle_seconds: float = CONVERSATION_IDLE_SECONDS) -> list[str]:
        """End every conversation with no call in flight and none for `idle_seconds` (its session is then ending
        by its own idle timeout, and its HTTP session is forgotten by the SDK: nothing would ever end it here)."""
        now = self.clock()
        idle = [conversation for conversation, last in list(self._last_call.items())
                if conversation not in self._calls and now - last >= idle_seconds]
        for conversation in idle:
            await self.end_conversation(conversation)
        return idle

    async def close(self) -> None:
        for conversation in list(self._sessions):
            await self.end_conversation(conversation)

    async def _run_code(self, client: AsyncCodeRunClient, request: RunRequest, spec: CodeRunSpec,
                        report: Report, session: AsyncSession | None = None) -> types.CallToolResult:
        timeout = request.timeout or self._policy_timeout
        progress = ProgressReporter(report, self.progress_seconds, timeout)
        # A task of its own rather than a task group: the SDK's errors reach call() unwrapped.
        heartbeat = asyncio.create_task(progress.run())
        name = new_run_name()  # known before the create, so a call cancelled while it is retried deletes it too
        try:
            created = await client.create(spec, name=name)
            progress.update(created)
            result = await client.wait(created.name, namespace=created.namespace,
                                       timeout=default_wait_seconds(timeout), on_update=progress.update)
            over = await session.why_over() if session is not None and refused_as_over(result) else None
            if over is not None:
                raise over
        except anyio.get_cancelled_exc_class():
            with anyio.move_on_after(DELETE_ON_CANCEL_SECONDS, shield=True):
                try:
                    await client.delete(name)  # gone already, or never made: nothing to do
                except CodeRunError as e:
                    log.warning("could not delete the cancelled run %s: %s", name, e)
            raise
        finally:
            heartbeat.cancel()
        shown = show_artifacts(result, await _read_artifacts(client, result)) if result.artifacts else Shown()
        text = render_result(result.model_copy(update={"artifacts": None}), request.code)
        content: list[types.ContentBlock] = [_text("\n".join(filter(None, [text, artifacts_line(shown.listing)])))]
        content += [types.ImageContent(data=base64.b64encode(data).decode("ascii"), mime_type=mime)
                    for _, mime, data in shown.images]
        content += [types.EmbeddedResource(resource=types.TextResourceContents(
            uri=artifact_uri(result.namespace, result.name, name), mime_type=mime, text=data))
            for name, mime, data in shown.texts]
        content += [types.ResourceLink(uri=link.uri or "", name=link.name, mime_type=link.mime_type, size=link.size,
                                       description=f"artifact {link.name} of run {result.name}, in the store")
                    for link in shown.links]
        # A failed program is a result the model reads and fixes; is_error marks what editing cannot fix.
        return types.CallToolResult(content=content, structured_content=dump(run_output(result, shown.listing)),
                                    is_error=result.rejected or result.infrastructure_failure)


    # ---- resources/read
    async def read_resource(self, uri: str) -> types.ReadResourceResult:
        """An artifact's bytes by its coderun://runs/... URI (what run_code links), checked against the run's
        record, up to MAX_RESOURCE_BYTES; an MCPError that says what to do otherwise."""
        where = parse_artifact_uri(uri)
        if where is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown resource {uri!r}: the resources are run artifacts, "
                                                 "coderun://runs/NAMESPACE/RUN/artifacts/NAME")
        namespace, run, name = where
        try:
            client = self.client.get()
            result = await client.get(run, namespace=namespace)
            artifact = find_artifact(result, name)
            if artifact.size > MAX_RESOURCE_BYTES:
                raise MCPError(types.INVALID_PARAMS, f"artifact {name} of run {run} is {artifact.size} bytes, over "
                                                     f"the {MAX_RESOURCE_BYTES} an MCP answer carries: get it with "
                                                     f"`coderun artifacts get {run} {name} -n {namespace}`")
            data = await client.artifact(result, name)
        except KeyError as e:
            raise MCPError(types.INVALID_PARAMS, str(e.args[0] if e.args else e)) from None
        except CodeRunError as e:
            raise MCPError(types.INVALID_PARAMS if e.status == 404 else types.INTERNAL_ERROR,
                           f"{e} [tried {self.client.where}]") from None
        return types.ReadResourceResult(contents=[types.BlobResourceContents(
            uri=uri, mime_type=guessed_type(name), blob=base64.b64encode(data).decode("ascii"))])


class ProgressReporter:
    """Reports a run's progress at once (while the API server creates it: a slow API is waited on too), on each
    phase change and every `interval` seconds in between.
    `progress` is the seconds waited: it grows with every notification, as the protocol asks."""

    def __init__(self, report: Report, interval: float, timeout: int | None):
        self._report, self._interval, self._timeout = report, interval, timeout
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()
        self._changed = asyncio.Event()
        self._phase: str | None = CREATING

    def update(self, result: RunResult) -> None:
        """The client's on_update: called on the loop or from the client's worker thread."""
        self._phase = result.phase
        self._loop.call_soon_threadsafe(self._changed.set)

    async def run(self) -> None:
        sent = -1.0
        while True:
            elapsed = round(max(self._loop.time() - self._started, sent + 0.1), 1)
            await self._report(elapsed, progress_message(self._phase, elapsed, self._timeout))
            sent = elapsed
            with anyio.move_on_after(self._interval):
                await self._changed.wait()
            self._changed.clear()


async def _list_runtimes(client: AsyncCodeRunClient) -> types.CallToolResult:
    try:
        runtimes = await client.runtimes()
    except ValueError as e:  # a malformed CodeRunPolicy, named by the client
        return _error(f"the namespace's policy cannot be read: {e}")
    return types.CallToolResult(content=[_text(render_runtimes(runtimes))],
                                structured_content=dump(RuntimesOutput(runtimes=runtimes)))


async def _read_artifacts(client: AsyncCodeRunClient, result: RunResult) -> dict[str, bytes | str]:
    """The bytes of the artifacts worth showing, or why one could not be read (the result stands either way)."""
    read: dict[str, bytes | str] = {}
    for name in to_read(result):
        try:
            read[name] = await client.artifact(result, name)
        except (CodeRunError, KeyError) as e:
            read[name] = str(e)
    return read


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[_text(text)], is_error=True)


def conversation_of(ctx: Any) -> str | None:
    """Which MCP conversation a call belongs to: its streamable-HTTP session (the Mcp-Session-Id header, which the
    server issued); over stdio the process serves one client, so one conversation. None: an HTTP call without
    one (stateless), which shares nothing with any other."""
    request = getattr(ctx, "request", None)
    if request is None:
        return "stdio"
    session_id = request.headers.get("mcp-session-id")
    return f"http:{session_id}" if session_id else None


class EndsConversations:
    """The streamable HTTP app, with the conversation's session deleted when its client ends it: a `DELETE` on
    the MCP path that the SDK answered 200 (a DELETE it refused, for an unknown session or another owner, ends
    nothing). The SDK has no hook for a session's end, so this watches the exchange from outside."""

    def __init__(self, app: Any, tools: CodeRunTools, path: str = "/mcp"):
        self.app, self.tools, self.path = app, tools, path

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "DELETE" or scope.get("path") != self.path:
            await self.app(scope, receive, send)
            return
        session_id = dict(scope.get("headers") or ()).get(b"mcp-session-id", b"").decode("latin-1")
        answered: list[int] = []

        async def watched_send(message: dict) -> None:
            if message.get("type") == "http.response.start":
                answered.append(message.get("status", 0))
            await send(message)
        await self.app(scope, receive, watched_send)
        if session_id and answered == [200]:
            await self.tools.end_conversation(f"http:{session_id}")


async def end_idle_conversations(tools: CodeRunTools, every: float = IDLE_CHECK_SECONDS) -> None:
    while True:
        await anyio.sleep(every)
        await tools.end_idle_conversations()


def build_server(tools: CodeRunTools) -> Server:
    async def on_list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=await tools.list_tools())

    async def on_call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        async def report(progress: float, message: str) -> None:
            await ctx.session.report_progress(progress, None, message)
        return await tools.call(params.name, params.arguments or {}, report, conversation=conversation_of(ctx))

    async def on_list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[])  # artifacts are reached through run_code's links

    async def on_list_resource_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[ARTIFACT_TEMPLATE])

    async def on_read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return await tools.read_resource(str(params.uri))

    return Server("coderun", version=__version__, title="coderun", instructions=INSTRUCTIONS,
                  on_list_tools=on_list_tools, on_call_tool=on_call_tool, get_tool_input_schema=STATIC_SCHEMAS.get,
                  on_list_resources=on_list_resources, on_list_resource_templates=on_list_resource_templates,
                  on_read_resource=on_read_resource)


def serve(transport: str = "stdio", host: str = "127.0.0.1", port: int = 8000, namespace: str | None = None,
          kubeconfig: str | None = None, context: str | None = None,
          progress_seconds: float = PROGRESS_SECONDS) -> None:
    client = LazyClient(namespace, kubeconfig, context)
    tools = CodeRunTools(client, progress_seconds)
    server = build_server(tools)

    async def serve_until_done() -> None:
        try:
            if transport == "stdio":
                async with stdio_server() as (read_stream, write_stream):
                    await server.run(read_stream, write_stream, server.create_initialization_options())
            else:
                import uvicorn
                app = EndsConversations(server.streamable_http_app(
                    host=host, session_idle_timeout=CONVERSATION_IDLE_SECONDS), tools)
                async with anyio.create_task_group() as group:
                    group.start_soon(end_idle_conversations, tools)
                    await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).serve()
                    group.cancel_scope.cancel()
        finally:
            await tools.close()
            await client.close()
    anyio.run(serve_until_done)
