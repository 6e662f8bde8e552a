"""A CodeRunPolicy's status against a fake of k8s.py: whether the operator applies it (Accepted, with what to
change when it cannot) and how its warm pool stands, each written only when it changes (`kubectl get crpol`)."""
import copy
import threading
from datetime import timedelta

from coderun.api.coderunpolicy import WarmPoolStatus

from coderun_operator.controller import Controller
from coderun_operator.controller.policy_status import PolicyStatusWriter
from coderun_operator.results.status import policy_accepted_status
from fake_k8s import FakeK8s, Transient
from support.controller import NS, T0, Clock
from support.warm import start_pool

POLICY = {"apiVersion": "coderun.io/v1alpha1", "kind": "CodeRunPolicy",
          "metadata": {"name": "gpu", "namespace": NS, "uid": "policy-uid", "generation": 3},
          "spec": {"maxConcurrentRuns": 2}}
INVALID = {**POLICY, "spec": {"defaults": {"memory": "2Gi"}, "maximums": {"memory": "1Gi"}}}


def condition(policy, type_="Accepted"):
    found, = [c for c in policy["status"]["conditions"] if c["type"] == type_]
    return found


def controller_with(*policies):
    api, clock = FakeK8s(), Clock()
    api.policies = [copy.deepcopy(p) for p in policies]
    return api, clock, Controller(api=api, clock=clock)


def test_an_applied_policy_says_so_once():
    api, _, ctl = controller_with(POLICY)
    ctl.on_policy(copy.deepcopy(POLICY), deleted=False)
    assert "patch_policy_status" not in api.calls  # not on the event's path (a webhook answer may load policies)
    ctl.tick()
    written, = api.policies
    accepted = condition(written)
    assert (accepted["status"], accepted["reason"], accepted["observedGeneration"]) == ("True", "Accepted", 3)
    assert written["status"]["observedGeneration"] == 3
    # A restarted operator (nothing in memory) sees the status already says so: no write.
    restarted = Controller(api=api, clock=Clock())
    restarted.on_policy(copy.deepcopy(written), deleted=False)
    restarted.tick()
    assert api.calls.count("patch_policy_status") == 1


def test_a_policy_the_operator_cannot_apply_says_why_and_what_to_change():
    api, _, ctl = controller_with(INVALID)
    ctl.on_policy(copy.deepcopy(INVALID), deleted=False)
    ctl.tick()
    refused = condition(api.policies[0])
    assert (refused["status"], refused["reason"]) == ("False", "InvalidPolicy")
    assert "spec.defaults.memory=2Gi is above the maximum 1Gi" in refused["message"]
    assert "lower spec.defaults.memory or raise spec.maximums.memory" in refused["message"]
    fixed = {**copy.deepcopy(api.policies[0]), "spec": POLICY["spec"]}
    fixed["metadata"]["generation"] = 4
    ctl.on_policy(fixed, deleted=False)
    ctl.tick()
    applied = condition(api.policies[0])
    assert (applied["status"], applied["observedGeneration"]) == ("True", 4)


def test_the_transition_time_moves_only_when_acceptance_flips():
    first = policy_accepted_status(POLICY, None, T0).model_dump(by_alias=True, exclude_none=True)
    moved = {**POLICY, "metadata": {**POLICY["metadata"], "generation": 4}, "status": first}
    again = policy_accepted_status(moved, None, T0 + timedelta(minutes=5))
    assert again.conditions[0].last_transition_time == first["conditions"][0]["lastTransitionTime"]
    refused = policy_accepted_status(moved, "bad\x1b[2J", T0 + timedelta(minutes=6))
    assert refused.conditions[0].last_transition_time != first["conditions"][0]["lastTransitionTime"]
    assert "\x1b" not in refused.conditions[0].message  # kubectl prints it to a terminal


def test_a_write_the_api_server_did_not_take_is_tried_again_on_the_tick():
    api, _, ctl = controller_with(POLICY)
    api.fail["patch_policy_status"] = lambda *_: (_ for _ in ()).throw(Transient("connection reset"))
    ctl.on_policy(copy.deepcopy(POLICY), deleted=False)
    ctl.tick()
    assert "status" not in api.policies[0]
    del api.fail["patch_policy_status"]
    ctl.tick()
    assert condition(api.policies[0])["status"] == "True"
    ctl.tick()
    assert api.calls.count("patch_policy_status") == 2  # refused once, written once, then no more


def test_the_warm_pool_stands_in_the_status_as_it_fills_and_goes_when_the_pool_does():
    pooled = {**POLICY, "metadata": {**POLICY["metadata"], "name": "default"},
              "spec": {"warmPool": {"size": 2, "languages": ["python"]}}}
    api, clock, ctl = controller_with(pooled)
    ctl.on_policy(copy.deepcopy(pooled), deleted=False)
    ctl.pool.refill()  # pods created, none ready yet
    assert api.policies[0]["status"]["warmPool"] == {"size": 2, "ready": 0}
    start_pool((api, clock, ctl))  # the kubelet reports them running
    ctl.pool.refill()
    assert api.policies[0]["status"]["warmPool"] == {"size": 2, "ready": 2}
    writes = api.calls.count("patch_policy_status")
    ctl.pool.refill()
    assert api.calls.count("patch_policy_status") == writes  # nothing changed: nothing written
    unpooled = {**copy.deepcopy(api.policies[0]), "spec": {}}
    ctl.on_policy(unpooled, deleted=False)
    ctl.pool.refill()
    ctl.tick()
    assert "warmPool" not in api.policies[0]["status"] and condition(api.policies[0])["status"] == "True"


def test_a_slow_status_write_never_holds_up_the_policys_event():
    """`accepted` runs on a policy's event and the webhook's path; a pool's write may take the API server's time."""
    api, clock = FakeK8s(), Clock()
    writing, release = threading.Event(), threading.Event()

    def slow(*args):
        writing.set()
        release.wait(10)
    api.fail["patch_policy_status"] = slow
    writer = PolicyStatusWriter(api, clock)
    pass_ = threading.Thread(target=writer.pools, args=({(NS, "gpu"): WarmPoolStatus(size=2, ready=1)},))
    pass_.start()
    assert writing.wait(5)
    event = threading.Thread(target=writer.accepted, args=(copy.deepcopy(POLICY), None))
    event.start()
    event.join(2)
    done_while_writing = not event.is_alive()
    release.set()
    pass_.join(5)
    assert done_while_writing
