"""AsyncCodeRunClient against a stub API server in the same event loop (aio_stub_api.py): hundreds of waits in
flight at once, cancellation that closes the watch, creates retried without ever making two runs; and the create
plan both clients share, driven with blocking I/O."""
import asyncio
import gc
import json
import time
import warnings

import pytest

from aio_stub_api import CreateAnswer, StubApi
from coderun.client import AsyncCodeRunClient, CodeRunError, RunRequest
from coderun.api.identity import CREATED_BY, CREATED_BY_GROUPS
from coderun.client.creating import create_plan
from coderun.client.request import CREATE_TOKEN_ANNOTATION, build_body
from coderun.client.steps import Create, Get, Sleep, drive

CONCURRENT_WAITS = 300


def in_loop(tmp_path, test):
    """Run `test(stub, client)` with a started stub and a client on it; fail on any unclosed aiohttp session."""
    async def main():
        stub = await StubApi().start()
        try:
            async with AsyncCodeRunClient(kubeconfig=str(stub.kubeconfig(tmp_path / "kubeconfig"))) as client:
                return await test(stub, client)
        finally:
            await stub.stop()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        outcome = asyncio.run(main())
        gc.collect()
    assert not [w for w in caught if "Unclosed" in str(w.message)], [str(w.message) for w in caught]
    return outcome


def test_hundreds_of_waits_are_in_flight_at_once_and_end_together(tmp_path):
    names = [f"run-{n:03d}" for n in range(CONCURRENT_WAITS)]

    async def test(stub, client):
        for name in names:
            stub.add(name)
        waits = [asyncio.create_task(client.wait(name, timeout=60)) for name in names]
        # Every wait holds its watch open at the same time: no pool of threads queues them.
        await asyncio.wait_for(stub.watching(CONCURRENT_WAITS).wait(), 60)
        finished_at = time.monotonic()
        await stub.finish(*names)
        results = await asyncio.gather(*waits)
        return results, time.monotonic() - finished_at, stub.max_open_watches

    results, seconds, most_open = in_loop(tmp_path, test)
    assert most_open == CONCURRENT_WAITS
    assert [r.name for r in results] == names and all(r.succeeded for r in results)
    # From the runs finishing to all 300 results: the client's overhead only (about 0.1 s here), not 300 turns.
    assert seconds < 5, f"{CONCURRENT_WAITS} waits took {seconds:.2f}s after their runs finished"


def test_cancelling_a_wait_returns_at_once_and_closes_its_watch(tmp_path):
    async def test(stub, client):
        stub.add("run-slow")
        waiting = asyncio.create_task(client.wait("run-slow", timeout=600))
        await asyncio.wait_for(stub.watching(1).wait(), 10)
        started = time.monotonic()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        returned = time.monotonic() - started
        await asyncio.wait_for(stub.watch_closed.wait(), 10)  # the server saw the connection go
        return returned, stub.open_watches

    returned, still_open = in_loop(tmp_path, test)
    assert returned < 1 and still_open == 0


@pytest.mark.parametrize("refusals", [[429], [503], [429, 503, 500]])
def test_a_create_refused_with_429_or_5xx_is_retried_and_makes_one_run(tmp_path, refusals):
    async def test(stub, client):
        stub.create_answers = [CreateAnswer(status) for status in refusals]
        created = await client.create(RunRequest(code="print(1)"))
        return created, stub

    created, stub = in_loop(tmp_path, test)
    assert list(stub.runs) == [created.name]
    assert stub.posted_names == [created.name] * (len(refusals) + 1)  # the same client-chosen name each time


@pytest.mark.parametrize("lost", [CreateAnswer(500, store=True), CreateAnswer(store=True, drop=True)],
                         ids=["500 after storing", "connection closed after storing"])
def test_a_create_that_landed_but_lost_its_answer_is_resolved_through_409_to_the_same_run(tmp_path, lost):
    async def test(stub, client):
        stub.create_answers = [lost]
        created = await client.run("print(1)", wait=False)
        return created, stub

    created, stub = in_loop(tmp_path, test)
    assert list(stub.runs) == [created.name] and len(stub.posted_names) == 2
    assert created.labels == {"coderun.io/client": "sdk"}


def test_a_409_for_a_run_this_client_did_not_create_is_an_error(tmp_path):
    async def test(stub, client):
        stub.add("taken", annotations={CREATE_TOKEN_ANNOTATION: "someone-else"})
        with pytest.raises(CodeRunError) as refused:
            await client.create(RunRequest(code="print(1)"), name="taken")
        return refused.value, stub

    error, stub = in_loop(tmp_path, test)
    assert error.status == 409 and "did not create it" in str(error)
    assert stub.runs["taken"]["metadata"]["annotations"][CREATE_TOKEN_ANNOTATION] == "someone-else"


def test_a_refusal_that_retrying_cannot_fix_is_not_retried(tmp_path):
    async def test(stub, client):
        stub.create_answers = [CreateAnswer(422)]
        with pytest.raises(CodeRunError) as refused:
            await client.create(RunRequest(code="print(1)"))
        return refused.value, stub

    error, stub = in_loop(tmp_path, test)
    assert error.status == 422 and len(stub.posted_names) == 1 and stub.runs == {}


# ---- the create plan with blocking I/O (what CodeRunClient runs)
class ScriptedApi:
    """Answers Create from `answers` (an exception, or store-and-answer), Get from what was stored."""

    def __init__(self, *answers):
        self.answers, self.stored, self.slept = list(answers), {}, []

    def perform(self, step):
        if isinstance(step, Sleep):
            return self.slept.append(step.seconds)
        if isinstance(step, Get):
            return self.stored[step.name]
        assert isinstance(step, Create)
        name = step.body["metadata"]["name"]
        answer = self.answers.pop(0) if self.answers else "store"
        if name in self.stored:
            raise CodeRunError("already exists", status=409)
        if answer in ("store", "store then 503"):
            self.stored[name] = step.body
        if answer == "store then 503":
            raise CodeRunError("service unavailable", status=503)
        if isinstance(answer, Exception):
            raise answer
        return step.body


def body():
    return build_body(RunRequest(code="x").to_spec(), client_name="sdk")


def test_the_shared_plan_backs_off_between_attempts_and_gives_up_after_the_last():
    api = ScriptedApi(*[CodeRunError("throttled", status=429)] * 6)
    with pytest.raises(CodeRunError) as refused:
        drive(create_plan(body(), jitter=lambda: 0.0), api.perform)
    assert refused.value.status == 429 and api.stored == {}
    assert api.slept == [0.125, 0.25, 0.5, 1.0, 2.0]  # doubling, halved by zero jitter, then the last attempt


def test_the_shared_plan_adopts_its_own_run_after_a_lost_answer_and_no_one_elses():
    api = ScriptedApi("store then 503")
    mine = body()
    assert drive(create_plan(mine, jitter=lambda: 0.0), api.perform) is mine and len(api.stored) == 1
    foreign = ScriptedApi()
    taken = body()
    foreign.stored[taken["metadata"]["name"]] = {"metadata": {"annotations": {CREATE_TOKEN_ANNOTATION: "other"}}}
    with pytest.raises(CodeRunError, match="did not create it"):
        drive(create_plan(taken), foreign.perform)
    # Someone who may read runs copies the token onto a run of their own made again under the name: not ours.
    swapped = ScriptedApi()
    sent = body()
    copy = {"metadata": dict(sent["metadata"]), "spec": {**sent["spec"], "code": "print('forged')"}}
    swapped.stored[sent["metadata"]["name"]] = copy
    with pytest.raises(CodeRunError, match="did not create it"):
        drive(create_plan(sent), swapped.perform)
    # The API server's defaults beside what was sent do not make it someone else's.
    defaulted = ScriptedApi()
    defaulted.stored[sent["metadata"]["name"]] = {"metadata": dict(sent["metadata"]),
                                                   "spec": {**sent["spec"], "cache": {"enabled": False}}}
    assert drive(create_plan(sent), defaulted.perform)["spec"]["cache"] == {"enabled": False}


def test_the_building_blocks_over_http(tmp_path):
    """get, list, delete and runtimes of the async client, on the unit tier's threaded fake API server."""
    from fake_api import FakeApiServer

    server = FakeApiServer().start()

    async def main():
        async with AsyncCodeRunClient(kubeconfig=str(server.kubeconfig(tmp_path / "kubeconfig")),
                                      client_name="agent") as client:
            created = await client.run("print(1)", wait=False, labels={"team": "a"})
            server.add("agents", "someone-elses")
            got = await client.get(created.name)
            mine = await client.list(mine=True)
            everyone = await client.list()
            runtimes = await client.runtimes()
            with pytest.raises(CodeRunError) as missing:
                await client.runtimes(policy="strict")
            deleted = [await client.delete(created.name), await client.delete(created.name)]
            return got, mine, everyone, runtimes, missing.value, deleted

    try:
        got, mine, everyone, runtimes, missing, deleted = asyncio.run(main())
    finally:
        server.stop()
    assert got.labels == {"coderun.io/client": "agent", "team": "a"} and got.phase is None
    assert [r.name for r in mine] == [got.name] and len(everyone) == 2
    assert {r.language for r in runtimes} == {"python", "javascript"} and runtimes[0].policy == "builtin-default"
    assert missing.status == 404
    assert deleted == [True, False]


def test_an_exec_plugins_token_is_loaded_again_once_it_expired(tmp_path):
    """As the sync client does (EKS, GKE's plugin): kubernetes.aio leaves the refresh to its caller."""
    from coderun.client.connection import connect_async

    plugin = tmp_path / "token-plugin"
    counter = tmp_path / "count"
    plugin.write_text(
        "#!/bin/sh\nn=$(( $(cat %s 2>/dev/null || echo 0) + 1 )); echo $n > %s\n"
        'echo \'{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", '
        '"status": {"token": "tok-\'$n\'", "expirationTimestamp": "2000-01-01T00:00:00Z"}}\'\n' % (counter, counter))
    plugin.chmod(0o755)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                  "command": str(plugin), "interactiveMode": "Never"}}}]}))

    async def tokens():
        api_client = await connect_async(str(kubeconfig), None, 10)
        try:
            configuration = api_client.configuration
            return [await configuration.get_api_key_with_prefix("BearerToken") for _ in range(2)]
        finally:
            await api_client.close()
    first, second = asyncio.run(tokens())
    assert first != second and {first, second} <= {"Bearer tok-2", "Bearer tok-3"}, (first, second)


def test_every_create_states_the_identity_the_api_server_named_asked_once(tmp_path):
    async def test(stub, client):
        stub.user = ("alice", ["team-a", "odd\ngroup", "system:authenticated"])
        return await asyncio.gather(*(client.create(RunRequest(code="print(1)")) for _ in range(20))), stub

    created, stub = in_loop(tmp_path, test)
    assert stub.reviews == 1  # twenty creates at once, one SelfSubjectReview
    stated = {(stub.runs[c.name]["metadata"]["annotations"][CREATED_BY],
               stub.runs[c.name]["metadata"]["annotations"][CREATED_BY_GROUPS]) for c in created}
    # A group holding a newline is left out, as the admission policy leaves it out of what it compares.
    assert stated == {("alice", "team-a\nsystem:authenticated")}
