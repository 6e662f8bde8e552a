"""A run's audit as the operator gets it (docs/audit.md): the agent's summary bounded and redacted (pure), the
agent client against a fake transport (no agent, 404, a timeout, an answer too large, a good one), and the
controller over the fake API: a finished cold or warm run gets status.audit and its record ConfigMap, an
uninstalled agent gives Unavailable, and nothing the agent does fails or holds up a run's end."""
import base64
import copy
import json
import threading
import time
from urllib.parse import parse_qs, urlsplit

import pytest

from coderun.api.models import AuditStatus, CodeRunStatus
from coderun.audit.bearer import agent_bearer
from coderun_operator import audit as agent_module
from coderun_operator.audit import NOT_INSTALLED, AgentAnswer, AuditAgent, AuditSettings, container_id, since_ns
from coderun_operator.controller import Controller
from coderun_operator.policy.redact import Redactor
from coderun_operator.results import audit as results_audit
from coderun_operator.results.audit import MAX_AUDIT_BYTES, audit_status, record_text, unavailable
from coderun_operator.results.budget import json_size
from fake_k8s import FakeK8s, Transient
from support.controller import NS, T0, Clock, frame_log, make_run, pod_of, submit
from support.warm import POLICY, pool_pods, runner_answer, start_pool, submit_and_wait

KEY = b"k" * 32
AGENT_NS = "coderun-system"
CONTAINER = "ab" * 32
SETTINGS = AuditSettings(AGENT_NS, "audit-agent", "coderun-audit-key", deadline_seconds=1.0, wait_millis=500)
SUMMARY = {
    "source": "gvisor-trace", "complete": True,
    "filesRead": [{"path": "data/visits.csv", "count": 1}, {"path": "/tmp/config", "count": 2}],
    "filesWritten": [{"path": "/tmp/outputs/plot.png", "count": 1, "bytes": 2048}],
    "outsideWorkdir": {"reads": 214, "writes": 0, "denied": 1, "examples": ["/etc/passwd"]},
    "connectAttempts": [{"family": "inet", "address": "10.96.0.1", "port": 443, "result": "timedOut", "count": 1}],
    "socketsOpened": [{"family": "inet", "protocol": "tcp", "result": "created", "count": 1}],
    "processes": [{"argv": ["python3", "-u", "main.py"], "exitCode": 1},
                  {"argv": ["sh", "-c", "curl -H 'api_key=supersecretvalue123' x"], "exitCode": 127}],
    "counts": {"processes": 2, "failedExecs": 1, "connectAttempts": 1, "syscallsDenied": 1, "openat2": 0,
               "addressedSends": 0, "pointsLost": 0, "pointsUnknown": 0},
    "runner": {"filesRead": 2, "filesWritten": 1, "processes": 2},
}
RECORD = "".join(json.dumps(p) + "\n" for p in (
    {"point": "syscall/openat/exit", "path": "/tmp/work/data/visits.csv"},
    {"point": "sentry/execve", "argv": ["sh", "-c", "curl -H 'api_key=supersecretvalue123' x"]}))


# ------------------------------------------------------------------ the pure part
def test_a_summary_keeps_what_the_api_declares_bounded_and_redacted():
    hostile = copy.deepcopy(SUMMARY)
    hostile["filesRead"] += [{"path": f"/tmp/f{i}", "count": 1} for i in range(100)]
    hostile["filesRead"].append("not a row")
    hostile["processes"][0]["argv"] += ["\x1b]0;title\x07" + "a" * 1000]
    hostile["connectAttempts"][0].update(port=70000, family="inet; rm -rf", extra="dropped")
    hostile["counts"]["pointsLost"] = -5
    hostile["injected"] = {"anything": True}
    audit, redactions = audit_status(hostile, Redactor())
    AuditStatus.model_validate(audit)  # the API's own bounds hold
    assert "injected" not in audit and len(audit["filesRead"]) == 50 and audit["omitted"]["filesRead"] == 53
    assert audit["processes"][1]["argv"][2] == "curl -H 'api_key=[REDACTED:credential]' x" and redactions == 1
    arg = audit["processes"][0]["argv"][-1]
    assert len(arg) == 256 and arg.startswith("\\x1b]0;title\\x07") and arg.endswith("…")
    assert audit["connectAttempts"][0] == {"family": "other", "address": "10.96.0.1", "result": "timedOut", "count": 1}
    assert audit["counts"]["pointsLost"] == 0 and audit["complete"] is True


def test_a_policy_s_own_pattern_redacts_paths_too():
    audit, n = audit_status(SUMMARY, Redactor([r"visits"]))
    assert audit["filesRead"][0]["path"] == "data/[REDACTED:policy].csv" and n == 2  # and the argv's key


def test_the_whole_audit_is_cut_to_its_byte_bound_counting_what_went():
    big = copy.deepcopy(SUMMARY)
    big["processes"] = [{"argv": [f"{i}" + "x" * 250] * 16, "exitCode": 0} for i in range(50)]
    audit, _ = audit_status(big, Redactor())
    assert json_size(audit) <= MAX_AUDIT_BYTES
    assert len(audit["processes"]) + audit["omitted"]["processes"] == 50


@pytest.mark.parametrize("summary", [None, [], {"source": "gvisor-trace", "complete": False,
                                                "message": "no trace of this container reached the audit agent"},
                                     {"source": "other", "counts": {}}])
def test_a_summary_that_is_not_one_is_unavailable_never_an_empty_audit(summary):
    audit, _ = audit_status(summary, Redactor())
    assert audit["source"] == "Unavailable" and "no summary" in audit["message"]
    AuditStatus.model_validate(audit)


def test_the_record_is_redacted_point_by_point_and_cut_at_a_line(monkeypatch):
    text, cut = record_text(RECORD + "not json api_key=supersecretvalue123\n", Redactor())
    lines = text.splitlines()
    assert json.loads(lines[1])["argv"][2] == "curl -H 'api_key=[REDACTED:credential]' x"
    assert lines[2] == "not json api_key=[REDACTED:credential]" and cut == 0
    monkeypatch.setattr(results_audit, "MAX_RECORD_BYTES", len(lines[0]) + 1)
    text, cut = record_text(RECORD, Redactor())
    assert text == lines[0] + "\n" and cut == 1


def test_unavailable_is_one_bounded_line():
    audit = unavailable("why\nand \x1b[2J" + "x" * 2000)
    assert audit["source"] == "Unavailable" and "\n" not in audit["message"] and len(audit["message"]) == 1024


# ------------------------------------------------------------------ the client
class Agent:
    """The agents' HTTP endpoints: what was asked, and what each answers (status, document or bytes)."""

    def __init__(self):
        self.asked: list[str] = []
        self.answer: tuple[int, object] = (200, {"audit": SUMMARY, "record": RECORD, "recordCut": 3})
        self.before = lambda: None

    def __call__(self, method, url, bearer, body, deadline):
        assert method == "GET" and bearer == agent_bearer(KEY)
        self.asked.append(url)
        self.before()
        status, document = self.answer
        if isinstance(document, Exception):
            raise document
        return status, document if isinstance(document, bytes) else json.dumps(document).encode(), {}


def agent_pod(name="agent-a", node="node-1", ip="10.88.1.5", ready=True):
    return {"kind": "Pod", "metadata": {"name": name, "namespace": AGENT_NS,
                                        "labels": {"app.kubernetes.io/component": "audit-agent"}},
            "spec": {"nodeName": node, "containers": [{"name": "agent", "ports": [
                {"name": "audit", "containerPort": 9090}]}]},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def sandbox_pod(node="node-1", cid=f"containerd://{CONTAINER}"):
    return {"metadata": {"name": "demo-sandbox"}, "spec": {"nodeName": node},
            "status": {"containerStatuses": [{"name": "run", "containerID": cid}]}}


@pytest.fixture
def api():
    api = FakeK8s()
    api.objects[("Secret", AGENT_NS, "coderun-audit-key")] = {"data": {"key": base64.b64encode(KEY).decode()}}
    api.objects[("Pod", AGENT_NS, "agent-a")] = agent_pod()
    return api


def test_the_agent_on_the_pod_s_node_is_asked_for_the_run_container(api):
    transport = Agent()
    api.objects[("Pod", AGENT_NS, "agent-b")] = agent_pod("agent-b", "node-2", "10.88.2.5")
    answer = AuditAgent(api, SETTINGS, transport).ask(sandbox_pod(), 0)
    assert answer == AgentAnswer(SUMMARY, RECORD, 3)
    url = urlsplit(transport.asked[0])
    assert (url.netloc, url.path) == ("10.88.1.5:9090", f"/v1/containers/{CONTAINER}")
    query = parse_qs(url.query)
    assert query["since"] == ["0"] and 0 < int(query["wait"][0]) <= 500


def test_a_keep_state_sessions_run_does_not_wait_for_a_record_its_interpreter_never_completes(api):
    """Its interpreter outlives the run, so its processes are never seen ending: the agent answers at once (the
    controller says so from the session's spec: Sessions.keeps_state); any other run's answer waits for them."""
    from coderun_operator.controller.audit import ask_agent
    transport = Agent()
    agent = AuditAgent(api, SETTINGS, transport)
    assert ask_agent(agent, {"status": {}}, sandbox_pod(), True) == AgentAnswer(SUMMARY, RECORD, 3)
    assert ask_agent(agent, {"status": {}}, sandbox_pod(), False) == AgentAnswer(SUMMARY, RECORD, 3)
    assert [parse_qs(urlsplit(url).query)["wait"] for url in transport.asked] == [["0"], ["500"]]  # ms


@pytest.mark.parametrize("change, says", [
    (lambda api, agent: api.objects.pop(("Pod", AGENT_NS, "agent-a")), "no ready audit agent on node node-1"),
    (lambda api, agent: api.objects[("Pod", AGENT_NS, "agent-a")].update(agent_pod(ready=False)),
     "no ready audit agent on node node-1"),
    (lambda api, agent: api.objects.pop(("Secret", AGENT_NS, "coderun-audit-key")),
     "the audit key Secret coderun-system/coderun-audit-key has no entry 'key'"),
    (lambda api, agent: setattr(agent, "answer", (404, {"message": "unknown container"})),
     "has no trace of container abababababab"),
    (lambda api, agent: setattr(agent, "answer", (401, {"message": "bad bearer"})), "refused the operator's key"),
    (lambda api, agent: setattr(agent, "answer", (500, b"<html>")), "answered HTTP 500 without a summary"),
    (lambda api, agent: setattr(agent, "answer", (200, b"{not json")), "answered HTTP 200 without a summary"),
    (lambda api, agent: setattr(agent, "answer", (200, ConnectionError("the answer is longer than 2097152 bytes"))),
     "did not answer: ConnectionError: the answer is longer than"),
    (lambda api, agent: setattr(agent, "answer", (200, TimeoutError("the pod did not answer in time"))),
     "did not answer: TimeoutError"),
    (lambda api, agent: api.fail.__setitem__("list_pods", lambda *a: (_ for _ in ()).throw(Transient("away"))),
     "the API server could not be asked for the audit agent"),
])
def test_every_failure_is_a_reason_naming_what_to_check(api, change, says):
    transport = Agent()
    change(api, transport)
    answer = AuditAgent(api, SETTINGS, transport).ask(sandbox_pod(), 0)
    assert isinstance(answer, str) and says in answer, answer


@pytest.mark.parametrize("pod", [sandbox_pod(node=None), sandbox_pod(cid=None), sandbox_pod(cid="containerd://xyz")])
def test_a_pod_without_its_node_or_container_id_is_not_asked_about(api, pod):
    transport = Agent()
    assert "names no node or no run container id" in AuditAgent(api, SETTINGS, transport).ask(pod, 0)
    assert transport.asked == []


def test_an_agent_that_holds_the_call_costs_the_run_s_end_the_deadline_at_most(api, monkeypatch):
    monkeypatch.setattr(agent_module, "LATE_SECONDS", 0.2)
    released, transport = threading.Event(), Agent()
    transport.before = lambda: released.wait(10)  # deaf to the deadline
    began = time.monotonic()
    try:
        answer = AuditAgent(api, AuditSettings(AGENT_NS, "audit-agent", deadline_seconds=0.3), transport).ask(
            sandbox_pod(), 0)
    finally:
        released.set()
    assert time.monotonic() - began < 0.3 + 0.2 + 0.5
    assert answer == "the audit agent was not asked within 0.3 s"


def test_the_agents_are_listed_once_per_cache_and_again_once_for_a_node_missing(api):
    now = [0.0]
    agent = AuditAgent(api, SETTINGS, Agent(), clock=lambda: now[0])
    for _ in range(3):
        assert isinstance(agent.ask(sandbox_pod(), 0), AgentAnswer)
    assert api.calls.count("list_pods") == 1 and api.calls.count("read_secret") == 1
    api.objects[("Pod", AGENT_NS, "agent-b")] = agent_pod("agent-b", "node-2", "10.88.2.5")
    now[0] += 5  # a node the listing did not have: looked for again, found
    assert isinstance(agent.ask(sandbox_pod(node="node-2"), 0), AgentAnswer)
    assert api.calls.count("list_pods") == 2


def test_settings_from_the_environment_and_the_key_made_once():
    assert AuditSettings.from_env({}) is None
    settings = AuditSettings.from_env({"CODERUN_AUDIT_AGENT": "coderun-system/audit-agent",
                                       "CODERUN_AUDIT_KEY_CREATE": "true", "CODERUN_AUDIT_DEADLINE_SECONDS": "5",
                                       "CODERUN_AUDIT_WAIT_MILLIS": "nonsense"})
    assert (settings.namespace, settings.component, settings.key_secret) == ("coderun-system", "audit-agent",
                                                                             "coderun-audit-key")
    assert (settings.create_key, settings.deadline_seconds, settings.wait_millis) == (True, 5.0, 1000)
    api = FakeK8s()
    AuditAgent(api, settings).ensure_key()
    made = api.objects[("Secret", AGENT_NS, "coderun-audit-key")]
    assert len(base64.b64decode(made["data"]["key"])) == 32
    AuditAgent(api, settings).ensure_key()
    assert api.objects[("Secret", AGENT_NS, "coderun-audit-key")] == made


def test_container_id_and_since():
    assert container_id(sandbox_pod()) == CONTAINER
    assert since_ns({"startMode": "Cold", "startTime": "2026-11-22T10:00:00Z"}) == 0
    assert since_ns({"startMode": "Warm", "startTime": "2026-11-22T10:00:00.250Z"}) == int(
        T0.timestamp() * 1e9) + 250_000_000


# ------------------------------------------------------------------ the controller
@pytest.fixture
def env(api):
    clock, transport = Clock(), Agent()
    ctl = Controller(api=api, clock=clock, audit=AuditAgent(api, SETTINGS, transport))
    return api, clock, ctl, transport


def finish_cold(api, ctl, terminated=None, frame=None, **spec):
    """The kubelet reports the run container terminated on node-1, with its id: with the runner's frame (its
    fields `frame`) unless `terminated` says how the sandbox ended without one."""
    submit((api, None, ctl), make_run(**spec))
    log, termination = frame_log(**(frame or {}))
    if terminated is None:
        terminated = {"reason": "Completed", "exitCode": 0, "message": termination}
    else:
        log = ""  # the sandbox ended before its runner could write anything
    pod = pod_of(api)
    pod["spec"]["nodeName"] = "node-1"
    api.logs[pod["metadata"]["name"]] = (log, True)
    pod["status"] = {"phase": "Running", "containerStatuses": [{
        "name": "run", "image": "coderun.local/sandbox-python:v2", "containerID": f"containerd://{CONTAINER}",
        "imageID": "coderun.local/sandbox-python@sha256:" + "f" * 64, "state": {"terminated": terminated}}]}
    ctl.on_pod(pod, deleted=False)
    ctl.on_run(copy.deepcopy(api.run(NS, "demo")), deleted=False)
    return api.run(NS, "demo")["status"]


def test_a_finished_cold_run_gets_its_audit_and_its_record_before_its_status(env):
    api, _, ctl, transport = env
    status = finish_cold(api, ctl)
    audit = status["audit"]
    assert status["phase"] == "Succeeded" and audit["source"] == "gvisor-trace" and audit["complete"] is True
    assert audit["connectAttempts"][0]["address"] == "10.96.0.1" and audit["recordCut"] == 3
    assert "[REDACTED:credential]" in audit["processes"][1]["argv"][2] and status["redactions"] == 1
    assert parse_qs(urlsplit(transport.asked[0]).query)["since"] == ["0"]
    record = api.objects[("ConfigMap", NS, audit["recordConfigMap"])]
    assert audit["recordConfigMap"] == "demo-audit" and record["immutable"]
    assert record["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert "supersecretvalue123" not in record["data"]["audit.jsonl"] and len(record["data"]["audit.jsonl"].splitlines()) == 2
    creates = [a[0]["metadata"]["name"] for name, a in zip(api.calls, api.call_args) if name == "create_or_get"]
    writes = [i for i, name in enumerate(api.calls) if name == "patch_run_status"]
    assert api.calls.index("create_or_get", writes[0]) < writes[-1] and "demo-audit" in creates
    assert CodeRunStatus.model_validate(status).audit.counts.failed_execs == 1
    assert len(transport.asked) == 1  # asked once, written once


def test_an_agent_that_does_not_know_the_container_makes_the_audit_unavailable_not_the_run(env):
    api, _, ctl, transport = env
    transport.answer = (404, {"message": "no such container"})
    status = finish_cold(api, ctl)
    assert (status["phase"], status["reason"]) == ("Succeeded", "Completed")
    assert status["audit"]["source"] == "Unavailable" and "no trace of container" in status["audit"]["message"]
    assert ("ConfigMap", NS, "demo-audit") not in api.objects


def test_a_bug_in_the_client_never_ends_the_run_badly(env, monkeypatch):
    api, _, ctl, _ = env
    monkeypatch.setattr(AuditAgent, "_ask", lambda *a: 1 / 0)
    status = finish_cold(api, ctl)
    assert status["reason"] == "Completed" and "ZeroDivisionError" in status["audit"]["message"]


# containerd's OOM event after the sandbox's exit: the kubelet says Error, exit code 128, and no frame was written.
SENTRY_KILLED = {"reason": "Error", "exitCode": 128}


@pytest.mark.parametrize("node_says, reason", [(True, "OOMKilled"), (False, "InternalError"), (None, "InternalError")])
def test_a_sandbox_ended_without_a_frame_is_oom_killed_when_the_node_counted_an_oom_kill(env, node_says, reason):
    api, _, ctl, transport = env
    connection = {"closed": True} if node_says is None else {"closed": True, "oomKilled": node_says}
    transport.answer = (200, {"audit": {**SUMMARY, "complete": False}, "record": RECORD, "connection": connection})
    status = finish_cold(api, ctl, terminated=SENTRY_KILLED, limits={"memory": "128Mi"})
    assert (status["phase"], status["reason"]) == ("Failed", reason)
    if reason == "OOMKilled":
        assert "128Mi" in status["message"] and status["signal"] == 9
    else:
        assert "exit code 128" in status["message"]
    assert status["audit"]["source"] == "gvisor-trace" and len(transport.asked) == 1


KILLED = {"reason": "Signaled", "signal": 9, "exitCode": None, "stdout": "", "oomKilled": False}


@pytest.mark.parametrize("frame, node_says, reason", [
    (KILLED, True, "OOMKilled"),     # a stub of the program was OOM-killed; containerd's event came after the exit
    (KILLED, False, "Signaled"),
    ({"reason": "Completed", "exitCode": 0}, True, "Completed"),  # the count is the pod's: only a death it explains
    ({"reason": "Timeout", "signal": 9, "exitCode": None}, True, "Timeout"),  # the runner's own kill
])
def test_a_program_killed_by_a_sigkill_the_runner_did_not_send_takes_the_nodes_oom_word(env, frame, node_says, reason):
    api, _, ctl, transport = env
    transport.answer = (200, {"audit": SUMMARY, "record": RECORD, "connection": {"closed": True, "oomKilled": node_says}})
    status = finish_cold(api, ctl, frame=frame, limits={"memory": "128Mi"})
    assert status["reason"] == reason


def test_the_nodes_oom_word_is_taken_only_as_a_boolean_true():
    for connection in ({"oomKilled": "true"}, {"oomKilled": 1}, ["oomKilled"], None):
        answer = AuditAgent(FakeK8s(), SETTINGS)._answer("p", "node-1", CONTAINER, 200, json.dumps(
            {"audit": SUMMARY, "connection": connection}).encode())
        assert answer.oom_killed is False
    answer = AuditAgent(FakeK8s(), SETTINGS)._answer("p", "node-1", CONTAINER, 200, json.dumps(
        {"audit": SUMMARY, "connection": {"closed": True, "oomKilled": True}}).encode())
    assert answer.oom_killed is True


@pytest.mark.parametrize("said", [None, "3 trace points were lost"])
def test_why_the_agent_ended_a_sandboxs_connection_is_in_the_audits_message(env, said):
    api, _, ctl, transport = env
    summary = {**SUMMARY, "complete": False, **({"message": said} if said else {})}
    transport.answer = (200, {"audit": summary, "record": RECORD,
                              "connection": {"closed": True, "error": "a header size 4 (at least 8)"}})
    audit = finish_cold(api, ctl)["audit"]
    assert audit["complete"] is False and "ended this sandbox's trace connection (a header size 4" in audit["message"]
    assert audit["message"].startswith(said or "the node's audit agent")


def test_a_connection_that_ended_without_an_error_adds_nothing_to_the_message():
    answer = AuditAgent(FakeK8s(), SETTINGS)._answer("p", "node-1", CONTAINER, 200, json.dumps(
        {"audit": SUMMARY, "connection": {"closed": True}}).encode())
    assert answer.summary == SUMMARY


def test_without_an_agent_installed_the_audit_says_so(api):
    ctl = Controller(api=api, clock=Clock())
    status = finish_cold(api, ctl)
    assert status["audit"] == {"source": "Unavailable", "message": NOT_INSTALLED}


def test_a_run_answered_from_the_cache_gets_no_audit(env):
    api, clock, ctl, transport = env
    assert finish_cold(api, ctl, cache={"enabled": True})["audit"]["source"] == "gvisor-trace"
    again = submit((api, clock, ctl), make_run("again", "uid-2", cache={"enabled": True}))["status"]
    assert again["cachedFrom"] == "demo" and "audit" not in again and len(transport.asked) == 1


def test_a_warm_run_is_asked_about_from_its_claim(api):
    clock, transport = Clock(), Agent()
    ctl = Controller(api=api, clock=clock, audit=AuditAgent(api, SETTINGS, transport))
    ctl.on_policy(copy.deepcopy(POLICY), deleted=False)
    names = start_pool((api, clock, ctl))
    for name in names:
        pod = api.objects[("Pod", NS, name)]
        pod["spec"]["nodeName"] = "node-1"
        pod["status"]["containerStatuses"][0]["containerID"] = f"containerd://{CONTAINER}"
        api._stamp(pod)
        ctl.on_pod(copy.deepcopy(pod), deleted=False)
        api.attach_answers[name] = runner_answer()
    status = submit_and_wait((api, clock, ctl), make_run())["status"]
    assert status["startMode"] == "Warm" and status["audit"]["source"] == "gvisor-trace"
    claimed = since_ns(status)
    assert claimed > 0 and parse_qs(urlsplit(transport.asked[0]).query)["since"] == [str(claimed)]
    assert api.objects[("ConfigMap", NS, "demo-audit")]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert not any(p["metadata"]["name"] == status["podName"] for p in pool_pods(api).values())
