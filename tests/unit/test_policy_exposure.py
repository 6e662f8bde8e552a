"""What a policy's author can do to the shared operator: regex cost budgets, compiled patterns that live and go
with their policy, and egress that reaches the cluster itself only when the policy says so."""
import gc
import weakref

import pytest

from coderun.api.models import CodeRunSpec
from coderun_operator.controller import Controller
from coderun_operator.policy.patterns import redactor
from coderun_operator.policy import InvalidPolicyMark, decision_from_record, evaluate
from coderun.egress.ranges import protected_networks
from coderun_operator.policy.egress import cluster_egress_refusal
from coderun_operator.policy.load import InvalidPolicy, policy_from_object
from coderun_operator.policy.patterns import POLICY_MAX_PROGRAM
from coderun_operator.policy.redact import InvalidPattern, compile_pattern

LOCAL_CLUSTER = protected_networks({"CODERUN_POD_CIDRS": "10.88.0.0/16", "CODERUN_SERVICE_CIDRS": "10.96.0.0/16",
                                    "CODERUN_NODE_CIDRS": "192.168.1.10/32"})


def policy_object(name="p", uid="u1", **spec):
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1"}, "spec": spec}


@pytest.mark.parametrize("pattern", [r"\pL{300}", r"\pL{20}", r"[\p{Greek}\p{Han}\pL]{50}", r"\w{1000}\w{1000}"])
def test_a_pattern_over_the_budget_is_refused_quickly_saying_too_large(pattern):
    with pytest.raises(InvalidPattern, match="too large"):
        compile_pattern(pattern)


def test_ordinary_patterns_fit():
    for pattern in [r"ACME-\d{6}", r"\pL+", r"\b(?:password|secret)\s*=\s*\S{8,}", r"child_process"]:
        assert compile_pattern(pattern).programsize <= 1201  # \pL+ is the largest


def test_a_costly_pattern_in_a_policy_is_refused_naming_its_field():
    with pytest.raises(InvalidPolicy, match=r"^spec\.codeRules\.deniedPatterns\[1\]\.pattern: .*too large"):
        policy_from_object(policy_object(codeRules={"deniedPatterns": [
            {"language": "javascript", "pattern": "eval"}, {"language": "javascript", "pattern": r"\pL{300}"}]}))


def test_the_policy_budget_counts_all_its_patterns_together():
    each = r"\pL{2}"  # ~2,400 instructions: within one pattern's budget, not 64 times over
    assert compile_pattern(each).programsize * 64 > POLICY_MAX_PROGRAM
    with pytest.raises(InvalidPolicy, match=r"spec\.redactionPatterns\[\d+\]: the policy's patterns together"):
        policy_from_object(policy_object(redactionPatterns=[each] * 64))


def test_a_loaded_policy_uses_its_own_compiled_patterns():
    loaded = policy_from_object(policy_object(redactionPatterns=[r"ACME-\d{6}"], codeRules={"deniedPatterns": [
        {"language": "python", "pattern": r"os\.fork"}]}))
    assert loaded.compiled_patterns.redactor.redact("id ACME-123456") == ("id [REDACTED:policy]", 1)
    denial = evaluate(CodeRunSpec.model_validate({"language": "python", "code": "import os\nos.fork()"}), loaded)
    assert "line 2" in denial.message and denial.rule == "codeRules.deniedPatterns[0]"


def test_compiled_patterns_go_when_the_policy_changes_or_is_deleted():
    ctl = Controller()
    ctl.on_policy(policy_object(redactionPatterns=[r"ACME-\d{6}"]), deleted=False)
    first = weakref.ref(ctl.store.policies("ns")["p"].compiled_patterns)
    ctl.on_policy(policy_object(redactionPatterns=[r"ACME-\d{6}"]), deleted=False)  # same uid and digest
    assert ctl.store.policies("ns")["p"].compiled_patterns is first()  # kept, not compiled again
    ctl.on_policy(policy_object(redactionPatterns=[r"ACME-\d{7}"]), deleted=False)  # changed: new digest
    gc.collect()
    assert first() is None
    second = weakref.ref(ctl.store.policies("ns")["p"].compiled_patterns)
    ctl.on_policy(policy_object(), deleted=True)
    gc.collect()
    assert second() is None and ctl.store.policies("ns") == {}


def test_a_result_uses_the_live_policy_redactor_only_while_the_digest_matches():
    live = policy_from_object(policy_object(redactionPatterns=[r"ACME-\d{6}"]))
    recorded = decision_from_record(evaluate(CodeRunSpec.model_validate({"language": "python", "code": "1"}),
                                             live).record()).policy
    assert redactor(recorded, {"p": live}) is live.compiled_patterns.redactor
    changed = policy_from_object(policy_object(redactionPatterns=[r"OTHER"]))
    one_off = redactor(recorded, {"p": changed})
    assert one_off is not changed.compiled_patterns.redactor
    assert one_off.redact("ACME-123456")[0] == "[REDACTED:policy]"  # the recorded patterns still apply
    assert redactor(recorded, {"p": InvalidPolicyMark("broken")}).redact("ACME-123456")[1] == 1


@pytest.mark.parametrize("cidr, covers", [
    ("10.88.3.0/24", "10.88.0.0/16"), ("10.0.0.0/8", "10.88.0.0/16"), ("0.0.0.0/0", "127.0.0.0/8"),
    ("10.96.0.1/32", "10.96.0.0/16"), ("192.168.1.0/24", "192.168.1.10/32"), ("169.254.169.254/32", "169.254.0.0/16"),
    ("127.0.0.1/32", "127.0.0.0/8"), ("::/0", "::1/128"), ("fe80::1/128", "fe80::/10"),
])
def test_egress_covering_the_cluster_is_refused_naming_the_field(cidr, covers):
    message = cluster_egress_refusal(["203.0.113.0/24", cidr], False, LOCAL_CLUSTER)
    assert message.startswith(f"spec.egress[1].cidr: {cidr} covers {covers}") and "allowClusterEgress" in message
    assert cluster_egress_refusal([cidr], True, LOCAL_CLUSTER) is None


def test_egress_outside_the_cluster_is_allowed():
    assert cluster_egress_refusal(["203.0.113.0/24", "10.89.0.0/16", "2001:db8::/32"], False, LOCAL_CLUSTER) is None


def test_without_configured_ranges_every_private_range_is_protected():
    unconfigured = protected_networks({})
    for address in ["10.1.2.3", "172.20.0.1", "192.168.0.5", "100.64.1.1", "fd12::1", "127.0.0.1", "169.254.1.1"]:
        assert cluster_egress_refusal([f"{address}/32"], False, unconfigured) is not None, address
    assert cluster_egress_refusal(["172.20.0.1/32"], False, LOCAL_CLUSTER) is None  # configured: only its ranges


def test_the_loader_and_so_the_webhook_refuse_cluster_egress_unless_allowed():
    from coderun_operator.webhook import review_policy
    refusal = review_policy(policy_object(egress=[{"cidr": "169.254.169.254/32"}]))
    assert "spec.egress[0].cidr: 169.254.169.254/32 covers 169.254.0.0/16" in refusal
    assert review_policy(policy_object(allowClusterEgress=True, egress=[{"cidr": "169.254.169.254/32"}])) is None
