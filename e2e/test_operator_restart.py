"""The operator killed with SIGKILL mid-flight loses nothing: every run ends with its true result, one pod each."""

from conftest import APPROVER_VERBS, CREATOR_VERBS, PodCensus, create_as, grant, wait_for
from framework.policy import apply_policy, status_of

from coderun.api.models import GROUP, PLURAL, VERSION




def test_sigkilled_operator_resumes_every_run_with_one_pod_each(operator, namespace):
    """...and decides every run by the namespace's policy: the new leader admits nothing before it has listed
    the policies (the third attack: a run without policyRef could get the built-in baseline after a leader
    change, and with it what the namespace denies)."""
    apply_policy(operator, namespace, "default",
                 {"admission": "Record", "codeRules": {"deniedPythonImports": ["socket"]}})
    census = PodCensus(operator, namespace)
    small = {"cpu": "500m", "timeoutSeconds": 30}
    expected = {}
    try:
        for i in range(3):
            name = operator.create_run(namespace, {"language": "python", "limits": small,
                                                   "code": f"import time\ntime.sleep(2)\nprint({i} * 11)"})
            expected[name] = f"{i * 11}\n"
        wait_for(lambda: any((operator.get_run(namespace, n).get("status") or {}).get("podName") for n in expected),
                 60, "a run to have its pod")
        operator.operator.control("kill")
        # While the operator is down: runs keep running, and new ones arrive with no status at all.
        for i in range(3, 5):
            name = operator.create_run(namespace, {"language": "python", "limits": small,
                                                   "code": f"print({i} * 11)"})
            expected[name] = f"{i * 11}\n"
        denied = operator.create_run(namespace, {"language": "python", "limits": small,
                                                 "code": "import socket\nprint('the baseline decided')"})
        wait_for(lambda: any(p.status.container_statuses and p.status.container_statuses[0].state.terminated
                             for p in operator.core.list_namespaced_pod(namespace).items),
                 60, "a run's program to finish while the operator is down")
        operator.operator.control("start")
        results = {name: operator.wait_run(namespace, name, timeout=120)["status"] for name in expected}
        refused = operator.wait_run(namespace, denied, timeout=120)["status"]
    finally:
        operator.operator.control("start")
        census.stop()
    for name, status in results.items():
        assert (status["phase"], status["stdout"]) == ("Succeeded", expected[name]), (name, status)
        assert len(census.pods_by_run[name]) == 1, (name, census.pods_by_run[name])
        assert status["policy"] == "default", (name, status["policy"])
    assert (refused["phase"], refused["policy"]) == ("Rejected", "default"), refused
    assert "socket" in refused["message"] and not census.pods_by_run[denied], refused


def test_with_the_operator_and_its_webhook_down_the_approval_gate_holds(operator, namespace):
    """The gate is the API server's own (a ValidatingAdmissionPolicy), not the operator's webhook: with every
    replica down (the webhook too, failurePolicy Ignore) a run that needs approval is still created, its creator
    still cannot approve it, and once the operator is back it waits; only another approver's word runs it."""
    apply_policy(operator, namespace, "default", {"approval": {"required": "Always"}})
    grant(operator, namespace, "alice", CREATOR_VERBS)
    grant(operator, namespace, "alice", APPROVER_VERBS)  # she may approve, just not her own run
    grant(operator, namespace, "bob", APPROVER_VERBS)
    census = PodCensus(operator, namespace)
    try:
        operator.operator.control("stop")
        name = create_as(operator, "alice", namespace, {"language": "python", "code": "print('gated')"})
        forged = operator.kubectl("--as", "alice", "annotate", "crun", name, "-n", namespace,
                                  "coderun.io/approved-by=bob", check=False)
        own = operator.kubectl("--as", "alice", "annotate", "crun", name, "-n", namespace,
                               "coderun.io/approved-by=alice", check=False)
        assert forged.returncode != 0 and "approver-identity" in forged.stderr, forged.stderr
        # Her own approval is taken (she holds approve) but counts for nothing: the policy does not allow it.
        assert own.returncode == 0, own.stderr
    finally:
        operator.operator.control("start")
    waiting = wait_for(lambda: (s := status_of(operator.get_run(namespace, name))).get("reason") == "AwaitingApproval"
                       and s, 90, "the run to wait for another approver once the operator is back")
    assert "allowSelfApproval" in waiting["message"] and not census.pods_by_run[name], waiting
    operator.kubectl("--as", "bob", "annotate", "--overwrite", "crun", name, "-n", namespace,
                     "coderun.io/approved-by=bob")
    status = status_of(operator.wait_run(namespace, name))
    census.stop()
    assert (status["phase"], status["stdout"], status["approval"]["approvedBy"]) == ("Succeeded", "gated\n", "bob")
    assert len(census.pods_by_run[name]) == 1


def test_runs_can_be_deleted_while_the_operator_is_down(operator, namespace):
    name = operator.create_run(namespace, {"language": "python", "code": "print(1)"})
    operator.wait_run(namespace, name)
    assert not operator.get_run(namespace, name)["metadata"].get("finalizers")
    try:  # the replicas come back whatever fails, stopping them included
        operator.operator.control("stop")
        operator.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        wait_for(lambda: name not in operator.run_names(namespace), 10, "the run to be gone without the operator")
    finally:
        operator.operator.control("start")


def test_a_session_run_in_the_sandbox_when_the_operator_dies_ends_with_its_own_result_and_the_session_goes_on(
        operator, namespace):
    """The run's stream goes with the operator; its frame, under a nonce only the operator can work out again,
    is in the sandbox's log: the next leader finishes the run from it, and the session's interpreter (keepState)
    serves the next run under the same key."""
    from framework.sessions import allow_sessions, create_session, run_in, wait_session
    allow_sessions(operator, namespace)
    session = create_session(operator, namespace, keepState=True)
    pod = wait_session(operator, namespace, session)["podName"]
    assert run_in(operator, namespace, session, "x = 20\nprint(x)")["stdout"] == "20\n"
    name = operator.create_run(namespace, {"language": "python", "session": session,
                                           "code": "import time\ntime.sleep(3)\nx += 1\nprint(x * 2)"})
    wait_for(lambda: (operator.get_run(namespace, name).get("status") or {}).get("startMode") == "Session", 30,
             "the run in the session's sandbox")
    try:
        operator.operator.control("kill")
        wait_for(lambda: operator.kubectl("logs", "-n", namespace, pod).stdout.count("CODERUN-RESULT-V1") >= 2, 60,
                 "the run's frame in the sandbox's log after the operator died")
        operator.operator.control("start")
        status = operator.wait_run(namespace, name, timeout=120)["status"]
    finally:
        operator.operator.control("start")
    assert (status["phase"], status["stdout"], status["startMode"]) == ("Succeeded", "42\n", "Session"), status
    assert run_in(operator, namespace, session, "print(x)")["stdout"] == "21\n"
