"""Where sandbox pods run (CodeRunPolicy spec.scheduling over the chart's sandboxScheduling): the per-field merge,
the five pod fields on cold, warm pool and session pods with their hardening untouched, the warm pool's key and
trust, the model's refusals naming the field, and the recorded decision."""
import copy
import dataclasses

import pytest
from pydantic import ValidationError

from coderun.api.coderunsession import CodeRunSessionSpec
from coderun.api.coderunpolicy import Sessions
from coderun.api.models import CodeRunSpec
from coderun.api.policy import DEFAULT_POLICY, InvalidPolicy, decision_from_record, read_policy_object
from coderun.api.scheduling import Scheduling, Toleration, effective_scheduling
from coderun_operator.builders import build_pod, build_pool_pod, scheduling as builder_scheduling
from coderun_operator.builders.scheduling import SCHEDULING_VARIABLE, chart_defaults, holds_scheduling
from coderun_operator.builders.session import build_session_pod
from coderun_operator.controller import Controller
from coderun_operator.controller.warm import trust
from coderun_operator.policy import evaluate
from coderun_operator.policy.load import policy_from_object
from coderun_operator.policy.session import session_verdict
from coderun_operator.results.pod_state import pending_verdict, waiting_message
from fake_k8s import FakeK8s
from support.controller import NS, Clock, make_run
from support.sessions import make_session
from support.warm import POLICY, pool_pods, runner_answer, start_pool, submit_and_wait

TAINT = {"key": "sandbox.example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}
POOL_NODES = {"sandbox.example.com/pool": "sandboxes"}
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}]}]}}}
EVERYTHING = {"nodeSelector": POOL_NODES, "tolerations": [TAINT], "affinity": AFFINITY,
              "priorityClassName": "sandboxes", "imagePullSecrets": ["registry-mirror"]}
# The pod fields a sandbox's isolation rests on: scheduling must never reach them.
HARDENING = ("runtimeClassName", "securityContext", "automountServiceAccountToken", "enableServiceLinks",
             "hostNetwork", "hostPID", "hostIPC", "dnsPolicy", "dnsConfig", "restartPolicy", "containers", "volumes")


@pytest.fixture
def chart(monkeypatch):
    """Sets the chart's defaults (sandboxScheduling) as the operator read them at start."""
    def set_defaults(values: dict) -> Scheduling:
        defaults = Scheduling.model_validate(values)
        monkeypatch.setattr(builder_scheduling, "CHART_DEFAULTS", defaults)
        return defaults
    set_defaults({})
    return set_defaults


def policy_with(scheduling: dict | None, **spec):
    obj = copy.deepcopy(POLICY)
    obj["spec"].update(spec)
    if scheduling is not None:
        obj["spec"]["scheduling"] = scheduling
    return policy_from_object(obj)


def decision_of(policy):
    return evaluate(CodeRunSpec.model_validate({"language": "python", "code": "print(1)"}), policy)


# ---------------------------------------------------------------- the merge
def test_a_policy_field_replaces_the_charts_whole_and_an_unset_one_takes_it():
    defaults = Scheduling.model_validate({"nodeSelector": {"pool": "shared"}, "tolerations": [TAINT],
                                          "priorityClassName": "low"})
    policy = Scheduling.model_validate({"tolerations": [{"key": "gpu", "operator": "Exists"}],
                                        "imagePullSecrets": ["mirror"]})
    merged = effective_scheduling(policy, defaults)
    # replaced, not merged within the field: the chart's taint is not tolerated any more
    assert [t.key for t in merged.tolerations] == ["gpu"]
    assert merged.node_selector == {"pool": "shared"} and merged.priority_class_name == "low"
    assert merged.image_pull_secrets == ["mirror"] and merged.affinity is None
    assert effective_scheduling(None, defaults) == defaults


def test_an_empty_policy_field_sets_none_in_place_of_the_charts():
    defaults = Scheduling.model_validate({"nodeSelector": {"pool": "shared"}, "tolerations": [TAINT]})
    merged = effective_scheduling(Scheduling.model_validate({"tolerations": [], "nodeSelector": {}}), defaults)
    assert merged.tolerations == [] and merged.node_selector == {}
    assert builder_scheduling.pod_scheduling(merged) == {}


# ---------------------------------------------------------------- the pods
def _pods(decision):
    verdict = session_verdict(CodeRunSessionSpec(language="python"),
                              dataclasses.replace(decision.policy, sessions=Sessions(allowed=True)), 0)
    return {"cold": build_pod(make_run(), decision, "demo-input"),
            "warm": build_pool_pod(NS, decision, {"coderun.io/pool": "p", "coderun.io/pool-language": "python",
                                                  "key": "k"}, trust.POOL_IDLE_SECONDS),
            "session": build_session_pod(make_session(), verdict.decision, verdict.max_lifetime_seconds)}


def test_cold_warm_and_session_pods_get_the_policys_scheduling_and_keep_their_hardening(chart):
    plain = _pods(decision_of(policy_with(None)))
    placed = _pods(decision_of(policy_with(EVERYTHING)))
    for kind, pod in placed.items():
        spec = pod["spec"]
        assert spec["nodeSelector"] == POOL_NODES and spec["tolerations"] == [TAINT], kind
        assert spec["affinity"] == AFFINITY and spec["priorityClassName"] == "sandboxes", kind
        assert spec["imagePullSecrets"] == [{"name": "registry-mirror"}], kind
        for field in HARDENING:
            assert spec[field] == plain[kind]["spec"][field], (kind, field)
        # exactly the five fields are added, nothing else moves
        assert set(spec) - set(plain[kind]["spec"]) == {"nodeSelector", "tolerations", "affinity",
                                                         "priorityClassName", "imagePullSecrets"}, kind
    assert all(not set(pod["spec"]) & {"nodeSelector", "tolerations", "affinity"} for pod in plain.values())


def test_without_a_policy_field_every_pod_takes_the_charts_default_even_the_builtin_policys(chart):
    chart({"nodeSelector": {"pool": "shared"}, "tolerations": [TAINT]})
    for decision in (decision_of(policy_with({"nodeSelector": POOL_NODES})), decision_of(DEFAULT_POLICY)):
        for kind, pod in _pods(decision).items():
            assert pod["spec"]["tolerations"] == [TAINT], kind
    assert _pods(decision_of(DEFAULT_POLICY))["cold"]["spec"]["nodeSelector"] == {"pool": "shared"}
    assert _pods(decision_of(policy_with({"nodeSelector": POOL_NODES})))["warm"]["spec"]["nodeSelector"] == POOL_NODES


def test_the_recorded_decision_keeps_the_policys_scheduling_and_start_deadline():
    decision = decision_of(policy_with(EVERYTHING, startDeadlineSeconds=20))
    again = decision_from_record(decision.record())
    assert again.policy.scheduling == decision.policy.scheduling and again.policy.start_deadline_seconds == 20
    assert build_pod(make_run(), again, "x")["spec"]["tolerations"] == [TAINT]
    # a policy without either records neither (the cache keys of such runs stay what they were)
    record = decision_of(policy_with(None)).record().model_dump(by_alias=True, exclude_none=True)
    assert "scheduling" not in record and "startDeadlineSeconds" not in record
    assert decision_from_record(decision_of(policy_with(None)).record()).policy.start_deadline_seconds == 300


# ---------------------------------------------------------------- the warm pool
def test_the_pool_key_follows_the_charts_defaults_and_the_policys_scheduling(chart):
    policy = policy_with(None)
    before = set(trust.wanted_pools(NS, policy))
    chart({"tolerations": [TAINT]})
    assert set(trust.wanted_pools(NS, policy)).isdisjoint(before)  # pods made under the old defaults: another pool
    chart({})
    assert set(trust.wanted_pools(NS, policy)) == before  # positive control: same defaults, same pool


def test_a_pool_pod_is_genuine_only_where_its_scheduling_puts_it(chart):
    policy = policy_with(EVERYTHING)
    (key, (language, decision)), = trust.wanted_pools(NS, policy).items()
    pod = build_pool_pod(NS, decision, {"coderun.io/pool": "default", "coderun.io/pool-language": language,
                                        "key": key}, trust.POOL_IDLE_SECONDS)
    assert trust.is_genuine(pod, decision)
    # what admission adds (the RuntimeClass's selector and taints, the default not-ready tolerations, the
    # ServiceAccount's pull secrets) leaves it the pool's
    admitted = copy.deepcopy(pod)
    admitted["spec"]["nodeSelector"]["sandbox.example.com/gvisor"] = "true"
    admitted["spec"]["tolerations"].append({"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                            "effect": "NoExecute", "tolerationSeconds": 300})
    admitted["spec"]["imagePullSecrets"].append({"name": "default-sa-secret"})
    assert trust.is_genuine(admitted, decision)
    for field in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets"):
        elsewhere = copy.deepcopy(pod)
        del elsewhere["spec"][field]
        assert not trust.is_genuine(elsewhere, decision), field
    other = copy.deepcopy(pod)
    other["spec"]["nodeSelector"] = {"sandbox.example.com/pool": "shared"}
    assert not trust.is_genuine(other, decision)


def test_holds_scheduling_reads_the_pod_as_the_api_server_returns_it():
    # an empty key or value is left out by the API server (omitempty): still the same toleration
    scheduling = Scheduling.model_validate({"tolerations": [{"key": "", "operator": "Exists"}]})
    assert builder_scheduling.pod_scheduling(scheduling) == {"tolerations": [{"operator": "Exists"}]}
    assert holds_scheduling({"tolerations": [{"operator": "Exists"}]}, scheduling)
    assert not holds_scheduling({}, scheduling)


@pytest.fixture
def env(chart):
    api, clock = FakeK8s(), Clock()
    ctl = Controller(api=api, clock=clock)
    obj = copy.deepcopy(POLICY)
    obj["spec"]["scheduling"] = {"nodeSelector": POOL_NODES, "tolerations": [TAINT]}
    ctl.on_policy(obj, deleted=False)
    return api, clock, ctl


def test_pool_pods_carry_their_policys_scheduling_and_a_run_claims_one(env):
    api, _, _ = env
    names = start_pool(env)
    assert names and all(pool_pods(api)[n]["spec"]["tolerations"] == [TAINT] for n in names)
    for name in names:
        api.attach_answers[name] = runner_answer()
    status = submit_and_wait(env, make_run())["status"]
    assert status["startMode"] == "Warm" and status["phase"] == "Succeeded"
    assert status["decision"]["scheduling"]["tolerations"] == [TAINT]


def test_a_pool_pod_made_under_other_scheduling_is_not_claimed(env, chart):
    api, _, ctl = env
    names = start_pool(env)
    for name in names:
        api.attach_answers[name] = runner_answer()
    # The same pods, now off the policy's nodes (a look-alike, or an older placement): never handed a run.
    for name in names:
        pod = api.objects[("Pod", NS, name)]
        pod["spec"]["nodeSelector"] = {"sandbox.example.com/pool": "shared"}
        ctl.on_pod(copy.deepcopy(pod), deleted=False)
    status = submit_and_wait(env, make_run())["status"]
    assert status["startMode"] == "Cold" and status["podName"] == "demo-sandbox"
    assert api.objects[("Pod", NS, "demo-sandbox")]["spec"]["nodeSelector"] == POOL_NODES


# ---------------------------------------------------------------- the model's refusals
@pytest.mark.parametrize("scheduling, field, says", [
    ({"tolerations": [{"key": "k", "operator": "Matches"}]}, "spec.scheduling.tolerations.0.operator",
     "Exists|Equal"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoRun"}]}, "spec.scheduling.tolerations.0.effect",
     "NoSchedule|PreferNoSchedule|NoExecute"),
    ({"tolerations": [{"key": "k", "operator": "Exists"}] * 33}, "spec.scheduling.tolerations", "at most 32"),
    ({"nodeSelector": {f"k{i}": "v" for i in range(33)}}, "spec.scheduling.nodeSelector", "at most 32"),
    ({"nodeSelector": {"not a key!": "v"}}, "spec.scheduling.nodeSelector", "not a label key"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "spec.scheduling.tolerations.0",
     "remove value"),
    ({"tolerations": [{"operator": "Equal", "value": "v"}]}, "spec.scheduling.tolerations.0", "set key"),
    ({"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]},
     "spec.scheduling.tolerations.0", "set effect: NoExecute"),
    ({"affinity": {"nodeAffinity": {"requiredDuringScheduling": {}}}}, "spec.scheduling.affinity.nodeAffinity",
     "Extra inputs"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In"}]}]}}}},
     "spec.scheduling.affinity.nodeAffinity", "needs at least one value"),
    ({"priorityClassName": "system-node-critical"}, "spec.scheduling.priorityClassName", "system PriorityClass"),
    ({"imagePullSecrets": ["Not_A_Name"]}, "spec.scheduling.imagePullSecrets", "not a Secret name"),
    ({"startDeadlineSeconds": 1}, "spec.scheduling", "Extra inputs"),
])
def test_a_bad_scheduling_is_refused_naming_the_field(scheduling, field, says):
    obj = copy.deepcopy(POLICY)
    obj["spec"]["scheduling"] = scheduling
    with pytest.raises(InvalidPolicy) as refused:
        read_policy_object(obj)
    assert str(refused.value).startswith(field) and says in str(refused.value), str(refused.value)


def test_a_good_scheduling_is_accepted():
    # the positive control of the refusals above
    obj = copy.deepcopy(POLICY)
    obj["spec"].update({"scheduling": EVERYTHING, "startDeadlineSeconds": 20})
    spec, policy = read_policy_object(obj)
    assert policy.scheduling == spec.scheduling and policy.start_deadline_seconds == 20
    Toleration.model_validate({"key": "k", "operator": "Equal", "value": "v", "effect": "NoExecute",
                               "tolerationSeconds": 30})


def test_a_run_has_no_scheduling_of_its_own():
    with pytest.raises(ValidationError, match="Extra inputs"):
        CodeRunSpec.model_validate({"language": "python", "code": "x", "scheduling": {"nodeSelector": {"a": "b"}}})
    for name in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets"):
        assert name not in CodeRunSpec.model_json_schema(by_alias=True)["properties"]


def test_the_policy_crd_carries_the_rules_for_the_api_server():
    from coderun.api.crd import crd, policy_crd
    spec = policy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    scheduling = spec["scheduling"]["properties"]
    toleration = scheduling["tolerations"]["items"]
    assert scheduling["tolerations"]["maxItems"] == 32 and scheduling["nodeSelector"]["maxProperties"] == 32
    assert toleration["properties"]["effect"]["pattern"] == "^(NoSchedule|PreferNoSchedule|NoExecute)$"
    assert {r["fieldPath"] for r in toleration["x-kubernetes-validations"]} == {".value", ".key",
                                                                                ".tolerationSeconds"}
    node = scheduling["affinity"]["properties"]["nodeAffinity"]["properties"]
    term = node["requiredDuringSchedulingIgnoredDuringExecution"]["properties"]["nodeSelectorTerms"]
    assert term["maxItems"] == 8 and "x-kubernetes-validations" in term["items"]["properties"]["matchExpressions"][
        "items"]
    assert 10 <= spec["startDeadlineSeconds"]["minimum"] and spec["startDeadlineSeconds"]["maximum"] == 3600
    # the run's status records it whole, not typed a second time
    status = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["decision"]["properties"]["scheduling"] == {
        "description": status["decision"]["properties"]["scheduling"]["description"], "type": "object",
        "x-kubernetes-preserve-unknown-fields": True}


# ---------------------------------------------------------------- the chart's defaults as the operator reads them
def test_the_charts_defaults_are_read_by_the_policys_model():
    assert chart_defaults({}) == Scheduling()
    read = chart_defaults({SCHEDULING_VARIABLE: '{"tolerations": [{"key": "k", "operator": "Exists"}]}'})
    assert read.tolerations[0].key == "k"
    with pytest.raises(SystemExit, match=f"{SCHEDULING_VARIABLE}: sandboxScheduling.tolerations.0.operator: "):
        chart_defaults({SCHEDULING_VARIABLE: '{"tolerations": [{"key": "k", "operator": "Matches"}]}'})
    with pytest.raises(SystemExit, match=SCHEDULING_VARIABLE):
        chart_defaults({SCHEDULING_VARIABLE: "{not json"})


# ---------------------------------------------------------------- what an unschedulable run is told
def _unscheduled(message):
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "run"}]}, "status": {"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}}


def test_a_pod_no_node_may_take_points_at_the_policys_scheduling():
    taint = _unscheduled("0/1 nodes are available: 1 node(s) had untolerated taint {coderun.test/dedicated: }. "
                         "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.")
    outcome = pending_verdict(taint, 21, 20)
    assert outcome.reason == "Unschedulable" and "untolerated taint" in outcome.message
    assert "spec.scheduling" in outcome.message and "smaller limits" not in outcome.message
    assert "spec.scheduling" in waiting_message("p", taint, 20)
    selector = _unscheduled("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.")
    assert "spec.scheduling" in pending_verdict(selector, 21, 20).message
    # positive control: a node without room is still about the run's limits
    room = pending_verdict(_unscheduled("0/1 nodes are available: 1 Insufficient cpu."), 21, 20)
    assert "ask for smaller limits" in room.message and "spec.scheduling" not in room.message
    assert pending_verdict(taint, 19, 20) is None  # within the deadline it waits
