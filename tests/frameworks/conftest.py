"""The adapters with their real frameworks (make test-frameworks: a venv with coderun's openai-agents, langchain
and llamaindex extras). The SDK runs for real against the unit tier's fake API server over HTTP, which plays
the operator: each created CodeRun is finished at once with `api.status`."""
import asyncio

import pytest

from coderun.client import AsyncCodeRunClient, CodeRunClient
from scripted import SUCCEEDED
from unit.fake_api import FakeApiServer


@pytest.fixture
def api(tmp_path):
    server = FakeApiServer().start()
    server.status = SUCCEEDED
    server.on_create = lambda obj: server.finish(obj["metadata"]["namespace"], obj["metadata"]["name"], server.status)
    server.kubeconfig_path = server.kubeconfig(tmp_path / "kubeconfig")
    yield server
    server.stop()


@pytest.fixture(params=["sync", "async"])
def client(request, api):
    """A CodeRunClient, then an AsyncCodeRunClient, on the fake API server."""
    if request.param == "sync":
        yield CodeRunClient(kubeconfig=str(api.kubeconfig_path))
        return
    client = AsyncCodeRunClient(kubeconfig=str(api.kubeconfig_path))
    yield client
    asyncio.run(client.close())  # its HTTP session, whichever loop the test's framework ran it in


@pytest.fixture
def sync_client(api):
    return CodeRunClient(kubeconfig=str(api.kubeconfig_path))
