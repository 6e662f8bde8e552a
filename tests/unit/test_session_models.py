"""CodeRunSession and spec.session: what the models refuse, their defaults, and the CEL the API server runs."""
import re

import pytest
from pydantic import ValidationError

from coderun.api import crd
from coderun.api.coderunpolicy import CodeRunPolicySpec
from coderun.api.coderunsession import CodeRunSessionSpec
from coderun.api.models import (SESSION_NO_CACHE, SESSION_NO_POD_LIMITS, SESSION_NO_POLICY_REF, CodeRunSpec)


def session(**fields):
    return CodeRunSessionSpec.model_validate({"language": "python", **fields})


def run(**fields):
    return CodeRunSpec.model_validate({"language": "python", "code": "print(1)", **fields})


def test_a_session_keeps_files_only_unless_asked_and_has_bounded_timeouts_by_default():
    spec = session()
    assert spec.keep_state is False
    assert (spec.idle_timeout_seconds, spec.max_lifetime_seconds) == (600, 3600)
    assert session(keepState=True).keep_state is True


@pytest.mark.parametrize("fields", [
    {"language": "Python"}, {"idleTimeoutSeconds": 9}, {"idleTimeoutSeconds": 86401}, {"maxLifetimeSeconds": 59},
    {"maxLifetimeSeconds": 86401}, {"idleTimeoutSeconds": 700, "maxLifetimeSeconds": 600}, {"keepstate": True},
    {"limits": {"memory": "lots"}},
])
def test_a_bad_session_spec_is_refused(fields):
    with pytest.raises(ValidationError):
        session(**fields)


@pytest.mark.parametrize("name", ["alice-analysis", "a", "s.1", "a" * 253])
def test_a_run_names_a_session_by_its_object_name(name):
    assert run(session=name).session == name


@pytest.mark.parametrize("name", ["", "Alice", "-a", "a-", "a_b", "a/b", "a b", "a" * 254, "../x"])
def test_a_run_naming_no_valid_object_is_refused(name):
    with pytest.raises(ValidationError):
        run(session=name)


@pytest.mark.parametrize("fields, says", [
    ({"policyRef": "gpu"}, SESSION_NO_POLICY_REF),
    ({"limits": {"memory": "1Gi"}}, SESSION_NO_POD_LIMITS),
    ({"limits": {"cpu": "2"}}, SESSION_NO_POD_LIMITS),
    ({"limits": {"disk": "1Gi"}}, SESSION_NO_POD_LIMITS),
    ({"cache": {"enabled": True}}, SESSION_NO_CACHE),
])
def test_a_session_run_takes_the_sessions_policy_pod_and_no_cache(fields, says):
    with pytest.raises(ValidationError, match=re.escape(says)):
        run(session="s", **fields)
    run(**fields)  # without a session each is fine


def test_a_session_run_may_set_its_own_timeout_and_output_cap():
    spec = run(session="s", limits={"timeoutSeconds": 30, "outputBytes": 2048}, cache={"enabled": False})
    assert spec.limits.timeout_seconds == 30


def _spec_schema(generate):
    return generate()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_the_crd_carries_the_same_rules_for_the_api_server():
    run_spec = _spec_schema(crd.crd)
    assert run_spec["properties"]["session"]["pattern"] and run_spec["properties"]["session"]["maxLength"] == 253
    messages = {v["message"] for v in run_spec["x-kubernetes-validations"]}
    assert {SESSION_NO_POLICY_REF, SESSION_NO_POD_LIMITS, SESSION_NO_CACHE} <= messages
    # spec.session is immutable with the rest of the spec.
    assert "self == oldSelf" in [v["rule"] for v in run_spec["x-kubernetes-validations"]]
    session_spec = _spec_schema(crd.session_crd)
    rules = [v["rule"] for v in session_spec["x-kubernetes-validations"]]
    assert "self == oldSelf" in rules
    # Defaults are not in the structural schema, so the idle/lifetime rule must guard absent fields itself.
    assert any("has(self.idleTimeoutSeconds)" in r and "has(self.maxLifetimeSeconds)" in r for r in rules)
    assert session_spec["required"] == ["language"]


def test_a_policy_allows_no_sessions_unless_it_says_so():
    assert CodeRunPolicySpec().sessions is None
    controls = CodeRunPolicySpec.model_validate({"sessions": {"allowed": True, "maxSessions": 5}}).sessions
    assert controls.allowed and controls.max_sessions == 5 and controls.allow_keep_state
    assert (controls.max_lifetime_seconds, controls.max_idle_timeout_seconds) == (3600, 1800)
    assert CodeRunPolicySpec.model_validate({"sessions": {}}).sessions.allowed is False
    for bad in ({"maxSessions": 0}, {"maxLifetimeSeconds": 86401}, {"maxIdleTimeoutSeconds": 5}, {"allow": True}):
        with pytest.raises(ValidationError):
            CodeRunPolicySpec.model_validate({"sessions": bad})


def test_the_api_server_refuses_a_run_in_someone_elses_or_an_ended_session():
    """The shape of session.coderun.io: the sessions of the run's namespace are its parameters; it acts on the
    creation of runs that name a session only, and a namespace without sessions refuses nothing for it."""
    from coderun.api.identity import APPROVAL_POLICY, CREATED_BY, SESSION_POLICY, admission_policies
    objects = {(o["kind"], o["metadata"]["name"]): o for o in admission_policies()}
    policy = objects["ValidatingAdmissionPolicy", SESSION_POLICY]["spec"]
    binding = objects["ValidatingAdmissionPolicyBinding", SESSION_POLICY]["spec"]
    assert policy["paramKind"] == {"apiVersion": "coderun.io/v1alpha1", "kind": "CodeRunSession"}
    # Ignore: an unresolvable paramKind must not refuse every run; the operator backstops the rule
    assert policy["failurePolicy"] == "Ignore"
    assert policy["matchConstraints"]["resourceRules"] == [
        {"apiGroups": ["coderun.io"], "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["coderuns"]}]
    assert policy["matchConditions"] == [{"name": "names-a-session", "expression": "has(object.spec.session)"}]
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    assert variables["named"] == "params.metadata.name == object.spec.session"
    assert f"params.metadata.annotations['{CREATED_BY}']" in variables["sessionCreator"]
    rules = [v["expression"] for v in policy["validations"]]
    assert all(r.startswith("!variables.named || ") for r in rules)  # only the named session can refuse
    assert "variables.sessionCreator == request.userInfo.username" in rules[0]
    assert "params.status.phase != 'Ended'" in rules[1]
    assert binding == {"policyName": SESSION_POLICY, "validationActions": ["Deny"],
                       "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"}}
    # The creator the rule compares is the one the session stated and the approval policy checked (and required).
    approval = objects["ValidatingAdmissionPolicy", APPROVAL_POLICY]["spec"]
    assert "coderunsessions" in approval["matchConstraints"]["resourceRules"][0]["resources"]
    assert any("creator-required" in (v.get("messageExpression") or "") for v in approval["validations"])
