"""The controller against a fake of k8s.py: admission, collection, every verdict, refusals, expiry, the cache."""
import copy
import hashlib
import json
from datetime import timedelta

import pytest

from coderun_operator.controller import Controller, reconcile
from fake_k8s import FakeK8s, Refused, Transient
from support.controller import NS, T0, Clock, frame_log, make_run, pod_of, policy_object, submit, terminate


@pytest.fixture
def env():
    api, clock = FakeK8s(), Clock()
    return api, clock, Controller(api=api, clock=clock)


def by_alice(api, run):
    """The run as the API server stamps it for alice, who may use every policy named in these tests."""
    run["metadata"]["annotations"] = {**(run["metadata"].get("annotations") or {}),
                                      "coderun.io/created-by": "alice", "coderun.io/created-by-groups": "team-users"}
    ref = run["spec"].get("policyRef")
    if ref:
        api.grants.add(("team-users", "use", "coderunpolicies", NS, ref))
    return run


# ------------------------------------------------------------------ admission
def test_admission_creates_the_children_then_the_pending_status(env):
    api, _, _ = env
    run = submit(env, make_run())
    kinds = sorted(k for (k, _, _) in api.objects)
    assert kinds == ["CodeRun", "ConfigMap", "NetworkPolicy", "NetworkPolicy", "Pod"]
    assert run["status"]["phase"] == "Pending" and run["status"]["podName"] == "demo-sandbox"
    assert run["status"]["cacheKey"] and run["status"]["effectiveLimits"]["timeoutSeconds"] == 5
    assert ("Normal", "PodCreated", "sandbox pod demo-sandbox created") in api.events


@pytest.mark.parametrize("spec,reason,says", [
    ({"language": "cobol"}, "PolicyDenied", "language 'cobol' is not offered"),
    ({"limits": {"memory": "64Gi"}}, "PolicyDenied", "spec.limits.memory=64Gi is above the maximum"),
    ({"files": [{"path": "a.bin", "contentBase64": "abc"}]}, "InvalidSpec", "spec.files.0.contentBase64"),
    ({"code": None}, "InvalidSpec", "spec.code"),
])
def test_refused_runs_end_rejected_without_a_pod(env, spec, reason, says):
    api, _, _ = env
    run = submit(env, make_run(**spec))
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Rejected", reason)
    assert says in run["status"]["message"]
    assert not any(k == "Pod" for (k, _, _) in api.objects)
    assert api.events[-1][:2] == ("Warning", reason)


def test_a_squatted_child_name_is_a_conflict_never_adopted(env):
    api, _, _ = env
    api.objects[("ConfigMap", NS, "demo-input")] = {"kind": "ConfigMap", "metadata": {
        "name": "demo-input", "namespace": NS, "resourceVersion": "1"}, "data": {"code": "print('squatter')"}}
    run = submit(env, make_run())
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "NameConflict")
    assert "ConfigMap named demo-input already exists" in run["status"]["message"]
    assert ("Pod", NS, "demo-sandbox") not in api.objects


def test_the_namespace_deny_all_is_repaired_or_refused_when_foreign(env):
    api, _, ctl = env
    submit(env, make_run())
    key = ("NetworkPolicy", NS, "coderun-sandbox-default-deny")
    api.objects[key]["spec"]["egress"] = [{}]  # someone opened it
    submit(env, make_run(name="second", uid="uid-2"))
    assert api.objects[key]["spec"]["egress"] == [] and "replace_network_policy" in api.calls
    del api.objects[key]  # deleted: created again on the next admission
    submit(env, make_run(name="third", uid="uid-3"))
    assert key in api.objects
    api.objects[key]["metadata"]["labels"] = {}  # not ours any more
    run = submit(env, make_run(name="fourth", uid="uid-4"))
    assert run["status"]["reason"] == "NameConflict"


def test_quota_refusal_fails_the_run_with_the_api_servers_message(env):
    api, _, _ = env
    def refuse_pods(obj):
        if obj["kind"] == "Pod":
            raise Refused("the API server refused Pod demo-sandbox: exceeded quota: pods=0", 403)
    api.fail["create_or_get"] = refuse_pods
    run = submit(env, make_run())
    assert run["status"]["reason"] == "StartFailed" and "exceeded quota" in run["status"]["message"]
    assert run["status"]["policy"] == "builtin-default" and run["status"]["decision"]["policy"] == "builtin-default"



def test_a_refused_namespace_deny_all_fails_the_run_at_once_not_as_a_bug(env):
    api, _, _ = env
    def namespace_terminating(obj):
        if obj["kind"] == "NetworkPolicy":
            raise Refused("the API server refused NetworkPolicy coderun-sandbox-default-deny: unable to create "
                          "new content in namespace demo because it is being terminated", 403)
    api.fail["create_or_get"] = namespace_terminating
    run = submit(env, make_run())
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "StartFailed")
    assert "being terminated" in run["status"]["message"]
    assert ("Pod", NS, "demo-sandbox") not in api.objects

# ------------------------------------------------------------------ progress and collection
def test_running_then_collected_then_pod_deleted_and_cache_labelled(env):
    api, _, ctl = env
    submit(env, make_run())
    pod = pod_of(api)
    pod["status"] = {"phase": "Running", "containerStatuses": [{"name": "run", "state": {"running": {}}}]}
    ctl.on_pod(pod, deleted=False)
    assert api.run(NS, "demo")["status"]["phase"] == "Running"
    run = terminate(env)
    assert (run["status"]["phase"], run["status"]["reason"], run["status"]["stdout"]) == \
        ("Succeeded", "Completed", "42\n")
    assert ("Pod", NS, "demo-sandbox") not in api.objects
    assert run["metadata"]["labels"]["coderun.io/cache-key"] == run["status"]["cacheKey"][:63]
    assert run["status"]["image"].endswith("@sha256:" + "f" * 64)


@pytest.mark.parametrize("log,termination,container_reason,reason", [
    ("no frame at all\n", None, "Error", "InternalError"),
    ("no frame at all\n", None, "OOMKilled", "OOMKilled"),
    (frame_log()[0], json.dumps({"frameSha256": "0" * 64}), "Completed", "InternalError"),
])
def test_without_a_vouched_frame_the_kubelet_decides(env, log, termination, container_reason, reason):
    submit(env, make_run())
    run = terminate(env, log=log, termination=termination, reason=container_reason, exit_code=137)
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", reason)


def test_hostile_frame_values_still_end_the_run(env):
    log, termination = frame_log(reason="NonZeroExit", exitCode=1, stdout="\u2028x\u0085y\n",
                                 error={"type": "E" * 1000, "message": "m" * 10000, "line": 10**30})
    submit(env, make_run())
    run = terminate(env, log=log, termination=termination, reason="Error", exit_code=1)
    status = run["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "NonZeroExit")
    assert status["error"]["line"] is None and len(status["error"]["type"]) == 256
    assert len(status["error"]["message"]) == 4096 and status["stdout"] == "\u2028x\u0085y\n"


def test_the_spec_is_parsed_once_per_run_and_forgotten_when_it_ends(env, monkeypatch):
    """The spec is immutable: admission, pod events, the tick and collection share one parse."""
    api, clock, ctl = env
    parsed, parse = [], reconcile.parse_spec
    monkeypatch.setattr(reconcile, "parse_spec", lambda spec: parsed.append(spec) or parse(spec))
    submit(env, make_run())
    pod = pod_of(api)
    pod["status"] = {"phase": "Pending"}
    for _ in range(3):
        ctl.on_pod(copy.deepcopy(pod), deleted=False)
        clock.now += timedelta(seconds=1)
        ctl.tick()
    assert terminate(env)["status"]["reason"] == "Completed"
    assert len(parsed) == 1 and ctl.store.typed("uid-1") == (None, None)


def test_a_deleted_pod_fails_the_run(env):
    api, _, ctl = env
    submit(env, make_run())
    pod = pod_of(api)
    del api.objects[("Pod", NS, "demo-sandbox")]
    ctl.on_pod(pod, deleted=True)
    assert api.run(NS, "demo")["status"]["reason"] == "PodDeleted"


def test_a_pod_that_never_starts_gets_a_verdict_from_the_tick(env):
    api, clock, ctl = env
    submit(env, make_run())
    pod = pod_of(api)
    pod["status"] = {"phase": "Pending", "containerStatuses": [{
        "name": "run", "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}]}
    ctl.on_pod(pod, deleted=False)
    assert api.run(NS, "demo")["status"]["phase"] == "Pending"
    clock.now += timedelta(seconds=31)
    ctl.tick()
    run = api.run(NS, "demo")
    assert run["status"]["reason"] == "ImageUnavailable" and ("Pod", NS, "demo-sandbox") not in api.objects
    assert api.events[-1][:2] == ("Warning", "ImageUnavailable")  # events work from the tick too


def test_a_pending_run_says_why_its_pod_waits_as_soon_as_the_scheduler_says_it(env):
    """Issue 35, item 8: for minutes the status said "waiting for it to start" while the scheduler said why."""
    api, clock, ctl = env
    submit(env, make_run())
    assert api.run(NS, "demo")["status"]["message"] == "sandbox pod demo-sandbox created; waiting for it to start"
    pod = pod_of(api)
    pod["status"] = {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available."}]}
    ctl.on_pod(copy.deepcopy(pod), deleted=False)
    status = api.run(NS, "demo")["status"]
    assert (status["phase"], status["reason"]) == ("Pending", "PodCreated"), status
    assert "not yet scheduled: 0/1 nodes are available: 1 Insufficient cpu" in status["message"]
    assert "up to 300s" in status["message"] and "Unschedulable" in status["message"]
    assert status["podName"] == "demo-sandbox" and status["conditions"][0]["type"] == "Accepted"  # the rest kept
    writes = []
    api.fail["patch_run_status"] = lambda namespace, name, status: writes.append(status)
    ctl.on_pod(copy.deepcopy(pod), deleted=False)  # the same word again: nothing to write
    assert writes == []
    del api.fail["patch_run_status"]
    clock.now += timedelta(seconds=301)
    ctl.tick()
    status = api.run(NS, "demo")["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "Unschedulable")
    assert "Insufficient cpu" in status["message"]


def test_a_pod_placed_after_waiting_for_room_says_it_waits_to_start_again(env):
    api, _, ctl = env
    submit(env, make_run())
    pod = pod_of(api)
    pod["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available"}]}
    ctl.on_pod(copy.deepcopy(pod), deleted=False)
    assert "not yet scheduled" in api.run(NS, "demo")["status"]["message"]
    pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    ctl.on_pod(copy.deepcopy(pod), deleted=False)
    assert api.run(NS, "demo")["status"]["message"] == "sandbox pod demo-sandbox created; waiting for it to start"


def test_an_evicted_sandbox_reports_the_disk_limit(env):
    api, _, ctl = env
    submit(env, make_run(limits={"disk": "16Mi"}))
    pod = pod_of(api)
    pod["status"] = {"phase": "Failed", "reason": "Evicted",
                     "message": 'Usage of EmptyDir volume "tmp" exceeds the limit "16Mi". '}
    ctl.on_pod(pod, deleted=False)
    status = api.run(NS, "demo")["status"]
    assert status["reason"] == "DiskLimitExceeded" and "disk limit of 16Mi" in status["message"]


# ------------------------------------------------------------------ refusals and failures
def test_a_refused_status_is_retried_smaller_never_the_same(env):
    api, _, _ = env
    sent = []
    def refuse_big(namespace, name, status):
        sent.append(len(json.dumps(status)))
        if status.get("phase") == "Succeeded" and len(json.dumps(status)) > 20_000:
            raise Refused("the API server refused the status: etcdserver: request is too large", 413)
    submit(env, make_run())
    api.fail["patch_run_status"] = refuse_big
    log, termination = frame_log(stdout="x" * 200_000)
    run = terminate(env, log=log, termination=termination)
    assert run["status"]["phase"] == "Succeeded" and run["status"]["stdoutTruncated"] is True
    assert len(run["status"]["stdout"]) <= 4096 and sent[-1] < sent[-2]


def test_when_every_full_status_is_refused_the_minimal_one_says_why(env):
    api, _, _ = env
    def refuse_unless_minimal(namespace, name, status):
        if status.get("phase") == "Succeeded" and "stdout" in status and status["stdout"] is not None:
            raise Refused("the API server refused the status: spec.status.x: Invalid value", 422)
    submit(env, make_run())
    api.fail["patch_run_status"] = refuse_unless_minimal
    run = terminate(env)
    assert run["status"]["phase"] == "Succeeded" and "refused by the API server" in run["status"]["message"]
    assert "stdout" not in run["status"]


@pytest.mark.parametrize("error,ticks,ends_as", [
    (RuntimeError("something nobody expected"), 2, ("Failed", "InternalError")),  # 3 attempts: event + 2 ticks
    (Transient("API server answered 503"), 5, None),  # retried for as long as it takes, never a verdict
])
def test_failures_end_the_run_only_when_retrying_cannot_help(env, error, ticks, ends_as):
    api, _, ctl = env
    def fail(*_):
        raise error
    api.fail["read_log"] = fail
    submit(env, make_run())
    terminate(env)
    for _ in range(ticks):
        assert api.run(NS, "demo")["status"]["phase"] == "Pending"
        ctl.tick()
    status = api.run(NS, "demo")["status"]
    if ends_as:
        assert (status["phase"], status["reason"]) == ends_as and str(error) in status["message"]
        return
    assert status["phase"] == "Pending"
    del api.fail["read_log"]
    ctl.tick()
    assert api.run(NS, "demo")["status"]["phase"] == "Succeeded"


def test_a_spec_that_fills_the_object_leaves_a_smaller_status_budget(env):
    api, _, _ = env
    submit(env, make_run(code="x = 1\n" + "#" * 120_000, stdin="s" * 120_000,
                         files=[{"path": f"f{i}", "content": "c" * 60_000} for i in range(8)]))
    log, termination = frame_log(stdout="\x01" * 200_000)  # escapes to six bytes each
    run = terminate(env, log=log, termination=termination)
    size = len(json.dumps(run).encode())
    assert run["status"]["phase"] == "Succeeded" and size < 1536 * 1024 - 32 * 1024
    assert len(run["status"]["stdout"]) > 10_000  # trimmed by its escaped size, not emptied


# ------------------------------------------------------------------ lifecycle and the cache
def test_finished_runs_expire_on_schedule_without_scanning(env):
    api, clock, ctl = env
    submit(env, make_run(ttlSecondsAfterFinished=60))
    terminate(env)
    ctl.tick()
    assert api.run(NS, "demo") is not None
    clock.now += timedelta(seconds=61)
    calls = len(api.calls)
    ctl.tick()
    assert api.run(NS, "demo") is None and api.calls[calls:] == ["delete_run"]


def test_an_identical_run_is_answered_from_the_cache_without_a_pod(env):
    api, _, ctl = env
    submit(env, make_run(cache={"enabled": True}))
    ctl.on_run(copy.deepcopy(terminate(env)), deleted=False)
    second = submit(env, make_run(name="again", uid="uid-2", cache={"enabled": True}))
    assert second["status"]["cachedFrom"] == "demo" and second["status"]["stdout"] == "42\n"
    assert ("Pod", NS, "again-sandbox") not in api.objects


def test_deleted_runs_leave_no_lock_and_no_active_count(env):
    api, _, ctl = env
    run = submit(env, make_run())
    assert ctl.store.active_count() == 1
    ctl.on_run(run, deleted=True)
    assert ctl.store.active_count() == 0 and "uid-1" not in ctl._locks


def test_a_child_with_a_forged_owner_reference_but_other_content_is_refused(env):
    # Someone who watched the run appear and raced the operator can copy its uid into an ownerReference,
    # but cannot make the input hold the run's own code.
    api, _, _ = env
    owner = {"apiVersion": "coderun.io/v1alpha1", "kind": "CodeRun", "name": "demo", "uid": "uid-1", "controller": True}
    api.objects[("ConfigMap", NS, "demo-input")] = {"kind": "ConfigMap", "metadata": {
        "name": "demo-input", "namespace": NS, "ownerReferences": [owner]}, "data": {"code": "print('squatter')"}}
    run = submit(env, make_run())
    assert run["status"]["reason"] == "NameConflict" and ("Pod", NS, "demo-sandbox") not in api.objects


def test_a_run_resumed_after_a_crash_reuses_its_own_children(env):
    api, _, ctl = env
    run = submit(env, make_run())
    pod_before = api.objects[("Pod", NS, "demo-sandbox")]["metadata"]["resourceVersion"]
    api.patch_run_status(NS, "demo", {"podName": None, "phase": None})  # as if the status write was lost
    ctl.on_run(api.get_run(NS, "demo"), deleted=False)
    status = api.run(NS, "demo")["status"]
    assert status["phase"] == "Pending" and status["podName"] == "demo-sandbox"
    assert api.objects[("Pod", NS, "demo-sandbox")]["metadata"]["resourceVersion"] == pod_before


# ------------------------------------------------------------------ CodeRunPolicy: queue, approval
def test_a_capped_policy_queues_then_starts_the_next_run_when_one_finishes(env):
    api, _, ctl = env
    ctl.on_policy(policy_object(maxConcurrentRuns=1), deleted=False)
    first = submit(env, make_run("first", "uid-1"))
    second = submit(env, make_run("second", "uid-2"))
    assert first["status"]["reason"] == "PodCreated" and first["status"]["policy"] == "default"
    assert (second["status"]["phase"], second["status"]["reason"]) == ("Pending", "Queued")
    assert second["status"]["decision"]["maxConcurrentRuns"] == 1 and ("Pod", NS, "second-sandbox") not in api.objects
    ctl.on_policy(policy_object(maxConcurrentRuns=5, defaults={"memory": "300Mi"}), deleted=False)
    terminate(env, "first")  # a slot frees: the queued run starts with the decision it was admitted with
    started = api.run(NS, "second")
    assert started["status"]["reason"] == "PodCreated"
    assert started["status"]["effectiveLimits"]["memory"] == "256Mi"


def test_the_first_capped_admission_counts_runs_the_watch_has_not_delivered(env):
    api, clock, ctl = env
    ctl.on_policy(policy_object(maxConcurrentRuns=1), deleted=False)
    submit(env, make_run("first", "uid-1"))
    restarted = Controller(api=api, clock=clock)  # an operator restart: nothing in memory yet
    restarted.on_policy(policy_object(maxConcurrentRuns=1), deleted=False)
    lists_before = api.calls.count("list_runs")
    restarted.on_run(api.add_run(make_run("second", "uid-2")), deleted=False)
    restarted.on_run(api.add_run(make_run("third", "uid-3")), deleted=False)
    assert [api.run(NS, n)["status"]["reason"] for n in ("second", "third")] == ["Queued", "Queued"]
    assert api.calls.count("list_runs") - lists_before == 1  # once per namespace, not per run


def annotated(api, run, **annotations):
    """The run as the API server holds it after `kubectl annotate` (the admission policies already applied)."""
    current = api.get_run(NS, run["metadata"]["name"])
    current["metadata"]["annotations"] = {**(current["metadata"].get("annotations") or {}),
                                          **{f"coderun.io/{k.replace('_', '-')}": v for k, v in annotations.items()}}
    return api.add_run(current)


def supervised(env, allow_self=False, name="wait", uid="uid-1", creator="alice"):
    api, _, ctl = env
    ctl.on_policy(policy_object(approval={"required": "Always", "allowSelfApproval": allow_self}), deleted=False)
    run = make_run(name, uid)
    if creator:
        run["metadata"]["annotations"] = {"coderun.io/created-by": creator, "coderun.io/created-by-groups":
                                          "system:authenticated"}
    return submit(env, run)


def test_approval_waits_then_another_persons_approval_starts_it_and_is_recorded(env):
    api, _, ctl = env
    waiting = supervised(env)
    assert waiting["status"]["reason"] == "AwaitingApproval" and ("Pod", NS, "wait-sandbox") not in api.objects
    assert "RBAC verb approve" in waiting["status"]["message"] and "approval" not in waiting["status"]
    ctl.on_run(annotated(api, waiting, approved_by="bob"), deleted=False)
    status = api.run(NS, "wait")["status"]
    assert status["reason"] == "PodCreated"
    assert status["approval"] == {"approvedBy": "bob", "creator": "alice", "time": "2026-11-22T10:00:00.000Z"}
    assert ("Normal", "Approved", "approved by bob") in api.events


def test_a_self_approval_waits_unless_the_policy_allows_it(env):
    api, _, ctl = env
    waiting = supervised(env)
    ctl.on_run(annotated(api, waiting, approved_by="alice"), deleted=False)
    status = api.run(NS, "wait")["status"]
    assert (status["phase"], status["reason"]) == ("Pending", "AwaitingApproval") and "podName" not in status
    assert "approved by alice, who created this run" in status["message"] and "allowSelfApproval" in status["message"]
    allowed = supervised(env, allow_self=True, name="mine", uid="uid-2")
    ctl.on_run(annotated(api, allowed, approved_by="alice"), deleted=False)
    assert api.run(NS, "mine")["status"]["approval"]["approvedBy"] == "alice"
    assert api.run(NS, "mine")["status"]["reason"] == "PodCreated"


def test_a_run_that_states_no_creator_under_an_approval_policy_is_refused_at_once(env):
    """No approval of it could be told from a self-approval: it would wait for ever, so it ends now, saying what
    to state. (The control: the same policy allowing self-approval takes any approver's word.)"""
    api, _, ctl = env
    status = supervised(env, creator=None)["status"]
    assert (status["phase"], status["reason"], status["policy"]) == ("Rejected", "PolicyDenied", "default"), status
    assert "coderun.io/created-by" in status["message"] and "podName" not in status
    waiting = supervised(env, allow_self=True, name="self", uid="uid-2", creator=None)
    assert waiting["status"]["reason"] == "AwaitingApproval"
    ctl.on_run(annotated(api, waiting, approved_by="bob"), deleted=False)
    assert api.run(NS, "self")["status"].get("podName")


def test_a_rejection_ends_the_run_naming_the_identity_shown_safely(env):
    api, _, ctl = env
    waiting = supervised(env)
    hostile = "mallory\nApproved by: admin\u202e" + "x" * 5000
    ctl.on_run(annotated(api, waiting, rejected_by=hostile), deleted=False)
    status = api.run(NS, "wait")["status"]
    assert (status["phase"], status["reason"]) == ("Rejected", "RejectedByApprover") and "podName" not in status
    shown = status["approval"]["rejectedBy"]
    assert shown.startswith("mallory\\x0aApproved by: admin\\u202e") and len(shown) <= 128 and shown.endswith("...")
    assert "\n" not in status["message"] and len(status["message"]) < 300 and status["approval"]["creator"] == "alice"


@pytest.mark.parametrize("tamper, says", [
    (lambda admission: admission.pop(("ValidatingAdmissionPolicy", "approval.coderun.io")), "is not installed"),
    (lambda admission: admission.pop(("ValidatingAdmissionPolicyBinding", "approval.coderun.io")), "Binding"),
    (lambda admission: admission[("ValidatingAdmissionPolicyBinding", "approval.coderun.io")]["spec"].update(
        validationActions=["Warn"]), "does not enforce"),
    (lambda admission: admission[("ValidatingAdmissionPolicyBinding", "approval.coderun.io")]["spec"].update(
        matchResources={"namespaceSelector": {"matchLabels": {"audited": "true"}}}), "does not enforce"),
])
def test_an_approval_that_cannot_be_verified_keeps_the_run_waiting(env, tamper, says):
    api, clock, ctl = env
    saved = copy.deepcopy(api.admission)
    tamper(api.admission)
    waiting = supervised(env)
    ctl.on_run(annotated(api, waiting, approved_by="bob"), deleted=False)
    status = api.run(NS, "wait")["status"]
    assert status["reason"] == "AwaitingApproval" and "cannot be verified" in status["message"] and says in status["message"]
    reads = api.calls.count("read_admission_policy")
    api.admission = saved  # repaired: believed within the cache time
    ctl.tick()
    assert api.run(NS, "wait")["status"]["reason"] == "AwaitingApproval" and api.calls.count("read_admission_policy") == reads
    clock.now += timedelta(seconds=11)
    ctl.tick()
    assert api.run(NS, "wait")["status"]["reason"] == "PodCreated"


def test_an_unreadable_admission_policy_keeps_the_run_waiting_saying_why(env):
    api, _, ctl = env
    api.fail["read_admission_policy"] = lambda *_: (_ for _ in ()).throw(Refused("forbidden", 403))
    waiting = supervised(env)
    ctl.on_run(annotated(api, waiting, approved_by="bob"), deleted=False)
    status = api.run(NS, "wait")["status"]
    assert status["reason"] == "AwaitingApproval" and "cannot read the ValidatingAdmissionPolicy" in status["message"]


# ------------------------------------------------------------------ naming a policy: the verb `use`
def named_run(name, uid, ref, creator="alice"):
    run = make_run(name, uid, policyRef=ref)
    if creator:
        run["metadata"]["annotations"] = {"coderun.io/created-by": creator,
                                          "coderun.io/created-by-groups": "system:authenticated\nteam"}
    return run


def test_naming_a_policy_needs_the_use_verb_for_the_recorded_creator(env):
    api, _, ctl = env
    ctl.on_policy(policy_object(approval={"required": "Always"}), deleted=False)
    ctl.on_policy(policy_object("open"), deleted=False)
    ctl.on_policy(policy_object("secret-gpu"), deleted=False)
    refused = submit(env, named_run("mine", "uid-1", "open"))["status"]
    assert (refused["phase"], refused["reason"], refused["policyRule"]) == ("Rejected", "PolicyDenied", "policyRef")
    assert "alice may not use CodeRunPolicy 'open'" in refused["message"] and "secret-gpu" not in refused["message"]
    api.grants.add(("team", "use", "coderunpolicies", NS, "open"))  # through a group the API server stamped
    allowed = submit(env, named_run("ours", "uid-2", "open"))["status"]
    assert (allowed["reason"], allowed["policy"]) == ("PodCreated", "open")
    assert api.calls.count("allowed") == 2
    missing = submit(env, named_run("gone", "uid-3", "nothere"))["status"]
    assert "may not use" in missing["message"]  # refused before existence is looked at: nothing is revealed


@pytest.mark.parametrize("ref, creator, says", [
    ("builtin-default", "alice", "cannot be named"),
    ("open", None, "does not state its creator"),
])
def test_the_baseline_cannot_be_named_and_an_unknown_creator_cannot_name_a_policy(env, ref, creator, says):
    api, _, ctl = env
    ctl.on_policy(policy_object(approval={"required": "Always"}, maximums={"memory": "128Mi"}), deleted=False)
    ctl.on_policy(policy_object("open"), deleted=False)
    api.grants.add(("alice", "use", "coderunpolicies", NS, "builtin-default"))
    status = submit(env, named_run("escape", "uid-1", ref, creator=creator))["status"]
    assert (status["phase"], status["policyRule"]) == ("Rejected", "policyRef") and says in status["message"]
    assert ("Pod", NS, "escape-sandbox") not in api.objects


def test_an_unverifiable_creator_cannot_name_a_policy(env):
    api, _, ctl = env
    ctl.on_policy(policy_object("open"), deleted=False)
    api.grants.add(("alice", "use", "coderunpolicies", NS, "open"))
    api.admission.clear()
    status = submit(env, named_run("x", "uid-1", "open"))["status"]
    assert status["policyRule"] == "policyRef" and "cannot be verified" in status["message"]


# ------------------------------------------------------------------ policies listed before anything is admitted
def test_nothing_is_admitted_before_every_policy_was_listed_once(env):
    api, _, ctl = env
    api.fail["list_policies"] = lambda *_: (_ for _ in ()).throw(Transient("the API server is away"))
    api.policies = [{**policy_object(approval={"required": "Always"}), "metadata": {
        "name": "default", "namespace": NS, "resourceVersion": "7"}}]
    stated = make_run()
    stated["metadata"]["annotations"] = {"coderun.io/created-by": "alice"}
    run = submit(env, stated)
    assert "status" not in run and ("Pod", NS, "demo-sandbox") not in api.objects  # not on the baseline
    del api.fail["list_policies"]
    ctl.tick()
    status = api.run(NS, "demo")["status"]
    assert (status["reason"], status["policy"]) == ("AwaitingApproval", "default")
    ctl.tick()
    assert api.calls.count("list_policies") == 2  # listed once, then the watch keeps it current


def test_the_startup_list_never_brings_back_a_policy_deleted_since(env):
    api, _, ctl = env
    deleted = {**policy_object("strict"), "metadata": {"name": "strict", "namespace": NS, "resourceVersion": "9"}}
    ctl.on_policy(deleted, deleted=True)
    api.policies = [{**deleted, "metadata": {**deleted["metadata"], "resourceVersion": "8"}}]
    ctl.ensure_policies_listed()
    assert ctl.store.policies(NS) == {} and ctl.store.policies_listed


def test_messages_and_events_leave_with_control_characters_escaped(env):
    """The program's exception message is quoted in status.message and the Event, which kubectl prints to a
    terminal: an escape sequence there could rewrite what a person reads."""
    api, _, _ = env
    submit(env, make_run())
    log, termination = frame_log(reason="NonZeroExit", exitCode=1, error={
        "type": "ValueError", "message": "x\x1b]0;title\x07\r\x1b[2Kexit code 0 (Completed)", "line": 1})
    run = terminate(env, log=log, termination=termination)
    assert "\x1b" not in run["status"]["message"] and "\\x1b" in run["status"]["message"]
    assert all("\x1b" not in c["message"] for c in run["status"]["conditions"])
    warning = [e for e in api.events if e[1] == "NonZeroExit"]
    assert warning and "\x1b" not in warning[0][2] and "\r" not in warning[0][2]
    assert run["status"]["error"]["message"].startswith("x\x1b]0;")  # the data itself is kept as it was



# ------------------------------------------------------------------ issue 17: what the operator records and keeps
def test_a_refusal_by_policy_names_the_policy_and_its_digest(env):
    from coderun.api.coderunpolicy import spec_digest
    _, _, ctl = env
    builtin = submit(env, make_run("cobol", "uid-2", language="cobol"))["status"]  # no CodeRunPolicy here yet
    assert (builtin["policy"], builtin["policyDigest"]) == ("builtin-default", "builtin")
    strict = policy_object("strict", admission="Record", defaults={"memory": "64Mi"}, maximums={"memory": "128Mi"})
    ctl.on_policy(strict, deleted=False)
    status = submit(env, by_alice(env[0], make_run(policyRef="strict", limits={"memory": "512Mi"})))["status"]
    assert (status["phase"], status["reason"], status["policyRule"]) == ("Rejected", "PolicyDenied", "maximums.memory")
    assert (status["policy"], status["policyDigest"]) == ("strict", spec_digest(strict["spec"]))


def test_a_ttl_above_the_policys_maximum_is_refused_naming_the_field(env):
    _, _, ctl = env
    ctl.on_policy(policy_object(maxTtlSecondsAfterFinished=600), deleted=False)
    status = submit(env, make_run(ttlSecondsAfterFinished=601))["status"]
    assert (status["reason"], status["policyRule"]) == ("PolicyDenied", "maxTtlSecondsAfterFinished")
    assert "spec.ttlSecondsAfterFinished=601 is above the maximum 600" in status["message"]
    assert submit(env, make_run("ok", "uid-2", ttlSecondsAfterFinished=600))["status"]["phase"] == "Pending"


def test_the_policys_ttl_decides_when_a_run_without_its_own_is_deleted(env):
    api, clock, ctl = env
    ctl.on_policy(policy_object(ttlSecondsAfterFinished=5), deleted=False)
    submit(env, make_run())
    terminate(env)
    clock.now += timedelta(seconds=4)
    ctl.tick()
    assert api.run(NS, "demo") is not None
    clock.now += timedelta(seconds=2)
    ctl.tick()
    assert api.run(NS, "demo") is None


def test_a_refused_run_asking_a_long_ttl_is_not_kept_longer_than_the_maximum(env):
    api, clock, ctl = env
    submit(env, make_run(ttlSecondsAfterFinished=30 * 86400))  # the built-in maximum is 7 days
    clock.now += timedelta(days=7, seconds=1)
    ctl.tick()
    assert api.run(NS, "demo") is None


def test_a_finished_run_is_kept_slim_and_the_cache_reads_its_source_whole(env):
    api, _, ctl = env
    submit(env, make_run(cache={"enabled": True}))
    log, termination = frame_log(stdout="x" * 100_000)
    ctl.on_run(copy.deepcopy(terminate(env, log=log, termination=termination)), deleted=False)
    held = ctl.store.run("uid-1")
    assert held["status"]["phase"] == "Succeeded" and held["status"]["cacheKey"]
    assert "stdout" not in held["status"] and "code" not in held["spec"] and len(json.dumps(held)) < 1024
    gets = api.calls.count("get_run")
    second = submit(env, make_run(name="again", uid="uid-2", cache={"enabled": True}))
    assert second["status"]["cachedFrom"] == "demo" and second["status"]["stdout"] == "x" * 65536
    assert api.calls.count("get_run") - gets == 1


@pytest.mark.parametrize("other,outcome", [
    ({"redactionPatterns": ["tok-[0-9]+"]}, {"stdout": "tok-12345\n"}),            # answered unredacted
    ({"egress": [{"cidr": "192.0.2.5/32"}]}, {"stdout": "NETWORK reachable\n"}),  # no-egress got egress's
    ({"maxProcesses": 8}, {"stdout": "20 processes ran\n"}),                      # capped got uncapped's
    ({"maxInodes": 64}, {"reason": "DiskLimitExceeded", "exitCode": None,           # a limit outcome of others
                         "limit": {"kind": "inodes", "observed": 65, "limit": 64}}),
])
def test_the_cache_never_crosses_policies(env, other, outcome):
    api, _, ctl = env
    ctl.on_policy(policy_object("plain"), deleted=False)
    ctl.on_policy(policy_object("other", **other), deleted=False)
    submit(env, by_alice(env[0], make_run(policyRef="plain", cache={"enabled": True})))
    log, termination = frame_log(**outcome)
    assert terminate(env, log=log, termination=termination)["status"]["cacheKey"]
    status = submit(env, by_alice(env[0], make_run("again", "uid-2", policyRef="other", cache={"enabled": True})))["status"]
    assert "cachedFrom" not in status and ("Pod", NS, "again-sandbox") in api.objects
    assert status["policy"] == "other"
    same = submit(env, by_alice(env[0], make_run("same", "uid-3", policyRef="plain", cache={"enabled": True})))["status"]
    assert same["cachedFrom"] == "demo" and same["reason"] == outcome.get("reason", "Completed")  # it was reusable


def run_with_artifact(env):
    """A finished, cacheable run with one artifact; returns its artifacts ConfigMap key."""
    import base64
    content = b"genuine"
    artifact = {"name": "out.txt", "size": len(content), "sha256": hashlib.sha256(content).hexdigest(),
                "contentBase64": base64.b64encode(content).decode()}
    submit(env, make_run(cache={"enabled": True}))
    log, termination = frame_log(artifacts=[artifact])
    status = terminate(env, log=log, termination=termination)["status"]
    return ("ConfigMap", NS, status["artifacts"][0]["configMap"])


@pytest.mark.parametrize("forge", ["squatter", "forged-owner-other-bytes"])
def test_the_cache_never_serves_a_forged_artifacts_configmap(env, forge):
    import base64
    api, _, _ = env
    key = run_with_artifact(env)
    genuine = api.objects[key]
    forged = {"kind": "ConfigMap", "metadata": {"name": key[2], "namespace": NS, "resourceVersion": "1"},
              "binaryData": {k: base64.b64encode(b"forged!").decode() for k in genuine["binaryData"]}}
    if forge == "forged-owner-other-bytes":
        forged["metadata"]["ownerReferences"] = genuine["metadata"]["ownerReferences"]
    api.objects[key] = forged
    status = submit(env, make_run("again", "uid-2", cache={"enabled": True}))["status"]
    assert "cachedFrom" not in status and ("Pod", NS, "again-sandbox") in api.objects  # runs for real


def test_a_genuine_artifacts_configmap_is_copied_on_a_cache_hit(env):
    api, _, _ = env
    key = run_with_artifact(env)
    status = submit(env, make_run("again", "uid-2", cache={"enabled": True}))["status"]
    assert status["cachedFrom"] == "demo" and status["artifacts"][0]["configMap"] != key[2]
    assert api.objects[("ConfigMap", NS, status["artifacts"][0]["configMap"])]["binaryData"] == \
        api.objects[key]["binaryData"]


def test_a_pod_under_the_runs_pod_name_that_is_not_its_own_is_never_collected(env):
    api, _, ctl = env
    submit(env, make_run())
    squatter = pod_of(api)  # the run's pod deleted, another created under its name before the watch said so
    squatter["metadata"]["ownerReferences"] = []
    api.objects[("Pod", NS, "demo-sandbox")] = squatter
    ctl.tick()
    assert api.run(NS, "demo")["status"]["reason"] == "PodDeleted"


def test_a_queue_of_30_drains_with_a_bounded_number_of_status_writes(env):
    api, _, ctl = env
    ctl.on_policy(policy_object(maxConcurrentRuns=1), deleted=False)
    names = [f"q-{i:02d}" for i in range(30)]
    for i, name in enumerate(names):
        submit(env, make_run(name, f"uid-{i}"))
    reconciled = []
    original = ctl.reconcile
    ctl.reconcile = lambda uid, **kw: (reconciled.append(uid), original(uid, **kw))
    writes = api.calls.count("patch_run_status")
    ctl.tick()
    assert api.calls.count("patch_run_status") == writes and reconciled == ["uid-0"]  # only the one with a pod
    for name in names:
        terminate(env, name)
        ctl.tick()
    statuses = [api.run(NS, name)["status"] for name in names]
    assert all(s["phase"] == "Succeeded" for s in statuses)
    per_run = {}
    for call, args in zip(api.calls, api.call_args):
        if call == "patch_run_status":
            per_run[args[1]] = per_run.get(args[1], 0) + 1
    assert max(per_run.values()) <= 3 and sum(per_run.values()) <= 3 * 30, per_run  # Queued, PodCreated, final


def test_a_queued_run_starts_when_a_running_one_is_deleted(env):
    api, _, ctl = env
    ctl.on_policy(policy_object(maxConcurrentRuns=1), deleted=False)
    first = submit(env, make_run("first", "uid-1"))
    assert submit(env, make_run("second", "uid-2"))["status"]["reason"] == "Queued"
    ctl.on_run(first, deleted=True)
    del api.objects[("CodeRun", NS, "first")]
    assert api.run(NS, "second")["status"]["reason"] == "PodCreated"


def test_runs_deleted_before_their_expiry_leave_no_schedule_behind():
    from coderun_operator.controller.store import Store
    store = Store()
    for i in range(500):
        store.expire_at(T0 + timedelta(days=7), f"uid-{i}")
    for i in range(500):
        store.forget_run(f"uid-{i}")
    assert len(store._expiries) <= 64  # the heap holds what is still scheduled, not every run ever finished


def test_a_queued_run_starts_once_an_older_run_it_counted_turns_out_to_need_no_slot(env):
    api, _, ctl = env
    ctl.on_policy(policy_object("capped", maxConcurrentRuns=1), deleted=False)
    ctl.on_policy(policy_object("supervised", approval={"required": "Always"}), deleted=False)
    older = api.add_run(by_alice(env[0], make_run("older", "uid-1", policyRef="supervised")))
    ctl.store.put_run(older)  # delivered, not looked at yet (a burst's events arrive in any order)
    assert submit(env, by_alice(env[0], make_run("younger", "uid-2", policyRef="capped")))["status"]["reason"] == "Queued"
    ctl.reconcile("uid-1")
    assert api.run(NS, "older")["status"]["reason"] == "AwaitingApproval"
    assert api.run(NS, "younger")["status"]["reason"] == "PodCreated"  # at once, not at the next full pass
