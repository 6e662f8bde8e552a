"""CodeRunPolicy: loading (what the schema cannot check), selection, evaluation with code rules, the bundles."""
from pathlib import Path

import pytest
import yaml

from coderun.api.models import CodeRunSpec
from coderun.api.policy import DEFAULT_POLICY, decision_from_record
from coderun_operator.policy import Denial, InvalidPolicyMark, evaluate, needs_use_permission, select_policy
from coderun_operator.policy.code_rules import check_code
from coderun.api.coderunpolicy import CodeRules
from coderun_operator.policy.load import InvalidPolicy, policy_from_object

BUNDLES = sorted((Path(__file__).parents[2] / "policies").glob("*/coderunpolicy.yaml"))


def policy(name="p", **spec):
    return policy_from_object({"metadata": {"name": name}, "spec": spec})


def run_spec(code="print(1)", **fields):
    return CodeRunSpec.model_validate({"language": "python", "code": code, **fields})


@pytest.mark.parametrize("path", BUNDLES, ids=[p.parent.name for p in BUNDLES])
def test_every_bundle_loads_as_the_operator_loads_it(path):
    obj = yaml.safe_load(path.read_text())
    loaded = policy_from_object(obj)
    assert loaded.name == obj["metadata"]["name"] and loaded.digest.startswith("sha256:")
    assert (path.parent / "kustomization.yaml").exists()


def test_bundles_are_the_four_the_docs_promise():
    assert [p.parent.name for p in BUNDLES] == ["baseline", "data-science", "egress-allowlist", "strict"]


@pytest.mark.parametrize("spec, says", [
    ({"redactionPatterns": ["(?<=x)y"]}, "spec.redactionPatterns[0]"),
    ({"codeRules": {"deniedPatterns": [{"language": "javascript", "pattern": "(a)\\1"}]}},
     "spec.codeRules.deniedPatterns[0].pattern"),
    ({"defaults": {"memory": "4Gi"}}, "spec.defaults.memory=4Gi is above the maximum 2Gi"),
    ({"maxConcurrentRuns": 0}, "spec.maxConcurrentRuns"),
    ({"runtimes": [{"language": "python", "image": "x"}]}, "spec.runtimes.0.command"),
    ({"warmPool": {"size": 2, "languages": ["cobol"]}}, "spec.warmPool.languages: 'cobol' is not a runtime"),
    ({"warmPool": {"size": 2, "cpuRequest": "2"}}, "spec.warmPool.cpuRequest=2 is above the pods' cpu limit"),
    ({"warmPool": {"size": 500}}, "spec.warmPool.size"),
])
def test_a_malformed_policy_is_refused_naming_the_field(spec, says):
    with pytest.raises(InvalidPolicy, match=None) as raised:
        policy(**spec)
    assert says in str(raised.value), raised.value


def test_the_client_reads_a_policy_as_the_operator_does():
    from coderun.client.runtimes import effective_policy
    obj = yaml.safe_load((Path(__file__).parents[2] / "policies/strict/coderunpolicy.yaml").read_text())
    assert effective_policy(obj) == policy_from_object(obj)  # compiled patterns aside (not compared)
    with pytest.raises(ValueError, match=r"^CodeRunPolicy bad: spec\.maxConcurrentRuns: "):
        effective_policy({"metadata": {"name": "bad"}, "spec": {"maxConcurrentRuns": 0}})


def test_selection_prefers_the_named_policy_then_the_namespace_default():
    named, default = policy("named"), policy("default")
    assert select_policy("named", {"named": named, "default": default}) is named
    assert select_policy(None, {"named": named, "default": default}) is default
    assert select_policy("default", {"named": named, "default": default}) is default
    missing = select_policy("other", {"named": named, "secret-one": named})
    assert isinstance(missing, Denial) and "'other' does not exist" in missing.message
    assert "named" not in missing.message and "secret-one" not in missing.message  # never lists other policies
    broken = select_policy("named", {"named": InvalidPolicyMark("spec.x: bad")})
    assert isinstance(broken, Denial) and "spec.x: bad" in broken.message


def test_the_baseline_applies_only_where_a_namespace_has_no_policy_and_is_never_named():
    assert select_policy(None, {}) is select_policy("default", {}) is DEFAULT_POLICY
    for known in ({}, {"default": policy("default")}):
        named = select_policy("builtin-default", known)
        assert isinstance(named, Denial) and named.rule == "policyRef" and "cannot be named" in named.message
    without_default = select_policy(None, {"strict": policy("strict")})
    assert isinstance(without_default, Denial) and "none named 'default'" in without_default.message
    assert "strict" not in without_default.message


@pytest.mark.parametrize("ref, needs", [(None, False), ("default", False), ("builtin-default", False),
                                        ("strict", True)])
def test_naming_a_policy_other_than_default_needs_the_use_permission(ref, needs):
    assert needs_use_permission(ref) is needs


def test_a_recorded_decision_is_the_decision_whatever_the_policy_says_now():
    p = policy("p", defaults={"memory": "300Mi"}, egress=[{"cidr": "203.0.113.5/32", "ports": [{"port": 443}]}],
               approval={"required": "WithEgress"}, maxConcurrentRuns=2)
    decision = evaluate(run_spec(), p)
    again = decision_from_record(type(decision.record()).model_validate(
        decision.record().model_dump(by_alias=True, exclude_none=True)))
    assert again.limits == decision.limits and again.runtime == decision.runtime
    assert again.policy.egress == p.egress and again.policy.approval_required() and again.policy.digest == p.digest
    assert again.policy.max_concurrent_runs == 2


PYTHON_RULES = CodeRules.model_validate({"deniedPythonImports": ["socket", "os.path"],
                                         "deniedPythonCalls": ["eval", "os.system", "subprocess.run"]})


@pytest.mark.parametrize("code, rule, line", [
    ("import socket", "codeRules.deniedPythonImports", 1),
    ("x = 1\nimport socket.socket as s", "codeRules.deniedPythonImports", 2),
    ("from os import path", "codeRules.deniedPythonImports", 1),
    ("from os.path import join", "codeRules.deniedPythonImports", 1),
    ("import importlib\nimportlib.import_module('socket')", "codeRules.deniedPythonImports", 2),
    ("__import__('socket')", "codeRules.deniedPythonImports", 1),
    ("def f():\n    return eval('1')", "codeRules.deniedPythonCalls", 2),
    ("import os as o\no.system('id')", "codeRules.deniedPythonCalls", 2),
    ("from subprocess import run as go\ngo(['id'])", "codeRules.deniedPythonCalls", 2),
])
def test_denied_python_imports_and_calls_are_found_on_the_parse_tree(code, rule, line):
    denial = check_code("python", code, PYTHON_RULES, "strict")
    assert denial is not None and denial.rule == rule and f"line {line}:" in denial.message, (code, denial)


@pytest.mark.parametrize("code", [
    "# import socket\nprint('import socket')", "import os\nprint(os.getcwd())", "evaluate = 1\nprint(evaluate)",
    "import socketserver", "def f(:\n  pass",  # a SyntaxError: the sandbox reports it with its line
])
def test_comments_strings_lookalikes_and_broken_code_are_not_denied(code):
    assert check_code("python", code, PYTHON_RULES, "strict") is None


def test_denied_patterns_apply_per_language_and_name_the_line():
    rules = CodeRules.model_validate({"deniedPatterns": [
        {"language": "javascript", "pattern": "child_process", "message": "no subprocesses"}]})
    denial = check_code("javascript", "const a = 1;\nrequire('child_process')", rules, "strict")
    assert denial.rule == "codeRules.deniedPatterns[0]" and "line 2" in denial.message
    assert "no subprocesses" in denial.message
    assert check_code("python", "child_process = 1", rules, "strict") is None


def test_code_too_deep_to_parse_is_refused_not_a_crash():
    denial = check_code("python", "x = " + "-" * 100000 + "1", PYTHON_RULES, "strict")  # the parser gives up
    assert denial is not None and denial.rule == "codeRules" and "could not be checked" in denial.message


def test_a_warm_pool_is_per_language_and_may_reserve_less_cpu_than_its_limit():
    from coderun_operator.builders import build_pool_pod
    from coderun_operator.controller.warm.trust import wanted_pools
    loaded = policy(warmPool={"size": 3, "cpuRequest": "100m"})
    pools = wanted_pools("team-a", loaded)
    assert sorted(language for language, _ in pools.values()) == ["javascript", "python"]  # every runtime
    key, (language, decision) = next(iter(pools.items()))
    pod = build_pool_pod("team-a", decision, {"coderun.io/pool": "p", "coderun.io/pool-language": language,
                                              "key": key}, 3600)
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"]["cpu"] == "100m" and resources["limits"]["cpu"] == loaded.defaults.cpu
    assert resources["requests"]["memory"] == resources["limits"]["memory"]  # memory is never overcommitted
    assert wanted_pools("team-a", policy()) == {}  # no warmPool, no pods
