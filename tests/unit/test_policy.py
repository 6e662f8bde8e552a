import pytest

from coderun.api.models import CodeRunSpec
from coderun_operator.policy import DEFAULT_POLICY, Decision, Denial, evaluate, select_policy


def spec(**fields):
    return CodeRunSpec.model_validate({"language": "python", "code": "print(1)", **fields})


def test_defaults_fill_unset_limits():
    decision = evaluate(spec(limits={"memory": "128Mi"}), DEFAULT_POLICY)
    assert isinstance(decision, Decision)
    assert decision.limits.memory == "128Mi"
    assert (decision.limits.cpu, decision.limits.timeout_seconds, decision.limits.disk) == ("1", 5, "64Mi")
    assert decision.runtime.image == "coderun.local/sandbox-python:v2"


@pytest.mark.parametrize("limits,rule,hint", [
    ({"memory": "4Gi"}, "maximums.memory", "at most 2Gi"),
    ({"cpu": "2500m"}, "maximums.cpu", "at most 2"),
    ({"timeoutSeconds": 301}, "maximums.timeoutSeconds", "at most 300"),
    ({"disk": "2Gi"}, "maximums.disk", "at most 1Gi"),
])
def test_limits_above_the_maximum_are_denied_with_the_rule(limits, rule, hint):
    denial = evaluate(spec(limits=limits), DEFAULT_POLICY)
    assert isinstance(denial, Denial) and denial.reason == "PolicyDenied"
    assert denial.rule == rule and hint in denial.message


def test_asking_for_more_within_the_maximum_is_allowed():
    decision = evaluate(spec(limits={"memory": "2Gi", "cpu": "2", "timeoutSeconds": 300}), DEFAULT_POLICY)
    assert isinstance(decision, Decision) and decision.limits.memory == "2Gi"


def test_unknown_language_names_the_offered_ones():
    denial = evaluate(spec(language="ruby"), DEFAULT_POLICY)
    assert denial.rule == "runtimes" and "python" in denial.message


def test_a_file_may_not_overwrite_the_code():
    denial = evaluate(spec(files=[{"path": "main.py", "content": "x"}]), DEFAULT_POLICY)
    assert denial.reason == "InvalidSpec" and "main.py" in denial.message


def test_policy_selection():
    assert select_policy(None, {}) is DEFAULT_POLICY
    assert select_policy("default", {}) is DEFAULT_POLICY
    denial = select_policy("strict", {})
    assert isinstance(denial, Denial) and denial.rule == "policyRef" and "strict" in denial.message
