"""CodeRunSessions against a fake of k8s.py (keepState false): the session's pod and Ready, runs in creation order
through one sandbox, refusals (ended session, another language), the idle timeout, and a session run's status
written by the cold run's finish."""
import copy
import json
import threading
from typing import Callable

import pytest

from coderun.sandbox.runner.protocol import session_document_mac
from coderun_operator.builders.session import build_session_pod, session_document
from coderun_operator.controller.audit import ask_agent
from coderun_operator.controller import Controller
from coderun_operator.controller.session import frame_with, session_key
from coderun_operator.policy import DEFAULT_POLICY, Decision
from prestart_check import assert_prestarts_as_the_decision_runs
from coderun_operator.policy.session import run_in_session, session_verdict
from coderun_operator.results.lifecycle import session_expiry_time
from coderun_operator.results.session import compute_session_status, runs_in_order
from coderun_operator.results.status import parse_time
from coderun.api.coderunpolicy import Sessions
from coderun.api.coderunsession import CodeRunSessionSpec
from coderun.api.models import CodeRunSpec
from fake_k8s import FakeK8s
from support.controller import NS, T0, Clock, make_run
from support.warm import pool_pods, start_pool
from support.sessions import POD, make_session, runner, session_run, start_session
from support.controller import settle
from datetime import timedelta
import dataclasses

POLICY = {"apiVersion": "coderun.io/v1alpha1", "kind": "CodeRunPolicy",
          "metadata": {"name": "default", "namespace": NS, "uid": "policy-uid"},
          "spec": {"sessions": {"allowed": True, "maxSessions": 2, "maxIdleTimeoutSeconds": 60}}}
class Later(list):
    """The session controller's scheduled checks (a run still in the sandbox a quarter second on), held until a
    test runs them: the moment is the test's, not a timer's."""

    def __call__(self, seconds, call):
        self.append(call)

    def run(self):
        while self:
            self.pop(0)()


@pytest.fixture
def env():
    api, clock = FakeK8s(), Clock()
    ctl = Controller(api=api, clock=clock)
    ctl.session_runs.later = Later()
    api.policies = [copy.deepcopy(POLICY)]
    ctl.on_policy(copy.deepcopy(POLICY), deleted=False)
    return api, clock, ctl


def serving_session(env, gate: threading.Event | None = None):
    """A Ready session whose sandbox answers every document with a frame (runner), each once `gate` is set when
    one is given; the runner's state."""
    api = env[0]
    start_session(env)
    state, answer = runner(api)
    api.attach_answers[POD] = answer if gate is None else (lambda document: (gate.wait(5), answer(document))[1])
    return state


# ---------------------------------------------------------------- pure parts
def test_the_session_pod_is_the_sandbox_pod_with_an_open_stdin_owned_by_the_session():
    policy = dataclasses.replace(DEFAULT_POLICY, sessions=Sessions(allowed=True))
    verdict = session_verdict(CodeRunSessionSpec(language="python", limits={"memory": "512Mi"}), policy, 0)
    pod = build_session_pod(make_session(), verdict.decision, verdict.max_lifetime_seconds)
    container = pod["spec"]["containers"][0]
    assert container["stdin"] is True and container["stdinOnce"] is False
    assert container["command"][-2] == "--session"
    assert_prestarts_as_the_decision_runs(container["command"][-1], verdict.decision)
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "CodeRunSession"
    assert pod["spec"]["activeDeadlineSeconds"] == 3600 + 60
    assert pod["spec"]["runtimeClassName"] == "gvisor" and pod["spec"]["automountServiceAccountToken"] is False
    assert container["resources"]["limits"]["memory"] == "576Mi"  # 512Mi and the 64Mi /tmp


def test_the_policy_decides_sessions_caps_and_keep_state():
    off = session_verdict(CodeRunSessionSpec(language="python"), DEFAULT_POLICY, 0)
    assert off.reason == "PolicyDenied" and off.rule == "sessions.allowed"
    policy = dataclasses.replace(DEFAULT_POLICY, sessions=Sessions(allowed=True, max_sessions=1,
                                                                  max_lifetime_seconds=600))
    capped = session_verdict(CodeRunSessionSpec(language="python", maxLifetimeSeconds=7200, idleTimeoutSeconds=3000),
                             policy, 0)
    assert (capped.max_lifetime_seconds, capped.idle_timeout_seconds) == (600, 1800)
    assert session_verdict(CodeRunSessionSpec(language="python"), policy, 1).rule == "sessions.maxSessions"
    keep = session_verdict(CodeRunSessionSpec(language="python", keepState=True), policy, 0)
    assert keep.decision.runtime.language == "python"  # allowed: the runner holds one interpreter for it
    # Node has no interpreter the runner can hold: refused, saying what to change.
    keep_js = session_verdict(CodeRunSessionSpec(language="javascript", keepState=True), policy, 0)
    assert keep_js.reason == "StartFailed" and "keepState: false" in keep_js.message, keep_js
    no_keep = dataclasses.replace(policy, sessions=policy.sessions.model_copy(update={"allow_keep_state": False}))
    assert session_verdict(CodeRunSessionSpec(language="python", keepState=True), no_keep, 0).rule == \
        "sessions.allowKeepState"
    run = run_in_session(CodeRunSpec(language="python", code="x", session="s1", limits={"timeoutSeconds": 9}),
                         capped.decision.limits, policy)
    assert isinstance(run, Decision) and run.limits.timeout_seconds == 9 and run.limits.memory == "256Mi"


def test_runs_in_order_is_creation_then_name():
    runs = [{"metadata": {"name": n, "creationTimestamp": t}} for n, t in
            [("b", "2026-01-01T00:00:01Z"), ("a", "2026-01-01T00:00:01Z"), ("c", "2026-01-01T00:00:00Z")]]
    assert [r["metadata"]["name"] for r in runs_in_order(runs)] == ["c", "a", "b"]


def test_an_exchange_ends_at_its_runs_frame_or_at_a_frame_for_a_dropped_document_not_at_an_earlier_runs():
    """A runner holding someone else's key drops the operator's document and answers with a frame without a
    nonce: the run's frame will never come, so the exchange stops there (the session ends saying the sandbox did
    not answer) instead of waiting out the run's timeout. A late frame of an earlier run is read past."""
    done = frame_with("a" * 64)
    frame = lambda **fields: b"\nCODERUN-RESULT-V1 " + json.dumps(  # noqa: E731
        {"version": 1, "reason": "InvalidInput", **fields}, separators=(",", ":")).encode()
    assert not done(b"CODERUN-ACCEPTED 0123\n" + frame(nonce="b" * 64) + b"\n")  # an earlier run's, late
    assert done(frame(nonce="a" * 64) + b"\n")
    assert done(frame(message="the document is not the session's (no valid MAC ...): dropped") + b"\n")
    assert not done(frame(nonce="a" * 64))  # not whole yet
    # a program's output cannot pass for a frame without a nonce: inside the frame it is an escaped string
    assert not done(frame(nonce="b" * 64, stdout='"nonce":"x" and no nonce') + b"\n")


def test_documents_carry_the_key_first_then_a_mac_per_sequence():
    key = session_key(b"m" * 32, "uid")
    first = session_document({"data": {"code": "x"}}, "a" * 64, key, 0)
    assert b"session.json" in first and first.split(b"\n", 1)[0].isdigit()
    second = session_document({"data": {"code": "y"}}, "b" * 64, key, 1)
    header, body = second.split(b"\n", 1)
    assert header.split(b" ")[1:] == [b"1", session_document_mac(key, 1, body).encode()]
    assert b"session.json" not in body


def test_compute_status_ends_an_idle_session():
    session = make_session()
    session["status"] = {"phase": "Ready", "podName": POD, "idleTimeoutSeconds": 60,
                         "startTime": "2026-11-22T10:00:00Z", "expiresAt": "2026-11-22T11:00:00Z"}
    pod = {"metadata": {"name": POD}, "status": {"containerStatuses": [{"name": "run",
                                                                                  "state": {"running": {}}}]}}
    assert compute_session_status(session, pod, [], T0 + timedelta(seconds=30)).phase == "Ready"
    ended = compute_session_status(session, pod, [], T0 + timedelta(seconds=61))
    assert (ended.phase, ended.reason) == ("Ended", "IdleTimeout")


# ---------------------------------------------------------------- the controller
def test_a_session_gets_its_pod_and_is_ready_once_the_runner_runs(env):
    api, _, ctl = env
    ctl.on_session(api.add_session(make_session()), deleted=False)
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (status["phase"], status["podName"], status["idleTimeoutSeconds"]) == ("Pending", POD, 60)
    assert ("Secret", "coderun-system", "coderun-session-key") in api.objects
    status = start_session(env)["status"]
    assert status["phase"] == "Ready" and status["creator"] == "alice"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Ready": "True", "Ended": "False"}


def test_two_runs_go_in_creation_order_and_the_second_waits_for_the_first(env):
    api, clock, ctl = env
    gate = threading.Event()
    state = serving_session(env, gate)
    first = api.add_run(session_run("first", "uid-1"))
    ctl.on_run(api.add_run(session_run("second", "uid-2", created="2026-11-22T10:00:02Z")), deleted=False)
    ctl.on_run(first, deleted=False)  # its event comes second: the order is still creation's
    second = api.run(NS, "second")["status"]
    assert (second["phase"], second["reason"]) == ("Pending", "Queued") and "waits its turn" in second["message"]
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["phase"] == "Ready"  # not yet a quarter second
    ctl.session_runs.later.run()  # the first run is still in the sandbox a quarter second on
    session = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (session["phase"], session["currentRun"]) == ("Busy", "first")
    gate.set()
    settle(ctl)
    settle(ctl)
    first, second = api.run(NS, "first")["status"], api.run(NS, "second")["status"]
    assert (first["phase"], first["stdout"], first["startMode"]) == ("Succeeded", "run 1\n", "Session")
    assert (second["phase"], second["stdout"]) == ("Succeeded", "run 2\n")
    assert state["codes"] == ["print(6*7)", "print(6*7)"] and state["sequence"] == 1
    session = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (session["phase"], session["runsDone"], session["documentsReserved"]) == ("Ready", 2, 64)
    assert ("Pod", NS, POD) in api.objects  # the session keeps its pod


def test_the_finish_writes_the_fields_a_cold_run_gets(env):
    api, _, ctl = env
    serving_session(env)
    ctl.on_run(api.add_run(session_run("first", "uid-1")), deleted=False)
    settle(ctl)
    status = api.run(NS, "first")["status"]
    for field in ("phase", "reason", "exitCode", "stdout", "stderr", "metrics", "conditions", "codeHash", "image",
                  "policy", "policyDigest", "effectiveLimits", "decision", "startTime", "completionTime"):
        assert field in status, field
    assert "cacheKey" not in status  # never offered to the cache
    assert status["image"].endswith("@sha256:" + "f" * 64)


def test_a_run_naming_an_ended_session_is_refused_with_the_sessions_reason(env):
    api, clock, ctl = env
    start_session(env)
    clock.now = T0 + timedelta(seconds=120)
    ctl.tick()
    session = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (session["phase"], session["reason"]) == ("Ended", "IdleTimeout")
    assert ("Pod", NS, POD) not in api.objects  # its pod goes with it
    ctl.on_run(api.add_run(session_run("late", "uid-9")), deleted=False)
    status = api.run(NS, "late")["status"]
    assert (status["phase"], status["reason"]) == ("Rejected", "SessionEnded") and "IdleTimeout" in status["message"]


def test_an_ended_session_is_kept_for_its_policys_ttl_then_deleted(env):
    api, clock, ctl = env
    short = {**copy.deepcopy(POLICY), "spec": {**POLICY["spec"], "ttlSecondsAfterFinished": 300}}
    api.policies = [short]
    ctl.on_policy(copy.deepcopy(short), deleted=False)
    start_session(env)
    clock.now = T0 + timedelta(seconds=120)
    ctl.tick()
    ended = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert ended["phase"] == "Ended"
    clock.now = parse_time(ended["endTime"]) + timedelta(seconds=299)
    ctl.tick()
    assert ("CodeRunSession", NS, "s1") in api.objects  # `kubectl get crsess` still says why it ended
    clock.now += timedelta(seconds=1)
    # A run of it still unfinished (its frame held for the container's end, say) holds it until it finishes.
    unfinished = ctl.store.put_run(session_run("unfinished", "uid-7"))
    ctl.tick()
    assert ("CodeRunSession", NS, "s1") in api.objects
    ctl.store.forget_run(unfinished["metadata"]["uid"])
    ctl.tick()
    assert ("CodeRunSession", NS, "s1") not in api.objects


def test_an_ended_sessions_expiry_falls_back_to_the_default_ttl_when_its_policy_is_gone():
    session = make_session()
    session["status"] = {"phase": "Ended", "policy": "gone", "endTime": "2026-11-22T10:00:00Z"}
    assert session_expiry_time(session, {}) == T0 + timedelta(seconds=DEFAULT_POLICY.ttl_seconds_after_finished)
    session["status"]["phase"] = "Ready"
    assert session_expiry_time(session, {}) is None  # a live session never expires by this clock


def test_a_run_of_another_language_or_no_session_is_refused(env):
    api, _, ctl = env
    start_session(env)
    ctl.on_run(api.add_run(session_run("js", "uid-3", language="javascript")), deleted=False)
    assert api.run(NS, "js")["status"]["reason"] == "SessionMismatch"
    run = session_run("lost", "uid-4")
    run["spec"]["session"] = "nope"
    ctl.on_run(api.add_run(run), deleted=False)
    assert api.run(NS, "lost")["status"]["reason"] == "SessionNotFound"


def test_a_keep_state_session_holds_one_interpreter_and_ends_when_a_run_loses_it(env):
    """Its runner is told to keep one interpreter (--keep-state, and keepState true in the first document); a run
    whose frame says the interpreter was lost (it hung past the interrupt) keeps its own status, saying so, and
    the session ends InterpreterLost."""
    api, _, ctl = env
    start_session(env, keepState=True)
    assert api.objects[("Pod", NS, POD)]["spec"]["containers"][0]["command"][-1] == "--keep-state"
    _, answer = runner(api)
    settings = []

    def lost(document: bytes) -> bytes:
        settings.append(json.loads(json.loads(document.split(b"\n", 1)[1])["data"]["session.json"]))
        stream = answer(document).decode()
        head, _, frame = stream.partition("CODERUN-RESULT-V1 ")
        frame = {**json.loads(frame), "reason": "Timeout", "exitCode": None, "signal": None,
                 "interpreterLost": "the interpreter did not stop within 2 s of the interrupt"}
        return f"{head}CODERUN-RESULT-V1 {json.dumps(frame)}\n".encode()
    api.attach_answers[POD] = lost
    ctl.on_run(api.add_run(session_run("hang", "uid-1")), deleted=False)
    settle(ctl)
    assert settings[0]["keepState"] is True
    status = api.run(NS, "hang")["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "Timeout") and "interpreter was lost" in status["message"]
    session = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (session["phase"], session["reason"]) == ("Ended", "InterpreterLost") and "did not stop" in \
        session["message"], session


@pytest.mark.parametrize("container_reason, run_reason", [("OOMKilled", "OOMKilled"), ("Completed", "Signaled")])
def test_a_run_killed_by_an_unsent_sigkill_ends_by_the_containers_word_and_ends_the_session(
        env, container_reason, run_reason):
    """gVisor's kill when memory runs out: the runner sends the frame (SIGKILL, output so far) and ends the
    session; the container's end says whether it was memory (OOMKilled, as for a cold run)."""
    api, _, ctl = env
    start_session(env)
    _, answer = runner(api)

    def killed(document: bytes) -> bytes:
        stream = answer(document).decode()
        head, _, frame = stream.partition("CODERUN-RESULT-V1 ")
        frame = {**json.loads(frame), "reason": "Signaled", "exitCode": None, "signal": 9, "stdout": "so far\n"}
        return f"{head}CODERUN-RESULT-V1 {json.dumps(frame)}\n".encode()
    api.attach_answers[POD] = killed
    ctl.on_run(api.add_run(session_run("hog", "uid-1")), deleted=False)
    settle(ctl)
    waiting = api.run(NS, "hog")["status"]
    assert (waiting["phase"], waiting["startMode"]) == ("Running", "Session"), waiting
    pod = copy.deepcopy(api.objects[("Pod", NS, POD)])
    pod["status"]["phase"] = "Failed"
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"reason": container_reason, "exitCode": 0}}
    api.objects[("Pod", NS, POD)] = pod
    ctl.on_pod(copy.deepcopy(pod), deleted=False)
    status = api.run(NS, "hog")["status"]
    assert (status["phase"], status["reason"], status["stdout"]) == ("Failed", run_reason, "so far\n"), status
    session = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert session["phase"] == "Ended" and session["reason"] == (
        "OOMKilled" if container_reason == "OOMKilled" else "PodDeleted"), session


def test_a_run_whose_stream_ends_with_no_frame_waits_for_the_sandboxs_end_to_say_it_was_memory(env):
    """The OOM killer may take the whole sandbox, runner and all: the stream ends with no frame, and the pod's
    watch brings the container's OOMKilled a moment later (seconds, on a loaded node). The run and the session
    say OOMKilled, not that the sandbox did not answer."""
    api, _, ctl = env
    start_session(env)
    api.attach_answers[POD] = lambda document: b""
    ctl.on_run(api.add_run(session_run("hog", "uid-1")), deleted=False)
    settle(ctl)
    assert api.run(NS, "hog")["status"]["phase"] == "Running"
    assert (api.objects[("CodeRunSession", NS, "s1")]["status"] or {}).get("phase") != "Ended"
    pod = copy.deepcopy(api.objects[("Pod", NS, POD)])
    pod["status"]["phase"] = "Failed"
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
    api.objects[("Pod", NS, POD)] = pod
    ctl.on_pod(copy.deepcopy(pod), deleted=False)
    status = api.run(NS, "hog")["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "OOMKilled"), status
    session = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (session["phase"], session["reason"]) == ("Ended", "OOMKilled"), session


def test_a_stream_that_breaks_under_a_run_that_goes_on_leaves_the_run_to_its_frame_in_the_log(env):
    """The attach can drop under a healthy run (an API server restart, an idle timeout on the way): the run is
    not ended for it; the sandbox's log brings its frame once it is done."""
    api, clock, ctl = env
    start_session(env)
    _, answer = runner(api)
    printed = {}
    api.attach_answers[POD] = lambda document: (printed.__setitem__("log", answer(document)), b"")[1]
    ctl.on_run(api.add_run(session_run("long", "uid-1")), deleted=False)
    settle(ctl)
    api.logs[POD] = (printed["log"].split(b"CODERUN-RESULT-V1")[0].decode(), True)  # accepted, running on
    clock.now += timedelta(seconds=20)
    ctl.tick()
    assert api.run(NS, "long")["status"]["phase"] == "Running"
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["phase"] != "Ended"
    api.logs[POD] = (printed["log"].decode(), True)
    ctl.tick()
    status = api.run(NS, "long")["status"]
    assert (status["phase"], status["stdout"]) == ("Succeeded", "run 1\n"), status


def test_a_run_waits_for_its_frame_as_long_as_its_own_timeout_and_the_pods_margin(env):
    api, clock, ctl = env
    start_session(env)
    _, answer = runner(api)
    api.attach_answers[POD] = lambda document: (api.logs.__setitem__(
        POD, (answer(document).split(b"CODERUN-RESULT-V1")[0].decode(), True)), b"")[1]
    ctl.on_run(api.add_run(session_run("slow", "uid-1", limits={"timeoutSeconds": 200})), deleted=False)
    settle(ctl)
    for seconds in (100, 150):  # past the margin alone, within the run's own timeout and it
        clock.now = T0 + timedelta(seconds=seconds)
        ctl.tick()
        assert api.run(NS, "slow")["status"]["phase"] == "Running", seconds
    clock.now = T0 + timedelta(seconds=262)
    ctl.tick()
    status = api.run(NS, "slow")["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InternalError") and "did not answer" in \
        status["message"], status
    session = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (session["phase"], session["reason"]) == ("Ended", "InternalError"), session


def restarted_mid_run(env, sandbox_log: Callable[[bytes, bytes], bytes]):
    """A run sent to the session's sandbox, then the operator gone with the run's stream, and started again: the
    restarted controller, and the runner's state. `sandbox_log(document, answer)` is what the sandbox's log
    holds of the run by then."""
    api, clock, ctl = env
    start_session(env)
    state, answer = runner(api)
    api.attach_answers[POD] = lambda document: (api.logs.__setitem__(
        POD, (sandbox_log(document, answer(document)).decode(), True)), b"")[1]
    ctl.on_run(api.add_run(session_run("r1", "uid-1")), deleted=False)
    settle(ctl)
    restarted = Controller(api=api, clock=clock)
    restarted.session_runs.later = Later()
    restarted.on_policy(copy.deepcopy(POLICY), deleted=False)
    restarted.on_session(copy.deepcopy(api.objects[("CodeRunSession", NS, "s1")]), deleted=False)
    restarted.on_pod(copy.deepcopy(api.objects[("Pod", NS, POD)]), deleted=False)
    restarted.on_run(copy.deepcopy(api.run(NS, "r1")), deleted=False)
    return restarted, state, answer


def test_an_operator_restarted_while_a_run_is_in_the_sandbox_finishes_it_from_the_sandboxs_log(env):
    """The frame carries the run's nonce, which the operator derives from its key and the run's uid: a restarted
    operator finds it in the log's last lines; the session goes on under the same key and numbering."""
    api, clock, _ = env
    restarted, state, answer = restarted_mid_run(env, lambda document, answered: b"earlier lines\n" + answered)
    status = api.run(NS, "r1")["status"]
    assert (status["phase"], status["stdout"]) == ("Succeeded", "run 1\n"), status
    api.attach_answers[POD] = answer
    restarted.on_run(api.add_run(session_run("r2", "uid-2", created="2026-11-22T10:00:02Z")), deleted=False)
    settle(restarted)
    status = api.run(NS, "r2")["status"]
    assert (status["phase"], status["stdout"]) == ("Succeeded", "run 2\n"), status
    # The second document went MAC'd with the first number the restarted operator could not know unused: past
    # the block the first run reserved, and the next block is reserved with it.
    assert state["sequence"] == 64
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["documentsReserved"] == 128


def test_a_session_an_older_operator_numbered_goes_on_after_the_upgrade(env):
    """An operator before documentsReserved wrote documentsSent, the count of documents sent: a session alive
    across the upgrade goes on from that count, its next document MAC'd past the runner's last number."""
    api, clock, ctl = env
    state = serving_session(env)
    ctl.on_run(api.add_run(session_run("r1", "uid-1")), deleted=False)
    settle(ctl)
    assert api.run(NS, "r1")["status"]["phase"] == "Succeeded" and state["sequence"] == 0
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    del status["documentsReserved"]
    status["documentsSent"] = 5  # as the older operator left it, its runner's last number 4
    state["sequence"] = 4
    upgraded = Controller(api=api, clock=clock)
    upgraded.session_runs.later = Later()
    upgraded.on_policy(copy.deepcopy(POLICY), deleted=False)
    upgraded.on_session(copy.deepcopy(api.objects[("CodeRunSession", NS, "s1")]), deleted=False)
    upgraded.on_pod(copy.deepcopy(api.objects[("Pod", NS, POD)]), deleted=False)
    upgraded.on_run(api.add_run(session_run("r2", "uid-2", created="2026-11-22T10:00:02Z")), deleted=False)
    settle(upgraded)
    assert (api.run(NS, "r2")["status"]["phase"], state["sequence"]) == ("Succeeded", 5)
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["documentsReserved"] == 5 + 64


def test_a_frame_in_the_log_without_the_runs_nonce_is_not_the_runs(env):
    """The program can write to the runner's stdout, and so into the log: a frame without the nonce is its."""
    api, clock, _ = env
    forged = b'\nCODERUN-RESULT-V1 {"version":1,"reason":"Completed","exitCode":0,"stdout":"forged","stderr":"",' \
             b'"metrics":{"wallMillis":1,"cpuMillis":1,"maxRSSBytes":1},"nonce":"' + b"a" * 64 + b'"}\n'
    restarted_mid_run(env, lambda document, answered: answered.split(b"\n")[0] + b"\n" + forged)
    assert api.run(NS, "r1")["status"]["phase"] == "Running"  # accepted, not answered: it waits


@pytest.mark.parametrize("log, run_message, session_phase", [
    # the runner took the document and never answered by the run's deadline: the sandbox is not to be trusted
    (lambda document, answered: answered.split(b"\n")[0] + b"\n", "did not answer", "Ended"),
    # the operator went before the document reached the runner: nothing ran, and the session is fine
    (lambda document, answered: b"", "left no sign", "Ready")])
def test_a_run_whose_frame_is_not_in_the_log_by_its_deadline_ends_saying_whether_it_ever_ran(
        env, log, run_message, session_phase):
    api, clock, _ = env
    restarted, _, _ = restarted_mid_run(env, log)
    assert api.run(NS, "r1")["status"]["phase"] == "Running"
    clock.now += timedelta(seconds=29)
    restarted.tick()
    assert api.run(NS, "r1")["status"]["phase"] == "Running"  # the default timeout (30 s) and the pod's margin
    clock.now += timedelta(seconds=62)
    restarted.tick()
    status = api.run(NS, "r1")["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InternalError") and run_message in \
        status["message"], status
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["phase"] == session_phase


def test_a_restarted_operator_that_sees_the_session_before_its_pod_keeps_the_session(env):
    """After a restart (or right after the pod's creation) the session's event can come before its pod's: the
    pod is asked of the API server, and the session goes on."""
    api, clock, _ = env
    start_session(env)
    restarted = Controller(api=api, clock=clock)
    restarted.session_runs.later = Later()
    restarted.on_policy(copy.deepcopy(POLICY), deleted=False)
    restarted.on_session(copy.deepcopy(api.objects[("CodeRunSession", NS, "s1")]), deleted=False)
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert status["phase"] == "Ready" and ("Pod", NS, POD) in api.objects, status
    del api.objects[("Pod", NS, POD)]  # and when it is really gone, the session ends saying so
    restarted.sessions.book.pods.clear()
    restarted.tick()
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (status["phase"], status["reason"]) == ("Ended", "PodDeleted"), status


def test_a_session_created_again_under_its_name_gets_a_pod_of_its_own(env):
    """`kubectl delete crsess s1 && kubectl create -f s1.yaml`: the old pod may still be terminating."""
    api, _, ctl = env
    start_session(env)
    old = api.objects[("CodeRunSession", NS, "s1")]
    ctl.on_session(copy.deepcopy(old), deleted=True)
    del api.objects[("CodeRunSession", NS, "s1")]
    api.objects[("Pod", NS, POD)]["metadata"]["deletionTimestamp"] = "2026-11-22T10:00:05Z"
    ctl.on_session(api.add_session(make_session(uid="another-2")), deleted=False)
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (status["phase"], status["podName"]) == ("Pending", "s1-session-another-"), status
    assert ("Pod", NS, "s1-session-another-") in api.objects


def test_without_the_api_servers_identity_policies_no_run_may_use_a_session(env):
    """The creators' annotations are evidence only while the admission policies guard them."""
    api, _, ctl = env
    start_session(env)
    api.admission.clear()
    ctl.on_run(api.add_run(session_run("first", "uid-1")), deleted=False)
    status = api.run(NS, "first")["status"]
    assert (status["phase"], status["reason"]) == ("Rejected", "SessionForbidden"), status
    assert "cannot be verified" in status["message"] and "approval.coderun.io" in status["message"], status


def test_the_idle_clock_and_the_count_never_go_back_when_finished_runs_are_deleted():
    """`coderun run --session` deletes its run: the session must still count it, and its idle clock with it."""
    session = make_session()
    session["status"] = {"phase": "Ready", "podName": POD, "idleTimeoutSeconds": 60, "runsDone": 4,
                         "startTime": "2026-11-22T10:00:00Z", "lastActivity": "2026-11-22T10:00:50Z",
                         "expiresAt": "2026-11-22T11:00:00Z"}
    pod = {"metadata": {"name": POD}, "status": {"containerStatuses": [{"name": "run", "state": {"running": {}}}]}}
    status = compute_session_status(session, pod, [], T0 + timedelta(seconds=90))
    assert (status.phase, status.runs_done, status.last_activity) == ("Ready", 4, "2026-11-22T10:00:50Z")


def test_a_session_under_a_policy_that_needs_approval_or_that_its_creator_may_not_use_is_denied(env):
    api, _, ctl = env
    supervised = {**copy.deepcopy(POLICY), "metadata": {**POLICY["metadata"], "name": "supervised", "uid": "p2"},
                  "spec": {**POLICY["spec"], "approval": {"required": "Always"}}}
    api.policies.append(supervised)
    ctl.on_policy(copy.deepcopy(supervised), deleted=False)
    ctl.api.grants.add(("alice", "use", "coderunpolicies", NS, "supervised"))
    ctl.on_session(api.add_session(make_session(policyRef="supervised")), deleted=False)
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (status["phase"], status["reason"]) == ("Ended", "PolicyDenied") and "approval" in status["message"]
    roomy = {**copy.deepcopy(POLICY), "metadata": {**POLICY["metadata"], "name": "roomy", "uid": "p3"}}
    api.policies.append(roomy)
    ctl.on_policy(copy.deepcopy(roomy), deleted=False)  # exists, allows sessions; alice has no `use` on it
    ctl.on_session(api.add_session(make_session(name="s2", uid="sess-uid-2", policyRef="roomy")), deleted=False)
    status = api.objects[("CodeRunSession", NS, "s2")]["status"]
    assert (status["phase"], status["reason"]) == ("Ended", "PolicyDenied") and "may not use" in status["message"]


def test_a_restarted_operator_does_not_end_sessions_before_it_has_the_policies(env):
    api, clock, _ = env
    start_session(env)
    restarted = Controller(api=api, clock=clock)  # no policy event yet: the session's comes first
    restarted.session_runs.later = Later()
    restarted.on_session(copy.deepcopy(api.objects[("CodeRunSession", NS, "s1")]), deleted=False)
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["phase"] == "Ready"


def test_an_unreachable_sandbox_ends_the_session_after_a_few_attaches_and_never_revives_it(env):
    api, _, ctl = env
    start_session(env)
    api.attach_answers[POD] = ConnectionError("unreachable")
    ctl.on_run(api.add_run(session_run("first", "uid-1")), deleted=False)
    for _ in range(5):
        settle(ctl)
        ctl.tick()
    session = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (session["phase"], session["reason"]) == ("Ended", "PodDeleted") and "3 times" in session["message"]
    status = api.run(NS, "first")["status"]
    assert status["phase"] == "Rejected" and status["reason"] == "SessionEnded", status


def test_when_the_first_attach_fails_the_next_try_carries_the_sessions_key_again(env):
    """The first document (sequence 0) carries the session's key: if its attach fails, the runner has no key, so
    the run's next try goes as a first document again, not with a MAC under a key the runner never got."""
    api, _, ctl = env
    start_session(env)
    state, answer = runner(api)
    attempts, failures = [], [ConnectionError("the attach broke before the document went")]

    def fail_once(*_args):
        if failures:
            raise failures.pop()
    api.fail["attach"] = fail_once
    api.attach_answers[POD] = lambda document: (attempts.append(document.split(b"\n", 1)[0]), answer(document))[1]
    ctl.on_run(api.add_run(session_run("r1", "uid-1")), deleted=False)
    for _ in range(3):
        settle(ctl)
        ctl.tick()
    ctl.on_run(api.add_run(session_run("r2", "uid-2", created="2026-11-22T10:00:02Z")), deleted=False)
    settle(ctl)
    assert [api.run(NS, name)["status"]["phase"] for name in ("r1", "r2")] == ["Succeeded"] * 2
    assert len(attempts) == 2 and b" " not in attempts[0] and b" " in attempts[1], attempts  # r1 again as first
    assert state["key"] is not None and state["sequence"] >= 1  # r2 went with a MAC under the key r1 carried


def test_a_deleted_session_leaves_nothing_of_itself_in_the_operators_memory(env):
    """Whatever a session's life left (a first document never sent, attaches that failed, its routes, its own
    writes' versions), its deletion takes it all: a long-lived operator does not grow with every session."""
    api, _, ctl = env
    start_session(env)
    api.fail["attach"] = lambda *_args: (_ for _ in ()).throw(ConnectionError("unreachable"))
    ctl.on_run(api.add_run(session_run("r1", "uid-1")), deleted=False)
    for _ in range(5):  # until the attaches that failed in a row end it: nothing is in flight after that
        settle(ctl)
        ctl.tick()
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["reason"] == "PodDeleted"
    held, book = ctl.sessions, ctl.sessions.book
    assert book.sends["sess-uid-1"].unkeyed and book.sends["sess-uid-1"].attach_failures and held._written
    ctl.on_session(api.objects.pop(("CodeRunSession", NS, "s1")), deleted=True)
    assert (NS, "s1") not in book.sessions
    by_uid = (book.pods, held._routes, held._written, book.sends, book.sending, book.channels)
    assert not any("sess-uid-1" in found for found in by_uid), by_uid


def test_a_queued_run_is_written_once_while_it_waits_however_many_runs_end_ahead_of_it(env):
    """A harness creates a session's runs all at once: each queued one's status says Queued once, not again each
    time a run ahead of it ends (80 queued runs rewritten at every end made the session five times slower)."""
    api, _, ctl = env
    serving_session(env)
    queued_writes, patch = {}, api.patch_run_status

    def counting(namespace, name, status):
        if status.get("reason") == "Queued":
            queued_writes[name] = queued_writes.get(name, 0) + 1
        return patch(namespace, name, status)
    api.patch_run_status = counting
    runs = [api.add_run(session_run(f"r{i}", f"uid-{i}", created=f"2026-11-22T10:00:0{i}Z")) for i in range(1, 6)]
    for run in runs:
        ctl.on_run(run, deleted=False)
    for _ in runs:
        settle(ctl)
    assert [api.run(NS, f"r{i}")["status"]["phase"] for i in range(1, 6)] == ["Succeeded"] * 5
    assert queued_writes and max(queued_writes.values()) == 1, queued_writes


# ---------------------------------------------------------------- a sandbox that never starts
def pending_pod(api, created, **status):
    pod = copy.deepcopy(api.objects[("Pod", NS, POD)])
    pod["metadata"]["creationTimestamp"] = created
    pod["status"] = {"phase": "Pending", **status}
    api.objects[("Pod", NS, POD)] = pod
    return pod


def test_a_session_whose_sandbox_cannot_start_ends_saying_why_and_its_queued_run_is_refused(env):
    """As a cold run's pod: an image that cannot be had ends it at once, as do limits no node has; anything else
    that keeps the pod from starting ends it at the policy's start deadline. Never Pending until its lifetime."""
    api, clock, ctl = env
    ctl.on_session(api.add_session(make_session()), deleted=False)
    ctl.on_run(api.add_run(session_run("r1", "uid-1")), deleted=False)
    ctl.on_pod(pending_pod(api, "2026-11-22T10:00:00Z", containerStatuses=[{"name": "run", "state": {"waiting": {
        "reason": "ErrImageNeverPull", "message": "image is not present with pull policy of Never"}}}]),
               deleted=False)
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (status["phase"], status["reason"]) == ("Ended", "StartFailed"), status
    assert "could not start (ErrImageNeverPull): image is not present" in status["message"], status
    assert ("Pod", NS, POD) not in api.objects  # its pod goes with it
    run = api.run(NS, "r1")["status"]
    assert (run["phase"], run["reason"]) == ("Rejected", "SessionEnded"), run
    assert "StartFailed" in run["message"], run


def test_a_session_asking_more_than_any_node_has_ends_at_once_naming_the_limit(env):
    api, _, ctl = env
    ctl.on_session(api.add_session(make_session()), deleted=False)
    pod = pending_pod(api, "2026-11-22T10:00:00Z", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes available"}])
    pod["spec"]["containers"][0]["resources"]["requests"]["memory"] = "64Gi"
    ctl.on_pod(pod, deleted=False)
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (status["phase"], status["reason"]) == ("Ended", "StartFailed"), status
    assert "but the largest node offers 8192Mi; lower the session's spec.limits.memory" in status["message"], status


def test_a_session_whose_sandbox_is_not_started_by_the_start_deadline_ends_then_not_before(env):
    api, clock, ctl = env
    ctl.on_session(api.add_session(make_session()), deleted=False)
    created = clock.now
    ctl.on_pod(pending_pod(api, created.strftime("%Y-%m-%dT%H:%M:%SZ")), deleted=False)
    clock.now = created + timedelta(seconds=299)
    ctl.sessions.tick(lambda: None)
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["phase"] == "Pending"
    clock.now = created + timedelta(seconds=301)
    ctl.sessions.tick(lambda: None)
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (status["phase"], status["reason"]) == ("Ended", "StartFailed"), status
    assert "did not start within 300s" in status["message"], status


def test_a_pending_session_says_why_its_pod_waits_as_soon_as_the_scheduler_says_it(env):
    api, clock, ctl = env
    ctl.on_session(api.add_session(make_session()), deleted=False)
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["message"].endswith("waiting for it to start")
    ctl.on_pod(pending_pod(api, clock.now.strftime("%Y-%m-%dT%H:%M:%SZ"), conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/1 nodes are available: 1 Insufficient cpu."}]), deleted=False)
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (status["phase"], status["reason"]) == ("Pending", "PodCreated"), status
    assert "not yet scheduled: 0/1 nodes are available: 1 Insufficient cpu. It waits" in status["message"], status
    assert "up to 300s from its creation, then the session ends StartFailed; lower the session's spec.limits" \
        in status["message"], status


# ---------------------------------------------------------------- a warm pool pod for a session
WARM_SESSIONS = {**POLICY, "spec": {**POLICY["spec"], "warmPool": {"size": 1, "languages": ["python"],
                                                                   "cpuRequest": "100m"}}}


def warm_env(env):
    api, _, ctl = env
    api.policies = [copy.deepcopy(WARM_SESSIONS)]
    ctl.on_policy(copy.deepcopy(WARM_SESSIONS), deleted=False)
    return start_pool(env)


def test_a_session_takes_a_warm_pool_pod_its_limits_fit_and_runs_there(env):
    """The pod becomes the session's (its labels, its owner, its lifetime as the deadline), leaves the pool, which
    starts another, and the session's first document makes its runner the session's."""
    api, clock, ctl = env
    (pool_pod,) = warm_env(env)
    ctl.on_session(api.add_session(make_session()), deleted=False)
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (status["podName"], status["startMode"]) == (pool_pod, "Warm"), status
    assert status["message"] == f"warm sandbox pod {pool_pod} claimed"
    pod = api.objects[("Pod", NS, pool_pod)]
    labels = pod["metadata"]["labels"]
    # the pool's labels stay beside the session's (the pool's NetworkPolicy keeps its routes while the plugin
    # catches up with the session's), yet the pool no longer counts it
    assert labels["coderun.io/session-uid"] == "sess-uid-1" and "coderun.io/pool" in labels, labels
    assert [(o["kind"], o["uid"]) for o in pod["metadata"]["ownerReferences"]] == [("CodeRunSession", "sess-uid-1")]
    # started 60 s before the claim: the session's lifetime (the policy's cap, 3600) from now, and the margin
    assert pod["spec"]["activeDeadlineSeconds"] == 60 + 3600 + 60
    # the pool reserved 100m while it waited: the session gets its whole limit, less a millicore (same QoS class)
    resources = pod["spec"]["containers"][0]["resources"]
    assert (resources["limits"]["cpu"], resources["requests"]["cpu"]) == ("1", "999m"), resources
    ctl.pool.refill()
    assert len(pool_pods(api)) == 1 and pool_pod not in pool_pods(api)  # the pool starts a pod in its place
    ctl.on_pod(copy.deepcopy(pod), deleted=False)
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["phase"] == "Ready"
    state, answer = runner(api)
    api.attach_answers[pool_pod] = answer
    for i in (1, 2):
        ctl.on_run(api.add_run(session_run(f"r{i}", f"uid-{i}", created=f"2026-11-22T10:00:0{i}Z")), deleted=False)
        settle(ctl)
    assert [api.run(NS, f"r{i}")["status"]["podName"] for i in (1, 2)] == [pool_pod] * 2
    assert [api.run(NS, f"r{i}")["status"]["phase"] for i in (1, 2)] == ["Succeeded"] * 2
    assert state["key"] is not None and state["sequence"] == 1  # the first document carried the session's key


def test_a_pool_pod_someone_fed_first_is_not_a_sessions_it_goes_and_the_session_starts_its_own(env):
    """Its runner announced an input no claim sent (someone with pods/attach wrote to its stdin): the session
    would end at its first run there. The pod is deleted (the pool starts another) and the session gets a pod of
    its own."""
    api, clock, ctl = env
    (pool_pod,) = warm_env(env)
    api.logs[pool_pod] = ("CODERUN-ACCEPTED 0123456789abcdef\n", True)
    ctl.on_session(api.add_session(make_session()), deleted=False)
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert status["podName"] == POD and status.get("startMode") != "Warm", status
    assert ("Pod", NS, pool_pod) not in api.objects
    ctl.pool.refill()
    assert len(pool_pods(api)) == 1 and pool_pod not in pool_pods(api)


def test_an_operator_restarted_between_a_claim_and_the_sessions_status_keeps_the_claimed_pod(env):
    """The claim landed, the status write did not (the operator stopped). A new operator that sees the session
    before its pod (the watches keep no order between them) finds the pod by the session's label, and claims no
    second one; a pod that carries the session's label but is not the pod its status names is not its sandbox."""
    api, clock, ctl = env
    (claimed,) = warm_env(env)
    patch = api.patch_session_status
    api.patch_session_status = lambda ns, name, status: None
    ctl.on_session(api.add_session(make_session()), deleted=False)
    api.patch_session_status = patch
    assert api.objects[("Pod", NS, claimed)]["metadata"]["labels"]["coderun.io/session-uid"] == "sess-uid-1"
    (spare,) = start_pool(env)  # the pool's next pod, ready
    restarted = Controller(api=api, clock=clock)
    restarted.session_runs.later = Later()
    restarted.on_policy(copy.deepcopy(WARM_SESSIONS), deleted=False)
    restarted.on_pod(copy.deepcopy(api.objects[("Pod", NS, spare)]), deleted=False)
    restarted.on_session(copy.deepcopy(api.objects[("CodeRunSession", NS, "s1")]), deleted=False)
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert status["podName"] == claimed, status
    assert "coderun.io/session-uid" not in api.objects[("Pod", NS, spare)]["metadata"]["labels"]
    stray = copy.deepcopy(api.objects[("Pod", NS, spare)])
    stray["metadata"]["labels"]["coderun.io/session-uid"] = "sess-uid-1"  # someone copies the label
    restarted.on_pod(stray, deleted=False)
    assert restarted.sessions.book.pods["sess-uid-1"]["metadata"]["name"] == claimed


def test_a_session_whose_limits_the_pool_does_not_hold_gets_a_pod_of_its_own(env):
    api, _, ctl = env
    (pool_pod,) = warm_env(env)
    ctl.on_session(api.add_session(make_session(limits={"memory": "512Mi"})), deleted=False)
    status = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (status["podName"], status["startMode"]) == (POD, "Cold"), status
    assert pool_pod in pool_pods(api)


def test_whether_the_audit_waits_for_a_runs_record_is_the_sessions_spec_not_the_pods(env):
    """A keepState session's interpreter outlives each run: the agent is not made to wait for a record it keeps
    open. That is read from the session's spec (immutable), whatever the pod says: a warm pool pod's runner was
    not started with --keep-state, and anyone who may patch pods could write a pod's annotations."""
    api, _, ctl = env
    for name, uid, keep in (("s1", "sess-uid-1", True), ("s2", "sess-uid-2", False)):
        ctl.on_session(api.add_session(make_session(name, uid, keepState=keep)), deleted=False)
    keep_run, fresh_run = session_run("r1", "uid-1"), session_run("r2", "uid-2")
    fresh_run["spec"]["session"] = "s2"
    assert ctl.session_runs.keeps_state(keep_run) is True and ctl.session_runs.keeps_state(fresh_run) is False
    assert ctl.session_runs.keeps_state(make_run("r3", "uid-3")) is False  # not in a session
    asked = []
    agent = type("Agent", (), {"ask": lambda self, pod, since, wait: asked.append(wait) or "answer"})()
    pod = {"metadata": {"name": "p", "annotations": {"coderun.io/keep-state": "true"}}, "spec": {}}
    assert ask_agent(agent, fresh_run, pod, ctl.session_runs.keeps_state(fresh_run)) == "answer" and asked == [True]


def test_an_unclaimed_pool_pod_past_its_idle_time_is_replaced_though_its_deadline_has_room_for_a_session(env):
    api, clock, ctl = env
    (pool_pod,) = warm_env(env)
    assert api.objects[("Pod", NS, pool_pod)]["spec"]["activeDeadlineSeconds"] == 3600 + 3600 + 60
    clock.now = T0 + timedelta(seconds=3539)  # started at 09:59: 59 s short of its hour
    ctl.pool.refill()
    assert pool_pod in pool_pods(api)
    clock.now = T0 + timedelta(seconds=3541)
    ctl.pool.refill()
    assert pool_pod not in pool_pods(api) and ("Pod", NS, pool_pod) not in api.objects


# ---------------------------------------------------------------- one attach, few writes
def test_a_run_whose_document_is_on_its_way_keeps_the_session_busy():
    """The session is marked Busy with the run's name before the run's own status says it started: a refresh
    in between (the Busy write's own echo) must not read Ready and write it."""
    session = make_session()
    session["status"] = {"phase": "Busy", "podName": POD, "idleTimeoutSeconds": 60, "currentRun": "r1",
                         "startTime": "2026-11-22T10:00:00Z", "expiresAt": "2026-11-22T11:00:00Z"}
    pod = {"metadata": {"name": POD}, "status": {"containerStatuses": [{"name": "run", "state": {"running": {}}}]}}
    waiting = session_run("r1", "uid-1")  # its status not written yet
    now = T0 + timedelta(seconds=30)
    assert compute_session_status(session, pod, [waiting], now).phase == "Ready"
    busy = compute_session_status(session, pod, [waiting], now, sending="uid-1")
    assert (busy.phase, busy.current_run) == ("Busy", "r1")
    finished = {**waiting, "status": {"phase": "Succeeded"}}
    assert compute_session_status(session, pod, [finished], now, sending="uid-1").phase == "Ready"
    # deleted while its document is on its way: the sandbox is still its until the exchange ends
    gone = compute_session_status(session, pod, [], now, sending="uid-1")
    assert (gone.phase, gone.current_run) == ("Busy", "r1")


def test_runs_of_a_session_go_over_one_attach_with_one_session_write_each_and_late_echoes_write_nothing(env):
    """A run's start writes its session only to reserve the next block of sequence numbers (once in 64 runs); a
    short run's end writes the count and the idle clock."""
    api, _, ctl = env
    state = serving_session(env)
    written, patch = [], api.patch_session_status

    def recording(namespace, name, status):
        result = patch(namespace, name, status)
        written.append(copy.deepcopy(result))
        return result
    api.patch_session_status = recording
    attaches = api.calls.count("attach")
    for i in range(1, 4):
        ctl.on_run(api.add_run(session_run(f"r{i}", f"uid-{i}", created=f"2026-11-22T10:00:0{i}Z")), deleted=False)
        settle(ctl)
        ctl.session_runs.later.run()  # a quarter second on, the run is over: no Busy to write
        assert api.run(NS, f"r{i}")["status"]["phase"] == "Succeeded"
    assert state["codes"] == ["print(6*7)"] * 3 and state["sequence"] == 2
    assert api.calls.count("attach") - attaches == 1  # the first run's attach served all three
    assert [(w["status"]["phase"], w["status"]["runsDone"], w["status"]["documentsReserved"]) for w in written] == [
        ("Ready", 0, 64), ("Ready", 1, 64), ("Ready", 2, 64), ("Ready", 3, 64)]
    # The watch delivers each write late, in order: none of them is written back over the newer status.
    for echo in written:
        ctl.on_session(copy.deepcopy(echo), deleted=False)
    assert len(written) == 4
    session = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (session["phase"], session["runsDone"], session["documentsReserved"]) == ("Ready", 3, 64)


def test_the_echo_of_the_sessions_last_write_coming_while_the_next_run_is_in_writes_nothing(env):
    """Runs one after another: the watch brings the session's Ready (written after r1) while r2 is in the
    sandbox. Nothing changed that the operator did not write: r2, short, costs the session no Busy."""
    api, _, ctl = env
    gate = threading.Event()
    serving_session(env, gate)
    gate.set()
    ctl.on_run(api.add_run(session_run("r1", "uid-1")), deleted=False)
    settle(ctl)
    echo = copy.deepcopy(api.objects[("CodeRunSession", NS, "s1")])
    assert (echo["status"]["phase"], echo["status"]["runsDone"]) == ("Ready", 1)
    written, patch = [], api.patch_session_status
    api.patch_session_status = lambda namespace, name, status: written.append(status) or patch(namespace, name, status)
    gate.clear()
    ctl.on_run(api.add_run(session_run("r2", "uid-2", created="2026-11-22T10:00:02Z")), deleted=False)
    ctl.on_session(echo, deleted=False)
    assert written == []
    gate.set()
    settle(ctl)
    assert [(w.get("phase"), w.get("runsDone")) for w in written] == [("Ready", 2)]


def test_queued_runs_cost_the_session_no_write_each_and_a_busy_write_counts_the_runs_done(env):
    """A harness's runs, queued at once: a run's end hands the sandbox to the next run, and the session is not
    written between them; a run still in the sandbox a quarter second on writes Busy with the count, and the
    last run's end writes Ready."""
    api, _, ctl = env
    gate = threading.Event()
    serving_session(env, gate)
    written, patch = [], api.patch_session_status

    def recording(namespace, name, status):
        result = patch(namespace, name, status)
        written.append(copy.deepcopy(result["status"]))
        return result
    api.patch_session_status = recording
    for i in range(1, 5):
        ctl.on_run(api.add_run(session_run(f"r{i}", f"uid-{i}", created=f"2026-11-22T10:00:0{i}Z")), deleted=False)
    ctl.session_runs.later.run()  # r1 is still in the sandbox a quarter second on
    gate.set()
    for _ in range(4):
        settle(ctl)
    ctl.session_runs.later.run()  # r2, r3, r4 ended within theirs
    assert [api.run(NS, f"r{i}")["status"]["phase"] for i in range(1, 5)] == ["Succeeded"] * 4
    assert [(w["phase"], w.get("currentRun"), w["runsDone"]) for w in written] == [
        ("Ready", None, 0), ("Busy", "r1", 0), ("Ready", None, 4)]  # the reservation, r1's Busy, the end
    # Nothing is left for a refresh to write: the last write said what it would.
    ctl.sessions.tick(lambda: None)
    assert len(written) == 3


def test_the_next_run_goes_once_the_one_before_finished_though_the_session_still_reads_busy(env):
    """In a harness's back-to-back runs the next run's event can come before the session's Ready is written:
    the runs before it are finished, so it goes (the attach is free) rather than wait for that write."""
    api, _, ctl = env
    gate = threading.Event()
    serving_session(env, gate)
    patch = api.patch_session_status
    api.patch_session_status = lambda ns, name, status: (
        copy.deepcopy(api.objects[("CodeRunSession", ns, name)]) if status.get("phase") == "Ready" else
        patch(ns, name, status))  # Ready "still on its way": never lands
    ctl.on_run(api.add_run(session_run("r1", "uid-1")), deleted=False)
    ctl.session_runs.later.run()  # r1 lasts: Busy
    gate.set()
    settle(ctl)
    assert api.run(NS, "r1")["status"]["phase"] == "Succeeded"
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["phase"] == "Busy"
    ctl.on_run(api.add_run(session_run("r2", "uid-2", created="2026-11-22T10:00:02Z")), deleted=False)
    settle(ctl)
    assert api.run(NS, "r2")["status"]["phase"] == "Succeeded"


def test_the_attach_goes_with_the_sessions_pod(env):
    api, _, ctl = env
    serving_session(env)
    ctl.on_run(api.add_run(session_run("r1", "uid-1")), deleted=False)
    settle(ctl)
    (channel,) = ctl.sessions.book.channels.values()
    held = channel._attached
    assert held is not None and not held.closed
    ctl.on_pod(copy.deepcopy(api.objects[("Pod", NS, POD)]), deleted=True)
    assert held.closed and not ctl.sessions.book.channels


def test_a_runs_end_wakes_the_next_run_only_and_a_sessions_end_wakes_every_one(env):
    """A harness queues its runs at once: each run's end looks at the run next in line, not at every queued run
    (80 queued runs looked at on each of the session's events cost the operator ~80 steps a run)."""
    api, _, ctl = env
    serving_session(env)
    stepped, decide, follow = [], ctl.session_runs.decide, ctl.session_runs.follow  # a session run's steps
    ctl.session_runs.decide = lambda run: stepped.append(run["metadata"]["name"]) or decide(run)
    ctl.session_runs.follow = lambda run: stepped.append(run["metadata"]["name"]) or follow(run)
    runs = [api.add_run(session_run(f"r{i}", f"uid-{i}", created=f"2026-11-22T10:00:{i:02d}Z"))
            for i in range(1, 11)]
    for run in runs:
        ctl.on_run(run, deleted=False)
    for _ in runs:
        settle(ctl)
    assert [api.run(NS, f"r{i}")["status"]["phase"] for i in range(1, 11)] == ["Succeeded"] * 10
    assert len(stepped) <= 3 * len(runs), stepped
    # Queued runs of a session that ends are each refused, saying why.
    gate, answer = threading.Event(), api.attach_answers[POD]
    api.attach_answers[POD] = lambda document: (gate.wait(5), answer(document))[1]
    for i in range(11, 14):
        ctl.on_run(api.add_run(session_run(f"r{i}", f"uid-{i}", created=f"2026-11-22T10:00:{i:02d}Z")), deleted=False)
    ctl.on_pod(api.objects.pop(("Pod", NS, POD)), deleted=True)  # evicted while r11 runs
    gate.set()
    settle(ctl)
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["reason"] == "PodDeleted"
    assert [api.run(NS, f"r{i}")["status"]["reason"] for i in (12, 13)] == ["SessionEnded"] * 2


def test_a_failed_reservation_leaves_the_run_queued_and_the_session_free(env):
    """The API server refuses the write that reserves the run's number (a 503): nothing was sent, the session
    is not left Busy for it, and the run goes at its next step."""
    from fake_k8s import Transient
    api, _, ctl = env
    state = serving_session(env)
    patch, failures = api.patch_session_status, [1]

    def flaky(namespace, name, status):
        if failures and "documentsReserved" in status:
            failures.pop()
            raise Transient("the status of CodeRunSession s1: 503")
        return patch(namespace, name, status)
    api.patch_session_status = flaky
    ctl.on_run(api.add_run(session_run("r1", "uid-1")), deleted=False)
    settle(ctl)
    assert not failures and state["codes"] == []  # refused, and nothing went
    assert not ctl.sessions.book.sending and (api.run(NS, "r1").get("status") or {}).get("phase") != "Running"
    ctl.reconcile("uid-1")  # the retry
    settle(ctl)
    assert api.run(NS, "r1")["status"]["phase"] == "Succeeded"
    assert api.objects[("CodeRunSession", NS, "s1")]["status"]["phase"] == "Ready"


def test_a_failed_busy_write_costs_the_run_nothing(env):
    """The Busy write of a run that lasts is words in a status: refused (a 503), the run still ends with its
    result and the session is written Ready after it."""
    from fake_k8s import Transient
    api, _, ctl = env
    gate = threading.Event()
    serving_session(env, gate)
    patch, refused = api.patch_session_status, []

    def flaky(namespace, name, status):
        if status.get("phase") == "Busy":
            refused.append(status)
            raise Transient("the status of CodeRunSession s1: 503")
        return patch(namespace, name, status)
    api.patch_session_status = flaky
    ctl.on_run(api.add_run(session_run("r1", "uid-1")), deleted=False)
    ctl.session_runs.later.run()
    assert [r["currentRun"] for r in refused] == ["r1"]
    gate.set()
    settle(ctl)
    assert api.run(NS, "r1")["status"]["phase"] == "Succeeded"
    session = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (session["phase"], session["runsDone"]) == ("Ready", 1)


def test_a_run_deleted_on_its_way_hands_the_sandbox_to_the_next_as_its_exchange_ends(env):
    api, _, ctl = env
    gate = threading.Event()
    serving_session(env, gate)
    ctl.on_run(api.add_run(session_run("r1", "uid-1")), deleted=False)
    ctl.on_run(api.add_run(session_run("r2", "uid-2", created="2026-11-22T10:00:02Z")), deleted=False)
    ctl.on_run(api.objects.pop(("CodeRun", NS, "r1")), deleted=True)  # deleted while its program runs
    ctl.session_runs.later.run()  # a quarter second on, its document is still in the sandbox
    ctl.tick()
    session = api.objects[("CodeRunSession", NS, "s1")]["status"]
    assert (session["phase"], session["currentRun"]) == ("Busy", "r1")  # the sandbox is still r1's
    assert api.run(NS, "r2")["status"]["phase"] == "Pending"
    gate.set()
    settle(ctl)
    settle(ctl)
    assert api.run(NS, "r2")["status"]["phase"] == "Succeeded"  # woken by r1's exchange ending, not a later tick


def test_a_refused_run_ahead_in_the_queue_hands_the_turn_to_the_next_at_once(env):
    """Someone else names the session first: their run, first in creation order, is refused when its event
    comes, and the caller's run that waited its turn behind it goes then, not at the next tick."""
    api, _, ctl = env
    serving_session(env)
    theirs = session_run("theirs", "uid-1")
    theirs["metadata"]["annotations"] = {"coderun.io/created-by": "mallory"}
    theirs = api.add_run(theirs)
    ctl.on_run(api.add_run(session_run("mine", "uid-2", created="2026-11-22T10:00:02Z")), deleted=False)
    assert "waits its turn" in api.run(NS, "mine")["status"]["message"]
    ctl.on_run(theirs, deleted=False)
    settle(ctl)
    assert api.run(NS, "theirs")["status"]["reason"] == "SessionForbidden"
    assert api.run(NS, "mine")["status"]["phase"] == "Succeeded"


def test_a_run_whose_event_comes_late_waits_while_a_later_run_is_in_the_sandbox(env):
    api, _, ctl = env
    gate = threading.Event()
    serving_session(env, gate)
    ctl.on_run(api.add_run(session_run("r2", "uid-2", created="2026-11-22T10:00:02Z")), deleted=False)
    assert api.run(NS, "r2")["status"]["phase"] == "Running"
    ctl.sessions.book.sending.clear()  # as once r2's document is in (its frame held for the container's end, say)
    early = api.add_run(session_run("r1", "uid-1", created="2026-11-22T10:00:01Z"))
    ctl.on_run(early, deleted=False)  # r1 comes first in creation order, but the sandbox is r2's
    status = api.run(NS, "r1")["status"]
    assert (status["phase"], status["reason"]) == ("Pending", "Queued") and "to end" in status["message"]
    gate.set()
    settle(ctl)
    settle(ctl)
    assert [api.run(NS, name)["status"]["phase"] for name in ("r1", "r2")] == ["Succeeded", "Succeeded"]


def test_a_stream_thread_that_fails_on_its_way_leaves_no_run_waiting_for_it(env):
    """While a run's uid is in `streams` its reconcile waits for the thread to bring its frame: a thread that raised
    anywhere on its way (here as its document's mark is cleared, before the hand-back) must leave it, or the run
    (and its session's queue behind it) would wait for ever."""
    api, _, ctl = env
    gate = threading.Event()
    serving_session(env, gate)
    book, threads = ctl.session_runs.book, []
    clear = book.done_sending

    def failing(session_uid, run_uid):
        clear(session_uid, run_uid)
        if threads and threading.current_thread() is threads[0]:
            raise RuntimeError("failed on the stream's way")
    book.done_sending = failing
    ctl.on_run(api.add_run(session_run("r1", "uid-1")), deleted=False)
    threads.extend(ctl.session_runs.streams.values())
    assert len(threads) == 1  # the run went to its stream's thread
    gate.set()
    threads[0].join(5)
    assert not threads[0].is_alive() and "uid-1" not in ctl.session_runs.streams
