"""`coderun mcp` as an MCP host meets it, through the official MCP client (ClientSession).

In process (memory streams) against the fake Kubernetes API, which plays the operator: the tool list, structured
results, images, progress and cancellation. As a subprocess over stdio and streamable HTTP: the handshake and
a readable tool error with no kubeconfig and with a dead API server.
"""
import base64
import hashlib
import os
import socket
import struct
import subprocess
import sys
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.memory import create_client_server_memory_streams

from coderun.mcp_server import MAX_RESOURCE_BYTES, CodeRunTools, LazyClient, build_server
from fake_api import FakeApiServer, write_kubeconfig
from fake_data import EXPIRES, READ_TOKEN, DataService, sha
from mcp.shared.exceptions import MCPError

SRC = Path(__file__).parents[2] / "src"
NAMESPACE = "agents"
SUCCEEDED = {"phase": "Succeeded", "reason": "Completed", "exitCode": 0, "stdout": "42\n", "stdoutBytes": 3,
             "metrics": {"wallMillis": 96, "totalMillis": 2230}, "effectiveLimits": {"timeoutSeconds": 5}}
DEADLINE = 30  # seconds any one session may take; the slowest case (a dead cluster) answers in a few


def png(width: int = 2, height: int = 2) -> bytes:
    """A real PNG written by hand (what a plot would be), so sniffing sees true magic and chunks."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


@pytest.fixture
def api():
    server = FakeApiServer().start()
    yield server
    server.stop()


@pytest.fixture
def kubeconfig(api, tmp_path):
    return api.kubeconfig(tmp_path / "kubeconfig", namespace=NAMESPACE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_kubeconfig(path: Path) -> Path:
    """A kubeconfig whose API server is a localhost port nobody listens on."""
    return write_kubeconfig(path, f"http://127.0.0.1:{free_port()}")


def in_process(kubeconfig, steps, progress_seconds=10.0):
    """Serve the tools over memory streams and run `steps(session)` with the official client."""
    # The policy lookup gets the whole deadline: this machine may be busy, and a fallback here is a test's failure.
    client = LazyClient(kubeconfig=str(kubeconfig))
    tools = CodeRunTools(client, progress_seconds, DEADLINE)
    server = build_server(tools)

    async def main():
        with anyio.fail_after(DEADLINE):
            async with create_client_server_memory_streams() as (client_streams, server_streams):
                async with anyio.create_task_group() as group:
                    group.start_soon(server.run, *server_streams, server.create_initialization_options())
                    async with ClientSession(*client_streams) as session:
                        await session.initialize()
                        value = await steps(session)
                    group.cancel_scope.cancel()
            await tools.close()  # as serve() does when the connection ends
            await client.close()
        return value
    return anyio.run(main)


def only_run(api):
    (namespace, name), = api.runs
    return namespace, name


def store_artifacts(api, run, artifacts):
    """Play the runner: each artifact in the run's ConfigMap; returns the status's list of them."""
    config_map = api.config_maps.setdefault((NAMESPACE, f"{run}-artifacts"), {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{run}-artifacts"}, "binaryData": {}})
    listed = []
    for index, (name, data) in enumerate(artifacts.items()):
        config_map["binaryData"][f"artifact-{index}"] = base64.b64encode(data).decode()
        listed.append({"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "configMap": f"{run}-artifacts",
                       "key": f"artifact-{index}"})
    return listed


def finish_on_create(api, status, artifacts=None):
    """Play the operator: each created run ends at once with `status` (and its artifacts)."""
    def on_create(obj):
        listed = store_artifacts(api, obj["metadata"]["name"], artifacts or {})
        obj["status"] = {**status, **({"artifacts": listed} if listed else {})}
    api.on_create = on_create


# ---- the tool list
def test_tools_carry_titles_annotations_output_schemas_and_the_policy_limits(api, kubeconfig):
    api.policies[(NAMESPACE, "default")] = {
        "apiVersion": "coderun.io/v1alpha1", "kind": "CodeRunPolicy", "metadata": {"name": "default"},
        "spec": {"defaults": {"timeoutSeconds": 30, "memory": "512Mi"}, "maximums": {"timeoutSeconds": 120}}}

    async def steps(session):
        return {tool.name: tool for tool in (await session.list_tools()).tools}
    tools = in_process(kubeconfig, steps)

    run, runtimes = tools["run_code"], tools["list_runtimes"]
    assert run.title == "Run code in a sandbox" and runtimes.title == "List sandbox runtimes"
    assert (run.annotations.read_only_hint, run.annotations.destructive_hint, run.annotations.idempotent_hint,
            run.annotations.open_world_hint) == (False, False, False, False)
    assert runtimes.annotations.read_only_hint and runtimes.annotations.idempotent_hint
    assert {"run", "outcome", "exitCode", "stdout", "error", "artifacts"} <= set(run.output_schema["properties"])
    assert runtimes.output_schema["properties"]["runtimes"]["type"] == "array"
    properties = run.input_schema["properties"]
    assert (properties["timeout"]["default"], properties["timeout"]["maximum"]) == (30, 120)
    assert properties["memory"]["default"] == "512Mi" and "at most 2Gi (policy default)" in \
        properties["memory"]["description"]
    assert properties["language"]["enum"] == ["javascript", "python"]
    assert run.description.endswith("Policy default: languages javascript, python; no network.")


# ---- results
def test_a_run_comes_back_as_text_and_as_a_structured_result_the_client_validates(api, kubeconfig):
    finish_on_create(api, {"phase": "Failed", "reason": "NonZeroExit", "exitCode": 1, "stderr": "Traceback...\n",
                           "error": {"type": "KeyError", "message": "'b'", "line": 2},
                           "metrics": {"wallMillis": 80, "totalMillis": 1900}})

    async def steps(session):  # call_tool validates structuredContent against the listed outputSchema
        return await session.call_tool("run_code", {"code": "data = {}\nprint(data['b'])\n"})
    result = in_process(kubeconfig, steps)

    assert not result.is_error  # a failed program is a result the model fixes
    assert result.content[0].text.splitlines()[:3] == ["exit code 1 (NonZeroExit)", "error: KeyError at line 2: 'b'",
                                                       "failing line 2: print(data['b'])"]
    structured = result.structured_content
    assert structured["run"] == only_run(api)[1] and structured["namespace"] == NAMESPACE
    assert (structured["phase"], structured["reason"], structured["exitCode"], structured["succeeded"]) == (
        "Failed", "NonZeroExit", 1, False)
    assert structured["error"] == {"type": "KeyError", "message": "'b'", "line": 2}
    assert structured["metrics"] == {"wallMillis": 80, "totalMillis": 1900}
    assert structured["stderr"] == "Traceback...\n" and structured["artifacts"] == []


def test_an_image_artifact_comes_back_as_an_image_and_the_rest_as_names_sizes_and_types(api, kubeconfig):
    plot, huge = png(), b"\x00" * (2 * 1024 * 1024)
    finish_on_create(api, SUCCEEDED, {"plot": plot, "notes.txt": b"mean 4.2\n", "weights.bin": huge,
                                      "fake.png": b"not a png at all"})

    async def steps(session):
        return await session.call_tool("run_code", {"code": "..."})
    result = in_process(kubeconfig, steps)

    images = [block for block in result.content if block.type == "image"]
    assert [(image.mime_type, base64.b64decode(image.data)) for image in images] == [("image/png", plot)]
    texts = [block.resource for block in result.content if block.type == "resource"]
    assert [(t.text, t.mime_type) for t in texts] == [("mean 4.2\n", "text/plain"), ("not a png at all", "image/png")]
    listing = {a["name"]: a for a in result.structured_content["artifacts"]}
    assert listing["plot"] == {"name": "plot", "size": len(plot), "mimeType": "image/png", "shown": "image",
                               "uri": f"coderun://runs/{NAMESPACE}/{only_run(api)[1]}/artifacts/plot"}
    assert listing["weights.bin"]["shown"] == "listed" and "over 1048576 bytes" in listing["weights.bin"]["whyNotShown"]
    assert "weights.bin (2097152 bytes, application/octet-stream; not shown: over 1048576 bytes)" in \
        result.content[0].text


def test_images_past_the_count_are_listed_with_the_reason(api, kubeconfig):
    finish_on_create(api, SUCCEEDED, {f"p{i}.png": png() for i in range(6)})

    async def steps(session):
        return await session.call_tool("run_code", {"code": "..."})
    result = in_process(kubeconfig, steps)
    assert len([block for block in result.content if block.type == "image"]) == 4
    not_shown = [a for a in result.structured_content["artifacts"] if a["shown"] == "listed"]
    assert [a["whyNotShown"] for a in not_shown] == ["more than 4 images"] * 2


def test_stored_artifacts_come_back_as_resource_links_read_with_resources_read_and_skipped_ones_are_named(
        api, kubeconfig):
    csv, big = b"id,total\n" + b"1,2\n" * 300000, b"x" * (MAX_RESOURCE_BYTES + 1)
    inline = {"notes.txt": b"mean 4.2\n"}

    with DataService() as service:
        service.artifacts.update({"out/clean.csv": csv, "big.bin": big})

        def on_create(obj):
            listed = store_artifacts(api, obj["metadata"]["name"], inline)
            listed += [{"name": name, "size": len(data), "sha256": sha(data), "stored": True}
                       for name, data in service.artifacts.items()]
            obj["status"] = {**SUCCEEDED, "artifacts": listed,
                             "dataGrant": {"url": service.url, "token": READ_TOKEN, "expires": EXPIRES},
                             "artifactsSkipped": [{"name": "huge.parquet", "why": "artifact-too-large"}]}
        api.on_create = on_create

        async def steps(session):
            result = await session.call_tool("run_code", {"code": "..."})
            links = {block.name: block for block in result.content if block.type == "resource_link"}
            read = await session.read_resource(links["out/clean.csv"].uri)
            notes = next(a["uri"] for a in result.structured_content["artifacts"] if a["name"] == "notes.txt")
            refusals = []
            for uri in (links["big.bin"].uri, "coderun://elsewhere/x",
                        links["big.bin"].uri.replace("big.bin", "nope.bin")):
                try:
                    await session.read_resource(uri)
                except MCPError as e:
                    refusals.append(e.message)
            templates = (await session.list_resource_templates()).resource_templates
            return result, links, read, await session.read_resource(notes), refusals, templates
        result, links, read, notes, refusals, templates = in_process(kubeconfig, steps)

    run = only_run(api)[1]
    link = links["out/clean.csv"]
    assert (str(link.uri), link.mime_type, link.size) == (
        f"coderun://runs/{NAMESPACE}/{run}/artifacts/out/clean.csv", "text/csv", len(csv))
    assert base64.b64decode(read.contents[0].blob) == csv and read.contents[0].mime_type == "text/csv"
    assert base64.b64decode(notes.contents[0].blob) == b"mean 4.2\n"  # an inline one reads the same way
    listing = {a["name"]: a for a in result.structured_content["artifacts"]}
    assert listing["out/clean.csv"]["shown"] == "link" and listing["out/clean.csv"]["stored"] is True
    assert result.structured_content["artifactsSkipped"] == [{"name": "huge.parquet", "why": "artifact-too-large"}]
    text = result.content[0].text
    assert "1 output file not kept: huge.parquet (artifact-too-large)" in text
    assert f"out/clean.csv ({len(csv)} bytes, text/csv, stored: read it with resources/read)" in text
    assert f"over the {MAX_RESOURCE_BYTES} an MCP answer carries: get it with `coderun artifacts get {run} big.bin" \
        in refusals[0]
    assert refusals[1].startswith("unknown resource 'coderun://elsewhere/x'")
    assert f"run {run} has no artifact 'nope.bin'" in refusals[2]
    assert [t.uri_template for t in templates] == ["coderun://runs/{namespace}/{run}/artifacts/{name}"]
    assert [r[1] for r in service.requests] == ["/v1/artifacts/out/clean.csv"]  # the big one was never fetched


def test_a_refusal_at_admission_is_a_tool_error_naming_the_rule(api, kubeconfig):
    api.refuse_create = lambda body: (403, 'admission webhook "policy.coderun.io" denied the request: '
                                           'ruby is not offered; use python or javascript [runtimes]')

    async def steps(session):
        return await session.call_tool("run_code", {"code": "puts 1", "language": "ruby"})
    result = in_process(kubeconfig, steps)
    assert result.is_error
    assert result.content[0].text == "refused by policy (runtimes): ruby is not offered; use python or javascript"


def test_a_spec_the_api_server_refuses_is_a_tool_error_the_model_can_act_on(api, kubeconfig):
    api.refuse_create = lambda body: (422, "spec: code, stdin and files together must stay under 768 KiB")

    async def steps(session):
        return await session.call_tool("run_code", {"code": "x"})
    result = in_process(kubeconfig, steps)
    assert result.is_error and result.content[0].text.startswith(
        "invalid arguments, refused by the API server: create CodeRun failed: 422 spec: code, stdin and files "
        "together must stay under 768 KiB")


def test_a_malformed_policy_is_named_by_list_runtimes_and_run_code_keeps_its_static_schema(api, kubeconfig):
    api.policies[(NAMESPACE, "default")] = {"metadata": {"name": "default"}, "spec": {"defaults": {"memory": "lots"}}}

    async def steps(session):
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        return tools["run_code"], await session.call_tool("list_runtimes", {})
    run_code, runtimes = in_process(kubeconfig, steps)
    assert runtimes.is_error and runtimes.content[0].text.startswith(
        "the namespace's policy cannot be read: CodeRunPolicy default: spec.defaults.memory")
    assert "The namespace's policy could not be read: CodeRunPolicy default: spec.defaults.memory" in \
        run_code.description


def test_bad_arguments_and_unknown_tools_are_tool_errors(api, kubeconfig):
    async def steps(session):
        return (await session.call_tool("run_code", {"code": "x", "timeout": 0}),
                await session.call_tool("nope", {}))
    invalid, unknown = in_process(kubeconfig, steps)
    assert invalid.is_error and invalid.content[0].text.startswith(
        "invalid arguments: timeout: Input should be greater than or equal to 1")
    assert unknown.is_error and "the tools are run_code and list_runtimes" in unknown.content[0].text
    assert api.runs == {}


# ---- progress and cancellation
def test_a_long_run_reports_progress_on_each_phase_and_between_phases(api, kubeconfig):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, message))
        running = [m for _, m in seen if m.startswith("Running")]
        if message.startswith("Pending") and not running:
            api.finish(*only_run(api), {"phase": "Running"})
        elif len(running) == 3:  # a phase change and two heartbeats in Running: the run may end
            api.finish(*only_run(api), SUCCEEDED)

    async def steps(session):
        return await session.call_tool("run_code", {"code": "...", "timeout": 60}, progress_callback=on_progress)
    result = in_process(kubeconfig, steps, progress_seconds=0.05)

    assert not result.is_error and result.structured_content["stdout"] == "42\n"
    messages = [message for _, message in seen]
    after_creating = next(m for m in messages if not m.startswith("Creating the run"))  # heartbeats may come first
    assert messages[0].startswith("Creating the run") and after_creating.startswith("Pending: waiting for a sandbox")
    assert len([m for m in messages if m.startswith("Running (") and "the program may run 60s" in m]) >= 3
    progress = [p for p, _ in seen]
    assert progress == sorted(progress) and len(set(progress)) == len(progress)


def test_a_cancelled_call_stops_waiting_and_deletes_its_run(api, kubeconfig):
    async def steps(session):
        started = anyio.Event()

        async def on_progress(progress, total, message):
            if message.startswith("Pending"):  # the run exists
                started.set()

        async with anyio.create_task_group() as group:
            async def call():
                await session.call_tool("run_code", {"code": "..."}, progress_callback=on_progress)
                raise AssertionError("the cancelled call answered")
            group.start_soon(call)
            await started.wait()
            group.cancel_scope.cancel()  # the client sends notifications/cancelled for the abandoned call
        return await anyio.to_thread.run_sync(api.wait_until, lambda: not api.runs, DEADLINE)
    assert in_process(kubeconfig, steps, progress_seconds=60) is True
    assert [method for method, path in api.requests if method == "DELETE"] == ["DELETE"]


def test_a_call_cancelled_while_its_create_is_retried_deletes_the_run_the_api_server_stored(api, kubeconfig):
    api.answer_stored_creates_with = 503  # stored, then unanswered: the client retries with backoff

    async def steps(session):
        async with anyio.create_task_group() as group:
            async def call():
                await session.call_tool("run_code", {"code": "..."})
                raise AssertionError("the cancelled call answered")
            group.start_soon(call)
            await anyio.to_thread.run_sync(api.wait_until, lambda: api.runs, DEADLINE)
            group.cancel_scope.cancel()
        api.answer_stored_creates_with = None
        return await anyio.to_thread.run_sync(api.wait_until, lambda: not api.runs, DEADLINE)
    assert in_process(kubeconfig, steps, progress_seconds=60) is True


def test_a_run_deleted_while_the_call_waits_is_a_tool_error(api, kubeconfig):
    async def on_progress(progress, total, message):
        if message.startswith("Pending"):
            api.remove(*only_run(api))

    async def steps(session):
        return await session.call_tool("run_code", {"code": "..."}, progress_callback=on_progress)
    result = in_process(kubeconfig, steps, progress_seconds=60)
    assert result.is_error
    # the wait's first list may find it gone already, or its watch see it deleted
    assert result.content[0].text in ("the run is gone before it finished: the CodeRun was deleted while waiting "
                                      "for it", "the run is gone before it finished: the CodeRun does not exist "
                                                "(deleted, or expired after its TTL)")


# ---- no cluster, a dead cluster: the handshake holds, each call says what to fix
def test_list_runtimes_on_a_dead_api_server_is_a_tool_error_and_run_code_keeps_its_static_schema(tmp_path):
    kubeconfig = dead_kubeconfig(tmp_path / "kubeconfig")

    async def steps(session):
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        return tools, await session.call_tool("list_runtimes", {})
    tools, runtimes = in_process(kubeconfig, steps)
    assert runtimes.is_error and "the API server did not answer" in runtimes.content[0].text
    assert f"tried kubeconfig {kubeconfig}, its current context" in runtimes.content[0].text
    assert "The namespace's policy could not be read" in tools["run_code"].description
    assert "enum" not in tools["run_code"].input_schema["properties"]["language"]


def test_a_kubeconfig_written_after_a_failed_call_is_read_at_the_next(api, tmp_path):
    later = tmp_path / "kubeconfig"

    async def steps(session):
        before = await session.call_tool("list_runtimes", {})
        api.kubeconfig(later, namespace=NAMESPACE)
        return before, await session.call_tool("list_runtimes", {})
    before, after = in_process(later, steps)
    assert before.is_error and not after.is_error
    assert [r["language"] for r in after.structured_content["runtimes"]] == ["javascript", "python"]


@pytest.mark.parametrize("content", ["foo: [\n", "just a line of text\n"])
def test_a_file_that_is_no_kubeconfig_is_a_tool_error_too(tmp_path, content):
    broken = tmp_path / "kubeconfig"
    broken.write_text(content)

    async def steps(session):
        return await session.call_tool("list_runtimes", {})
    result = in_process(broken, steps)
    assert result.is_error and "no usable Kubernetes configuration" in result.content[0].text


def server_env(tmp_path, kubeconfig):
    """What a host passes (command + env): no inherited KUBECONFIG, a HOME without ~/.kube."""
    return {"KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path), "PATH": os.environ["PATH"],
            "PYTHONPATH": str(SRC)}


async def _handshake_and_call(session):
    info = await session.initialize()
    tools = (await session.list_tools()).tools
    return info, tools, await session.call_tool("run_code", {"code": "print(1)"})


def over_stdio(tmp_path, kubeconfig):
    params = StdioServerParameters(command=sys.executable, args=["-m", "coderun.cli", "mcp"],
                                   env=server_env(tmp_path, kubeconfig))

    async def main():
        with anyio.fail_after(DEADLINE), open(tmp_path / "stderr", "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    return await _handshake_and_call(session)
    return anyio.run(main)


def test_without_a_kubeconfig_the_handshake_holds_and_a_call_says_what_to_fix(tmp_path):
    missing = tmp_path / "no-such-kubeconfig"
    info, tools, result = over_stdio(tmp_path, missing)
    assert info.server_info.name == "coderun"
    assert {tool.name for tool in tools} == {"run_code", "list_runtimes"}
    assert "The namespace's policy could not be read: no usable Kubernetes configuration" in tools[0].description
    text = result.content[0].text
    assert result.is_error and "no usable Kubernetes configuration" in text
    assert f"tried kubeconfig {missing}, its current context" in text and "KUBECONFIG" in text


def test_with_a_dead_api_server_over_stdio_a_call_answers_with_a_tool_error(tmp_path):
    kubeconfig = dead_kubeconfig(tmp_path / "kubeconfig")
    info, tools, result = over_stdio(tmp_path, kubeconfig)
    assert result.is_error and "failed: the API server did not answer" in result.content[0].text
    assert "Traceback" not in (tmp_path / "stderr").read_text()


def over_http(tmp_path, kubeconfig, steps, *args, after=None):
    """`coderun mcp --transport streamable-http` as a subprocess; `steps(session)` once it listens, and
    `after(steps' value)` once the client has ended its connection (a DELETE), the server still serving."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "coderun.cli", "mcp", "--transport", "streamable-http",
                               "--port", str(port), *args], env=server_env(tmp_path, kubeconfig),
                              stderr=subprocess.PIPE, text=True)

    async def main():
        with anyio.fail_after(DEADLINE):
            while True:  # until uvicorn listens (or the server died: its stderr says why)
                assert server.poll() is None, server.stderr.read()
                try:
                    await (await anyio.connect_tcp("127.0.0.1", port)).aclose()
                    break
                except OSError:
                    await anyio.sleep(0.1)
            async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write):
                async with ClientSession(read, write) as session:
                    value = await steps(session, port) if after else await steps(session)
            return await after(value) if after else value
    try:
        return anyio.run(main)
    finally:
        server.terminate()
        server.wait(timeout=DEADLINE)


def test_with_a_dead_api_server_over_streamable_http_a_call_answers_with_a_tool_error(tmp_path):
    info, tools, result = over_http(tmp_path, dead_kubeconfig(tmp_path / "kubeconfig"), _handshake_and_call)
    assert {tool.name for tool in tools} == {"run_code", "list_runtimes"}
    assert result.is_error and "the API server did not answer" in result.content[0].text


def test_over_streamable_http_a_slow_run_sends_progress_and_its_plot_comes_back_as_an_image(api, kubeconfig,
                                                                                             tmp_path):
    plot, seen = png(), []

    async def on_progress(progress, total, message):
        seen.append(message)
        running = sum(m.startswith("Running") for m in seen)
        if message.startswith("Pending") and not running:
            api.finish(*only_run(api), {"phase": "Running"})
        elif running == 3:
            namespace, name = only_run(api)
            api.finish(namespace, name, {**SUCCEEDED, "artifacts": store_artifacts(api, name, {"plot.png": plot})})

    async def steps(session):
        await session.initialize()
        return await session.call_tool("run_code", {"code": "...", "timeout": 60}, progress_callback=on_progress)
    result = over_http(tmp_path, kubeconfig, steps, "--progress-interval", "0.2")

    assert not result.is_error, result.content[0].text
    assert seen[0].startswith("Creating the run") and sum(m.startswith("Running") for m in seen) >= 3
    images = [block for block in result.content if block.type == "image"]
    assert [(image.mime_type, base64.b64decode(image.data)) for image in images] == [("image/png", plot)]


# ---- the conversation's session
def test_session_calls_of_a_conversation_share_one_session_and_the_server_deletes_it_at_the_end(api, kubeconfig):
    finish_on_create(api, SUCCEEDED)
    seen = {}

    async def steps(session):
        tools = {t.name: t for t in (await session.list_tools()).tools}
        seen["schema"] = tools["run_code"].input_schema["properties"]["session"]
        plain = await session.call_tool("run_code", {"code": "print(1)"})
        first = await session.call_tool("run_code", {"code": "open('a', 'w')", "session": True, "memory": "512Mi"})
        seen["sessions"] = dict(api.sessions)
        second = await session.call_tool("run_code", {"code": "print(open('a').read())", "session": True})
        changed = await session.call_tool("run_code", {"code": "print(1)", "session": True, "cpu": "2"})
        wrong = await session.call_tool("run_code", {"code": "print(1)", "session": "yes"})
        return plain, first, second, changed, wrong
    plain, first, second, changed, wrong = in_process(kubeconfig, steps)

    assert seen["schema"]["type"] == "boolean" and seen["schema"]["default"] is False
    assert not (plain.is_error or first.is_error or second.is_error), (first.content, second.content)
    (key, created), = seen["sessions"].items()
    assert created["spec"]["limits"] == {"memory": "512Mi"} and created["spec"]["idleTimeoutSeconds"] == 900
    specs = {name: obj["spec"] for (_, name), obj in api.runs.items()}
    assert sorted((spec.get("session") or "" for spec in specs.values())) == ["", key[1], key[1]]
    assert all("memory" not in (spec.get("limits") or {}) for spec in specs.values() if spec.get("session"))
    assert changed.is_error and "memory and cpu are the session's" in changed.content[0].text
    assert wrong.is_error and "session must be true or false" in wrong.content[0].text
    assert api.sessions == {}  # the conversation ended: its session is deleted


def test_a_session_that_ended_is_said_and_the_next_session_call_starts_another(api, kubeconfig):
    def on_create(obj):
        if obj["spec"].get("session"):
            api.sessions[(NAMESPACE, obj["spec"]["session"])]["status"] = {
                "phase": "Ended", "reason": "IdleTimeout", "message": "no run for 900 s"}
            obj["status"] = {"phase": "Rejected", "reason": "SessionEnded", "message": "the session has ended"}
    api.on_create = on_create

    async def steps(session):
        first = await session.call_tool("run_code", {"code": "print(1)", "session": True})
        names = set(api.sessions)
        second = await session.call_tool("run_code", {"code": "print(1)", "session": True})
        return first, second, names, set(api.sessions)
    first, second, before, after = in_process(kubeconfig, steps)
    assert first.is_error and "has ended (IdleTimeout): no run for 900 s" in first.content[0].text
    assert "starts a new session" in first.content[0].text
    assert second.is_error and len(before) == 1 and len(after) == 2 and before < after


def test_over_streamable_http_a_connections_session_calls_share_one_session(api, kubeconfig, tmp_path):
    finish_on_create(api, SUCCEEDED)

    async def steps(session):
        await session.initialize()
        for code in ("open('a', 'w')", "print(1)"):
            result = await session.call_tool("run_code", {"code": code, "session": True})
            assert not result.is_error, result.content[0].text
    over_http(tmp_path, kubeconfig, steps)
    first = {obj["spec"]["session"] for obj in api.runs.values()}
    over_http(tmp_path, kubeconfig, steps)  # another server and client: another session
    both = {obj["spec"]["session"] for obj in api.runs.values()}
    assert len(first) == 1 and len(both) == 2 and first < both


def test_over_streamable_http_a_conversation_its_client_ends_deletes_its_session_and_a_refused_delete_does_not(
        api, kubeconfig, tmp_path):
    """Issue 35, item 8: a DELETE /mcp answered 200 left the CodeRunSession (and its 1-CPU pod) for its idle timeout."""
    finish_on_create(api, SUCCEEDED)

    def delete(port):
        request = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", method="DELETE",
                                         headers={"mcp-session-id": "0" * 32})
        try:
            return urllib.request.urlopen(request, timeout=DEADLINE).status
        except urllib.error.HTTPError as e:
            return e.code

    async def steps(session, port):
        await session.initialize()
        result = await session.call_tool("run_code", {"code": "open('a', 'w')", "session": True})
        assert not result.is_error, result.content[0].text
        refused = await anyio.to_thread.run_sync(delete, port)  # a conversation nobody has: the SDK refuses it
        return refused, set(api.sessions)

    async def after(value):
        while api.sessions:  # the client's own DELETE, answered 200: its session goes (within over_http's deadline)
            await anyio.sleep(0.05)
        return value
    refused, before = over_http(tmp_path, kubeconfig, steps, after=after)
    assert refused == 404 and len(before) == 1 and api.sessions == {}


def test_a_conversation_idle_past_its_bound_ends_its_session_and_one_with_a_call_in_flight_does_not(api, kubeconfig):
    def on_create(obj):  # the operator: runs end at once, save the busy conversation's, which waits
        if obj["spec"]["code"] != "wait":
            obj["status"] = dict(SUCCEEDED)
    api.on_create = on_create
    now = [1000.0]
    tools = CodeRunTools(LazyClient(kubeconfig=str(kubeconfig)), 10.0, DEADLINE, clock=lambda: now[0])

    async def report(progress, message):
        pass

    async def main():
        with anyio.fail_after(DEADLINE):
            for conversation in ("http:quiet", "http:busy"):
                result = await tools.call("run_code", {"code": "print(1)", "session": True}, report, conversation)
                assert not result.is_error, result.content[0].text
            async with anyio.create_task_group() as group:
                group.start_soon(tools.call, "run_code", {"code": "wait", "session": True}, report, "http:busy")
                while len(api.runs) < 3:
                    await anyio.sleep(0.02)
                now[0] += 899
                early = await tools.end_idle_conversations(900), set(api.sessions)
                now[0] += 1
                ended = await tools.end_idle_conversations(900), set(api.sessions)
                group.cancel_scope.cancel()
            await tools.close()
            await tools.client.close()
            return early, ended
    (early, before), (ended, after) = anyio.run(main)
    assert early == [] and len(before) == 2
    assert ended == ["http:quiet"] and len(after) == 1 and after < before
