"""The warm pool against a fake of k8s.py: pool pods, the conditional claim, the session's streamed frame and
its nonce, the cold fallbacks (attach failure, input cut short, an operator that restarted) and refill."""
import copy
import json

import pytest

from coderun_operator.builders import build_pod
from coderun_operator.controller import Controller
from coderun_operator.controller import attach
from coderun_operator.controller.warm import trust
from coderun_operator.policy import DEFAULT_POLICY, evaluate
from coderun_operator.policy.load import policy_from_object
from coderun.api.models import CodeRunSpec
from prestart_check import assert_prestarts_as_the_decision_runs
from fake_k8s import FakeK8s, Transient
from support.controller import NS, T0, Clock, frame_log, make_run
from support.warm import POLICY, pool_pods, runner_answer, start_pool, submit_and_wait
from support.controller import settle

@pytest.fixture
def env():
    api, clock = FakeK8s(), Clock()
    ctl = Controller(api=api, clock=clock)
    ctl.on_policy(copy.deepcopy(POLICY), deleted=False)
    return api, clock, ctl


def test_the_pool_is_the_hardened_sandbox_pod_waiting_on_stdin(env):
    api, _, _ = env
    names = start_pool(env)
    assert len(names) == 2
    pool_pod = pool_pods(api)[names[0]]
    spec = CodeRunSpec.model_validate({"language": "python", "code": "x"})
    cold = build_pod(make_run(), evaluate(spec, DEFAULT_POLICY), "demo-input")
    container, cold_container = pool_pod["spec"]["containers"][0], cold["spec"]["containers"][0]
    # stdin stays open past the first attach: a session that claims the pod attaches again for each later run
    assert container["stdin"] is True and container["stdinOnce"] is False
    assert container["command"][-2] == "--input-stdin" and "volumeMounts" in container
    policy = policy_from_object(POLICY)
    _, decision = trust.wanted_pools(NS, policy)[trust.key_of(pool_pod)]
    assert_prestarts_as_the_decision_runs(container["command"][-1], decision)
    # No input ConfigMap: a small volume of its own at the same path, which its runner writes the input to.
    assert [m["name"] for m in container["volumeMounts"]] == ["input", "tmp"]
    assert pool_pod["spec"]["volumes"][0] == {"name": "input", "emptyDir": {"sizeLimit": "4Mi"}}
    # Everything that isolates the pod is the cold pod's, exactly.
    for field in ("securityContext", "resources", "image", "terminationMessagePath"):
        assert container[field] == cold_container[field], field
    for field in ("runtimeClassName", "automountServiceAccountToken", "securityContext", "dnsPolicy",
                  "hostNetwork", "enableServiceLinks"):
        assert pool_pod["spec"][field] == cold["spec"][field], field
    assert pool_pod["metadata"]["labels"]["coderun.io/sandbox"] == "true"  # the namespace deny-all selects it
    assert pool_pod["metadata"]["ownerReferences"][0]["uid"] == "policy-uid"  # goes with its policy
    assert ("NetworkPolicy", NS, "coderun-sandbox-default-deny") in api.objects
    # The pool's own NetworkPolicy: a policy without egress routes its pods nowhere, like its cold runs.
    routes = api.objects[("NetworkPolicy", NS, "coderun-pool-default")]
    assert routes["spec"]["egress"] == [] and routes["metadata"]["ownerReferences"][0]["uid"] == "policy-uid"


def test_a_run_that_fits_claims_a_warm_pod_and_its_streamed_frame_ends_it(env):
    api, _, ctl = env
    names = start_pool(env)
    for name in names:
        api.attach_answers[name] = runner_answer()
    run = submit_and_wait(env, make_run())
    status = run["status"]
    assert status["phase"] == "Succeeded" and status["stdout"] == "42\n"
    assert status["startMode"] == "Warm" and status["podName"] in names
    claimed = status["podName"]
    assert ("Pod", NS, claimed) not in api.objects  # used once, then deleted
    sent = api.sent[claimed].split(b"\n", 1)
    document = json.loads(sent[1])
    assert int(sent[0]) == len(sent[1]) and document["data"]["code"] == "print(6*7)"
    assert json.loads(document["data"]["run.json"])["timeoutSeconds"] == 5
    # The claim: conditional on the version seen, the run becomes the pod's controller, the deadline shrinks.
    # No cold child was made, and the nonce never reaches the status.
    assert ("ConfigMap", NS, "demo-input") not in api.objects and ("Pod", NS, "demo-sandbox") not in api.objects
    assert document["nonce"] not in json.dumps(status)


def test_the_refill_forgets_the_pods_it_timed_once_they_leave_the_pool(env):
    """Each pool pod's start is timed once, so the refill remembers which it has timed: only while they wait in a
    pool, or an operator serving warm runs for months would hold every claimed pod's uid."""
    api, _, ctl = env
    names = start_pool(env)
    uids = {api.objects[("Pod", NS, name)]["metadata"]["uid"] for name in names}
    assert ctl.pool._ready_seen == uids
    for name in names:
        api.attach_answers[name] = runner_answer()
    for i in range(2):
        submit_and_wait(env, make_run(f"r{i}", f"uid-{i}"))
    ctl.pool.refill()
    assert ctl.pool._ready_seen == set(), ctl.pool._ready_seen


def test_the_claim_patch_is_conditional_and_hands_the_pod_to_the_run(env):
    api, _, ctl = env
    names = start_pool(env)
    seen_version = api.objects[("Pod", NS, names[0])]["metadata"]["resourceVersion"]
    patches = []
    api.fail["claim_pod"] = lambda ns, name, patch: patches.append(patch)
    ctl.on_run(api.add_run(make_run()), deleted=False)
    test, labels, annotations, owners, deadline = patches[0]
    assert test == {"op": "test", "path": "/metadata/resourceVersion", "value": seen_version}
    assert len(annotations["value"]["coderun.io/input-nonce-sha256"]) == 64  # the nonce itself stays in memory
    assert labels["value"]["coderun.io/run-uid"] == "uid-1" and labels["value"]["coderun.io/pool"] == "default"
    assert owners["value"][0]["kind"] == "CodeRun" and owners["value"][0]["controller"] is True
    # Claimed 59 s after the pod started: the rest of its life is this run's timeout plus the cold margin.
    assert deadline["path"] == "/spec/activeDeadlineSeconds" and deadline["value"] == 60 + 5 + 60


def test_a_pod_claimed_by_someone_else_first_is_skipped(env):
    api, _, ctl = env
    names = start_pool(env)
    for name in names:
        api.attach_answers[name] = runner_answer()
    # Another replica claimed the first pod after we saw it: its resourceVersion moved.
    api._stamp(api.objects[("Pod", NS, names[0])])
    run = submit_and_wait(env, make_run())
    assert run["status"]["phase"] == "Succeeded" and run["status"]["podName"] == names[1]
    assert api.calls.count("claim_pod") == 2


def end_warm_pod(env, run, nonce, stdout="real\n"):
    """The claimed pod's container ends; its log holds a vouched frame carrying `nonce`."""
    api, _, ctl = env
    pod = copy.deepcopy(api.objects[("Pod", NS, run["status"]["podName"])])
    log, termination = frame_log(stdout=stdout, nonce=nonce)
    api.logs[pod["metadata"]["name"]] = (log, True)
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"reason": "Completed", "exitCode": 0,
                                                                     "message": termination}}
    ctl.on_pod(pod, deleted=False)
    return api.run(NS, run["metadata"]["name"])


def sent_nonce(api, pod_name):
    return json.loads(api.sent[pod_name].split(b"\n", 1)[1])["nonce"]


def test_a_streamed_frame_without_this_claims_nonce_is_not_trusted(env):
    api, _, ctl = env
    names = start_pool(env)
    for name in names:
        api.attach_answers[name] = runner_answer(nonce_from_input=False, stdout="forged\n")
    run = submit_and_wait(env, make_run())
    assert run["status"]["phase"] in ("Pending", "Running") and run["status"]["startMode"] == "Warm"
    # The pod's end brings the frame the runner vouched for in its termination message, with the claim's nonce.
    run = end_warm_pod(env, run, sent_nonce(api, run["status"]["podName"]))
    assert run["status"]["phase"] == "Succeeded" and run["status"]["stdout"] == "real\n"


def test_a_program_sigkilled_from_outside_waits_for_the_container_to_say_whether_it_was_the_oom_killer(env):
    """The node's OOM killer is seen only in the container's end state: a streamed SIGKILL the runner did not send
    waits for it, so a warm run ends OOMKilled as its cold twin does."""
    api, _, ctl = env
    names = start_pool(env)
    for name in names:
        api.attach_answers[name] = runner_answer(reason="Signaled", exitCode=None, signal=9, stdout="")
    run = submit_and_wait(env, make_run())
    assert run["status"]["phase"] in ("Pending", "Running") and run["status"]["startMode"] == "Warm"
    pod = copy.deepcopy(api.objects[("Pod", NS, run["status"]["podName"])])
    log, termination = frame_log(stdout="", nonce=sent_nonce(api, pod["metadata"]["name"]), reason="Signaled",
                                 exitCode=None, signal=9)
    api.logs[pod["metadata"]["name"]] = (log, True)
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"reason": "OOMKilled", "exitCode": 0,
                                                                     "message": termination}}
    ctl.on_pod(pod, deleted=False)
    status = api.run(NS, run["metadata"]["name"])["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "OOMKilled"), status


def test_a_pod_someone_else_fed_first_never_answers_for_the_run(env):
    """A user allowed to attach in the namespace fed a waiting pod their own input: its runner ran that, with
    their nonce. The run's claim recorded another digest, so the run starts cold instead of taking that result."""
    api, _, ctl = env
    names = start_pool(env)
    for name in names:
        api.attach_answers[name] = lambda document: b""  # our input arrives at a runner that is already busy
    run = submit_and_wait(env, make_run())
    run = end_warm_pod(env, run, "f" * 64, stdout="the attacker's result\n")
    status = run["status"]
    assert status["startMode"] == "Cold" and status["podName"] == "demo-sandbox" and "stdout" not in status


def test_a_lookalike_pod_is_never_claimed(env):
    """Labels and annotations can be copied by anyone who may create pods; the spec must be the pool's own."""
    api, _, ctl = env
    names = start_pool(env)
    for name in names:
        pod = api.objects[("Pod", NS, name)]
        pod["spec"]["runtimeClassName"] = None  # e.g. a pod of the user's own, without gVisor
        api._stamp(pod)
        ctl.on_pod(copy.deepcopy(pod), deleted=False)
    run = submit_and_wait(env, make_run())
    assert run["status"]["startMode"] == "Cold" and "claim_pod" not in api.calls


def test_other_limits_or_an_empty_pool_start_cold(env):
    api, _, ctl = env
    start_pool(env, ready=False)
    ctl.on_run(api.add_run(make_run("big", uid="uid-big", limits={"memory": "512Mi"})), deleted=False)
    ctl.on_run(api.add_run(make_run("early", uid="uid-early")), deleted=False)
    for name in ("big", "early"):
        status = api.run(NS, name)["status"]
        assert status["startMode"] == "Cold" and status["podName"] == f"{name}-sandbox"
    assert "claim_pod" not in api.calls


def test_a_pod_that_cannot_be_attached_is_deleted_and_the_run_goes_cold(env):
    api, _, ctl = env
    names = start_pool(env)
    for name in names:
        api.attach_answers[name] = Transient("attach to pod: 403 Forbidden")
    run = submit_and_wait(env, make_run())
    status = run["status"]
    assert status["startMode"] == "Cold" and status["podName"] == "demo-sandbox" and status["phase"] == "Pending"
    claimed = [n for n in names if ("Pod", NS, n) not in api.objects]
    assert len(claimed) == 1  # the claimed warm pod is gone; the other still waits
    # Its deletion event does not end the run: the run follows its cold pod now.
    gone = {"metadata": {"name": claimed[0], "namespace": NS, "uid": f"pod-uid-{claimed[0]}",
                         "ownerReferences": [{"kind": "CodeRun", "uid": "uid-1", "controller": True}]}}
    ctl.on_pod(gone, deleted=True)
    assert api.run(NS, "demo")["status"]["phase"] == "Pending"


def ended_with_input_cut_short(env):
    """A run claims a warm pod whose stream broke before the whole input (the runner saw EOF): the pod as the
    kubelet reports it once the runner ended saying so, not yet delivered to the controller."""
    api = env[0]
    for name in start_pool(env):
        api.attach_answers[name] = lambda document: b""
    run = submit_and_wait(env, make_run())
    pod = copy.deepcopy(api.objects[("Pod", NS, run["status"]["podName"])])
    log, termination = frame_log(reason="InputIncomplete", exitCode=None, stdout="",
                                 message="the input stream ended after 10 of 300 bytes")
    api.logs[pod["metadata"]["name"]] = (log, True)
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"reason": "Completed", "exitCode": 0,
                                                                     "message": termination}}
    return pod


def test_input_cut_short_means_the_program_never_ran_so_the_run_goes_cold(env):
    api, _, ctl = env
    ctl.on_pod(ended_with_input_cut_short(env), deleted=False)
    status = api.run(NS, "demo")["status"]
    assert status["startMode"] == "Cold" and status["podName"] == "demo-sandbox" and status["phase"] == "Pending"


@pytest.mark.parametrize("accepted, ends_as", [(False, "Cold"), (True, "Warm")])
def test_after_a_restart_a_claim_without_input_goes_cold_and_one_with_input_is_awaited(env, accepted, ends_as,
                                                                                     monkeypatch):
    """The operator died after the claim: the new one has no session. The runner's accepted line tells whether
    the program may be running (wait for it) or never got its input (start cold: it cannot run twice)."""
    api, clock, ctl = env
    start_pool(env)
    # the operator died right after the claim: nothing is sent, nothing comes back
    monkeypatch.setattr(attach.Channel, "exchange", lambda *args, **kwargs: (True, b""))
    run = submit_and_wait(env, make_run())
    monkeypatch.undo()
    claimed = run["status"]["podName"]
    fresh = Controller(api=api, clock=clock)
    fresh.on_policy(copy.deepcopy(POLICY), deleted=False)
    digest = api.objects[("Pod", NS, claimed)]["metadata"]["annotations"]["coderun.io/input-nonce-sha256"]
    api.logs[claimed] = (f"CODERUN-ACCEPTED {digest[:16]}\n" if accepted else "CODERUN-ACCEPTED 0123456789abcdef\n",
                         True)
    fresh.on_pod(copy.deepcopy(api.objects[("Pod", NS, claimed)]), deleted=False)
    fresh.on_run(copy.deepcopy(api.run(NS, "demo")), deleted=False)
    assert api.run(NS, "demo")["status"]["startMode"] == "Warm"  # too early to tell
    clock.now = T0.replace(second=30)
    fresh.tick()
    status = api.run(NS, "demo")["status"]
    assert status["startMode"] == ends_as
    assert (("Pod", NS, claimed) in api.objects) is accepted


def test_refill_replaces_a_pool_pod_the_pool_would_not_build_now(env):
    """An older operator's pool pod (here: its input not yet on a volume of its own) is never claimed; it must
    not keep the pool's place either."""
    api, _, ctl = env
    names = start_pool(env)
    old = copy.deepcopy(api.objects[("Pod", NS, names[0])])
    old["spec"]["volumes"] = [v for v in old["spec"]["volumes"] if v["name"] != "input"]
    old["spec"]["containers"][0]["volumeMounts"] = [m for m in old["spec"]["containers"][0]["volumeMounts"]
                                                    if m["name"] != "input"]
    api.objects[("Pod", NS, names[0])] = api._stamp(copy.deepcopy(old))
    ctl.on_pod(copy.deepcopy(api.objects[("Pod", NS, names[0])]), deleted=False)
    ctl.pool.refill()
    assert ("Pod", NS, names[0]) not in api.objects and ("Pod", NS, names[1]) in api.objects
    assert api.calls.count("create_pod") == 3


def test_refill_replaces_claimed_and_spent_pods_and_drops_a_removed_policys(env, monkeypatch):
    api, _, ctl = env
    names = start_pool(env)
    dead = copy.deepcopy(api.objects[("Pod", NS, names[0])])
    dead["status"]["containerStatuses"][0]["state"] = {"terminated": {"reason": "DeadlineExceeded"}}
    api.objects[("Pod", NS, names[0])] = api._stamp(copy.deepcopy(dead))
    ctl.on_pod(copy.deepcopy(api.objects[("Pod", NS, names[0])]), deleted=False)
    ctl.pool.refill()
    assert ("Pod", NS, names[0]) not in api.objects and api.calls.count("create_pod") == 3
    monkeypatch.setattr(ctl.pool, "started", -1e9)  # long after start-up: the watch has delivered every policy
    ctl.on_policy(copy.deepcopy(POLICY), deleted=True)
    for pod in list(pool_pods(api).values()):
        ctl.on_pod(copy.deepcopy(pod), deleted=False)
    ctl.pool.refill()
    assert pool_pods(api) == {}


@pytest.mark.parametrize("change, genuine", [
    (lambda spec: None, True),
    # What the API server does to the pod it was sent: false and empty fields left out, quantities rewritten.
    (lambda spec: [spec.pop(f) for f in ("hostNetwork", "hostPID", "hostIPC")]
     + [spec["containers"][0].pop("env")]
     + [spec["containers"][0]["resources"]["limits"].update({"ephemeral-storage": "96Mi", "cpu": "1000m"})], True),
    (lambda spec: spec.pop("automountServiceAccountToken"), False),  # unset means a token is mounted
    (lambda spec: spec["containers"][0].update({"image": "attacker/image:latest"}), False),
    (lambda spec: spec["containers"][0]["securityContext"].update({"runAsNonRoot": False}), False),
    (lambda spec: spec.update({"hostNetwork": True}), False),
    (lambda spec: spec["volumes"].append({"name": "token", "secret": {"secretName": "x"}}), False),
    # The input volume is the pod's own scratch, never something else's under the same name.
    (lambda spec: spec["volumes"][0].update({"emptyDir": None, "hostPath": {"path": "/"}}), False),
    (lambda spec: spec["volumes"][0]["emptyDir"].update({"sizeLimit": "4096Ki"}), True),
    (lambda spec: spec.update({"initContainers": [{"name": "x", "image": "y"}]}), False),
    (lambda spec: spec["containers"][0]["resources"]["limits"].update({"memory": "64Gi"}), False),
])
def test_only_a_pod_built_as_the_pool_builds_it_is_genuine(change, genuine):
    from coderun_operator.builders import build_pool_pod
    policy = policy_from_object(POLICY)
    (key, (language, decision)), = trust.wanted_pools(NS, policy).items()
    pod = build_pool_pod(NS, decision, {"coderun.io/pool": "default", "coderun.io/pool-language": language,
                                        "key": key}, trust.POOL_IDLE_SECONDS)
    pod["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] = str(96 * 1024 * 1024)
    change(pod["spec"])
    assert trust.is_genuine(pod, decision) is genuine


def test_a_claim_the_status_could_not_record_sends_nothing_and_is_given_up(env):
    """The input goes only after the claim is in the status: a failed write leaves the pod unfed, and the next
    reconcile deletes it (its nonce is lost) and claims afresh."""
    api, _, ctl = env
    names = start_pool(env)
    for name in names:
        api.attach_answers[name] = runner_answer()

    def refuse_once(ns, name, status):
        del api.fail["patch_run_status"]
        raise Transient("the API server is away")
    api.fail["patch_run_status"] = refuse_once
    run = submit_and_wait(env, make_run())
    assert not (run.get("status") or {}).get("podName") and api.sent == {}
    first = next(pod["metadata"]["name"] for pod in [api.objects[k] for k in api.objects if k[0] == "Pod"]
                 if pod["metadata"].get("labels", {}).get("coderun.io/run") == "demo")
    ctl.tick()
    settle(ctl)
    run = api.run(NS, "demo")
    assert run["status"]["phase"] == "Succeeded" and run["status"]["startMode"] == "Warm"
    assert ("Pod", NS, first) not in api.objects and run["status"]["podName"] != first
    assert list(api.sent) == [run["status"]["podName"]]  # only the pod whose claim was recorded got input


def test_a_refused_claim_starts_the_run_cold_not_as_an_operator_error(env):
    """A claim the API server refuses (403: the operator's RBAC lacks pods patch) must not escape as an
    unexpected error (a traceback, then InternalError): the run starts cold."""
    api, _, ctl = env
    start_pool(env)

    def forbidden(ns, name, patch):
        raise api.Refused("the API server refused pod x: forbidden", 403)
    api.fail["claim_pod"] = forbidden
    run = submit_and_wait(env, make_run())
    assert run["status"]["startMode"] == "Cold" and run["status"]["podName"] == "demo-sandbox"
    assert not ctl._failures


def test_a_claimed_pod_of_a_pool_that_reserves_less_asks_for_its_whole_cpu_once_the_input_is_sent(env):
    api, _, ctl = env
    ctl.on_policy({**copy.deepcopy(POLICY), "spec": {"warmPool": {"size": 1, "languages": ["python"],
                                                                  "cpuRequest": "10m"}}}, deleted=False)
    (name,) = start_pool(env)
    assert api.objects[("Pod", NS, name)]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "10m"
    api.attach_answers[name] = runner_answer()
    run = submit_and_wait(env, make_run())
    assert run["status"]["phase"] == "Succeeded" and run["status"]["startMode"] == "Warm"
    assert api.calls.index("resize_pod_cpu") > api.calls.index("attach")  # off the input's path
    # A millicore under the pod's limit of 1: at the limit it would be Guaranteed, and a resize may not change
    # the QoS class (the API server refuses it).
    assert api.call_args[api.calls.index("resize_pod_cpu")] == (NS, name, "run", "999m")


def test_a_refused_resize_costs_the_run_nothing_and_a_pool_reserving_its_limit_is_not_resized(env):
    api, _, ctl = env
    names = start_pool(env)  # POLICY reserves the limit: nothing to raise
    api.attach_answers[names[0]] = runner_answer()
    submit_and_wait(env, make_run())
    assert "resize_pod_cpu" not in api.calls
    ctl.on_policy({**copy.deepcopy(POLICY), "spec": {"warmPool": {"size": 1, "languages": ["python"],
                                                                  "cpuRequest": "10m"}}}, deleted=False)
    (name,) = [n for n in start_pool(env)
               if api.objects[("Pod", NS, n)]["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "10m"]

    def infeasible(*args):
        raise api.Refused("pod resize: Forbidden: pods/resize is not allowed")
    api.fail["resize_pod_cpu"] = infeasible
    api.attach_answers[name] = runner_answer()
    run = submit_and_wait(env, make_run("second", "uid-2"))
    assert (run["status"]["phase"], run["status"]["stdout"]) == ("Succeeded", "42\n")


def test_a_run_deleted_while_its_warm_pod_is_given_up_is_not_placed_again_and_again(env):
    """The write back to Pending finds the run gone: its stored copy still names the warm pod, which (deleted
    gracefully) is still there; giving it up again from that copy would go round until the stack runs out."""
    api, _, ctl = env
    pod = ended_with_input_cut_short(env)
    api.objects[("Pod", NS, pod["metadata"]["name"])] = copy.deepcopy(pod)
    deletions = []
    api.delete_pod = lambda namespace, name, resource_version=None: deletions.append(name)  # graceful: it stays
    del api.objects[("CodeRun", NS, "demo")]  # deleted; the controller has not seen the event yet
    ctl.on_pod(pod, deleted=False)
    assert deletions == [pod["metadata"]["name"]]  # given up once (the control: it was given up at all)
    assert ("Pod", NS, "demo-sandbox") not in api.objects  # and never started cold
