"""The validating webhook's review of new runs: the requester's own identity decides which policy it may name,
and nothing is allowed on the built-in baseline before the namespace's policies are known."""
import pytest

from coderun_operator import webhook
from coderun_operator.controller import Controller
from fake_k8s import FakeK8s, Transient

NS = "team-a"
ALICE = {"username": "alice", "groups": ["system:authenticated", "team"]}


def new_run(**spec):
    return {"apiVersion": "coderun.io/v1alpha1", "kind": "CodeRun", "metadata": {"name": "r", "namespace": NS},
            "spec": {"language": "python", "code": "print(1)", **spec}}


def policy(name, **spec):
    return {"kind": "CodeRunPolicy", "metadata": {"name": name, "namespace": NS, "resourceVersion": "5"}, "spec": spec}


@pytest.fixture
def ctl():
    api = FakeK8s()
    api.policies = [policy("default", defaults={"memory": "64Mi"}, maximums={"memory": "128Mi"}), policy("open"), policy("hidden")]
    return Controller(api=api)


def test_the_requester_needs_the_use_verb_to_name_a_policy(ctl):
    refusal = webhook.review_run(new_run(policyRef="open"), ctl, ALICE)
    assert "alice may not use CodeRunPolicy 'open'" in refusal and refusal.endswith("[policyRef]")
    assert "hidden" not in refusal
    ctl.api.grants.add(("team", "use", "coderunpolicies", NS, "open"))
    assert webhook.review_run(new_run(policyRef="open"), ctl, ALICE) is None
    assert webhook.review_run(new_run(), ctl, ALICE) is None  # the namespace's default needs nothing


def test_the_baseline_cannot_be_named_to_escape_the_namespace_default(ctl):
    refusal = webhook.review_run(new_run(policyRef="builtin-default", limits={"memory": "1Gi"}), ctl, ALICE)
    assert "cannot be named" in refusal
    assert "128Mi" in webhook.review_run(new_run(limits={"memory": "1Gi"}), ctl, ALICE)


def test_nothing_is_allowed_before_the_policies_were_listed(ctl):
    ctl.api.fail["list_policies"] = lambda *_: (_ for _ in ()).throw(Transient("away"))
    with pytest.raises(Transient):  # kopf answers with the webhook's failurePolicy; the operator decides later
        webhook.review_run(new_run(limits={"memory": "1Gi"}), ctl, ALICE)
    del ctl.api.fail["list_policies"]
    assert "128Mi" in webhook.review_run(new_run(limits={"memory": "1Gi"}), ctl, ALICE)


def test_a_run_in_a_session_is_left_to_the_sessions_policy():
    """The namespace's `default` is not the session's policy (nor need it exist): the operator judges the run
    under the session's when its turn comes."""
    api = FakeK8s()
    api.policies = [policy("data-science", sessions={"allowed": True}), policy("strict", admission="Enforce")]
    assert webhook.review_run(new_run(session="s1", code="import os"), Controller(api=api), ALICE) is None
    assert "default" in webhook.review_run(new_run(), Controller(api=api), ALICE)  # no default: a plain run is refused
