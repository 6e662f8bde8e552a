"""The SDK's session pieces that need no cluster: the CodeRunSession it creates, a run's spec in a session, and
the typed status it reads back."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from coderun.api.coderunsession import CodeRunSession
from coderun.api.models import CodeRunSpec
from coderun.client import CodeRunError, RunRequest, SessionEnded
from coderun.client.sessions import build_session_body, run_in_session_spec, session_info, session_spec, why_over, refused_as_over, \
    refused_as_ended


def test_the_session_created_is_a_valid_coderunsession_named_and_labelled_by_the_client():
    spec = session_spec("python", policy="data-science", keep_state=False, limits={"memory": "1Gi", "cpu": "1"},
                        idle_timeout=120, max_lifetime=None)
    body = build_session_body(spec, client_name="agent-7", labels={"team": "a"})
    assert body["metadata"]["name"].startswith("session-") and len(body["metadata"]["name"]) == 16
    assert body["metadata"]["labels"] == {"coderun.io/client": "agent-7", "team": "a"}
    assert body["spec"]["policyRef"] == "data-science" and body["spec"]["limits"] == {"memory": "1Gi", "cpu": "1"}
    assert body["spec"]["idleTimeoutSeconds"] == 120 and body["spec"]["maxLifetimeSeconds"] == 3600
    assert CodeRunSession.model_validate(body).spec.keep_state is False
    assert build_session_body(spec, client_name="x")["metadata"]["name"] != body["metadata"]["name"]


def test_an_idle_timeout_longer_than_the_lifetime_is_refused_before_any_request():
    with pytest.raises(ValidationError, match="idleTimeoutSeconds must not exceed maxLifetimeSeconds"):
        session_spec("python", policy=None, keep_state=False, limits=None, idle_timeout=600, max_lifetime=60)


def test_a_run_in_a_session_names_it_and_cannot_set_the_sandboxs_memory():
    spec = run_in_session_spec(RunRequest(code="print(1)", files={"a.txt": "x"}, timeout=9), "s-1")
    assert isinstance(spec, CodeRunSpec) and spec.session == "s-1" and spec.limits.timeout_seconds == 9
    assert spec.files[0].path == "a.txt"
    with pytest.raises(CodeRunError, match="set memory and cpu when creating the session"):
        run_in_session_spec(RunRequest(code="print(1)", memory="1Gi"), "s-1")


def test_an_ended_sessions_status_reads_typed_and_its_error_says_why():
    info = session_info({"metadata": {"name": "s-1", "namespace": "ns"},
                         "status": {"phase": "Ended", "reason": "IdleTimeout", "runsDone": 4,
                                    "message": "no run for 600 s", "someFutureField": 1}})
    assert info.ended and info.runs_done == 4
    assert str(SessionEnded(info)) == ("CodeRunSession ns/s-1 has ended (IdleTimeout): no run for 600 s; "
                                       "create a new session")
    assert not session_info({"metadata": {"name": "s-2", "namespace": "ns"}}).ended


def test_why_a_session_takes_no_more_runs_ended_deleted_or_none_while_it_lives():
    ended = session_info({"metadata": {"name": "s-1", "namespace": "ns"},
                          "status": {"phase": "Ended", "reason": "OOMKilled", "message": "out of memory"}})
    assert isinstance(why_over(ended, "ns", "s-1"), SessionEnded) and "OOMKilled" in str(why_over(ended, "ns", "s-1"))
    deleted = why_over(None, "ns", "s-1")
    assert type(deleted) is CodeRunError and str(deleted) == "CodeRunSession ns/s-1 was deleted; create a new session"
    live = session_info({"metadata": {"name": "s-1", "namespace": "ns"}, "status": {"phase": "Busy"}})
    assert why_over(live, "ns", "s-1") is None


def test_a_run_refused_because_its_session_ended_or_was_deleted_is_over_any_other_refusal_is_not():
    from coderun.client.result import result_from_object

    def refused(reason: str):
        return result_from_object({"metadata": {"name": "r", "namespace": "ns"},
                                   "status": {"phase": "Rejected", "reason": reason, "message": "m"}})
    assert refused_as_over(refused("SessionEnded")) and refused_as_over(refused("SessionNotFound"))
    assert refused_as_ended(refused("SessionEnded")) and not refused_as_ended(refused("SessionNotFound"))
    assert not refused_as_over(refused("PolicyDenied")) and not refused_as_over(refused("SessionMismatch"))


def test_the_cli_refuses_a_runs_memory_in_a_session_and_a_bad_session_before_reading_any_kubeconfig(capsys):
    from coderun import cli
    assert cli.main(["run", "--session", "s-1", "--memory", "1Gi", "-c", "print(1)"]) == cli.EXIT_USAGE
    assert "give them to `coderun session create`" in capsys.readouterr().err
    assert cli.main(["session", "create", "--idle-timeout", "2h", "--max-lifetime", "1h",
                     "--kubeconfig", "/nonexistent"]) == cli.EXIT_USAGE
    assert "idleTimeoutSeconds must not exceed maxLifetimeSeconds" in capsys.readouterr().err


def test_the_cli_session_line_says_where_a_session_stands():
    from coderun.cli import session_line
    ready = session_info({"metadata": {"name": "s-1", "namespace": "ns"},
                          "status": {"phase": "Ready", "runsDone": 2, "podName": "s-1-abc",
                                     "idleExpiresAt": "2026-11-24T10:10:00Z", "expiresAt": "2026-11-24T11:00:00Z"}})
    assert session_line(ready) == ("s-1: Ready; 2 runs done; pod s-1-abc; ends at 2026-11-24T10:10:00Z unless a run "
                                   "comes")
    ended = session_info({"metadata": {"name": "s-1", "namespace": "ns"},
                          "status": {"phase": "Ended", "reason": "OOMKilled", "message": "a run\nran out",
                                     "runsDone": 3}})
    assert session_line(ended) == "s-1: Ended (OOMKilled); 3 runs done; a run\\x0aran out"
