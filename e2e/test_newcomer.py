"""Promises a newcomer found broken (issue 35, item 8), kept on the real cluster: an MCP conversation its client
ends over streamable HTTP takes its CodeRunSession and pod with it, and `coderun session create` says when the
namespace's policy refuses the session (the built-in baseline allows none) instead of printing `created`, as the
first `run --session` then says how the session ended rather than giving an RBAC hint; a run no node has room
for says why in its status as soon as the scheduler does.

Synchronisation is always a polled predicate with a deadline."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from coderun.api.coderunsession import SESSION_PLURAL
from coderun.api.models import GROUP, VERSION
from conftest import KUBECONFIG, wait_for
from framework.mcp import streamable_http_server
from framework.sessions import allow_sessions, wait_session

CODERUN = str(Path(sys.executable).parent / "coderun")

pytestmark = pytest.mark.cold_only  # the built-in baseline: no policy of a warm pool in the namespace


def coderun(namespace: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CODERUN, *args, "-n", namespace], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KUBECONFIG": str(KUBECONFIG)})


def sessions(cluster, namespace: str) -> list[dict]:
    return cluster.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, SESSION_PLURAL)["items"]


def pod_names(cluster, namespace: str) -> set[str]:
    return {pod.metadata.name for pod in cluster.core.list_namespaced_pod(namespace).items}


def test_an_mcp_conversation_its_client_ends_over_streamable_http_takes_its_session_and_pod(operator, namespace):
    allow_sessions(operator, namespace)
    with streamable_http_server(namespace) as (server, url):
        async def conversation():
            async with streamable_http_client(url) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    first = await session.call_tool("run_code", {"code": "open('kept', 'w').write('42')",
                                                                 "session": True})
                    second = await session.call_tool("run_code", {"code": "print(open('kept').read())",
                                                                  "session": True})
                    return first, second, sessions(operator, namespace), pod_names(operator, namespace)
            # leaving the client's context sends DELETE /mcp: the conversation is over
        first, second, during, pods = anyio.run(conversation)
        assert not first.is_error and not second.is_error, (first.content, second.content)
        assert second.structured_content["stdout"] == "42\n", second.structured_content
        # The positive control: while the conversation lasted, its one session and its pod were there.
        (session,) = during
        pod = session["status"]["podName"]
        assert session["status"]["phase"] in ("Ready", "Busy") and pod in pods, (session["status"], pods)
        # The server still serves: what ends the session is the conversation's end, not the server's.
        wait_for(lambda: not sessions(operator, namespace) and pod not in pod_names(operator, namespace), 60,
                 "the ended conversation's session and pod to go")
        assert server.poll() is None, server.stderr.read()


def test_session_create_says_the_built_in_baseline_refuses_sessions_and_a_run_in_one_says_how_it_ended(
        operator, namespace):
    refused = coderun(namespace, "session", "create", "--name", "refused")
    assert refused.returncode == 3 and refused.stdout == "", (refused.returncode, refused.stdout, refused.stderr)
    assert "coderunsession.coderun.io/refused refused (PolicyDenied): " in refused.stderr, refused.stderr
    assert not sessions(operator, namespace)  # deleted: it never takes a run
    # Created without waiting, as before: the policy ends it PolicyDenied, and a run naming it is refused at
    # creation, saying how the session ended (not an RBAC hint).
    assert coderun(namespace, "session", "create", "--name", "ended", "--no-wait").returncode == 0
    ended = wait_session(operator, namespace, "ended", "Ended", timeout=60)
    assert ended["reason"] == "PolicyDenied", ended
    ran = coderun(namespace, "run", "--session", "ended", "-c", "print(1)")
    assert ran.returncode == 3 and "RBAC" not in ran.stderr, (ran.returncode, ran.stderr)
    assert f"CodeRunSession {namespace}/ended has ended (PolicyDenied)" in ran.stderr, ran.stderr
    # The positive control: under a policy that allows sessions, create waits for it to take runs, and it does.
    allow_sessions(operator, namespace)
    created = coderun(namespace, "session", "create", "--name", "allowed")
    assert (created.returncode, created.stdout) == (0, "coderunsession.coderun.io/allowed created\n"), created.stderr
    ran = coderun(namespace, "run", "--session", "allowed", "-c", "print(6*7)")
    assert (ran.returncode, ran.stdout) == (0, "42\n"), ran.stderr


def test_a_run_no_node_has_room_for_says_the_scheduler_s_words_at_once_and_the_cli_quotes_them(operator, namespace):
    """1.9 CPU fits the node (2 allocatable, so it is not refused at once) but not beside what runs there: the
    run's status says so as soon as the scheduler does, and the CLI's give-up quotes it, naming its own flag."""
    waited = coderun(namespace, "run", "-c", "print(1)", "--cpu", "1900m", "--wait-timeout", "8s")
    assert waited.returncode == 5, (waited.returncode, waited.stdout, waited.stderr)
    assert "(last seen: Pending: PodCreated, sandbox pod " in waited.stderr, waited.stderr
    assert "not yet scheduled: 0/1 nodes are available: 1 Insufficient cpu" in waited.stderr, waited.stderr
    assert "--wait-timeout to wait longer; it is deleted" in waited.stderr and "wait(timeout" not in waited.stderr
