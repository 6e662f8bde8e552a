"""evaluate(spec, policy) -> Decision | Denial, with messages that say what to change."""
from __future__ import annotations

from typing import Mapping

from kubernetes.utils import parse_quantity

from coderun.api.models import CodeRunSpec
from coderun.api.reasons import Reason
from coderun.api.models import ResourceLimits
from coderun.api.coderunpolicy import NAMESPACE_DEFAULT_POLICY
from coderun.api.policy import DEFAULT_POLICY, Decision, Denial, Policy
from .code_rules import check_code

_QUANTITY_FIELDS = {"memory", "cpu", "disk"}


def _exceeds(name: str, asked, maximum) -> bool:
    if name in _QUANTITY_FIELDS:
        return parse_quantity(asked) > parse_quantity(maximum)
    return asked > maximum


def first_above(asked: ResourceLimits, maximums: ResourceLimits) -> tuple[str, object, object] | None:
    """(wire field name, value, maximum) of the first limit above its maximum, else None."""
    for name, info in ResourceLimits.model_fields.items():
        value, maximum = getattr(asked, name), getattr(maximums, name)
        if _exceeds(name, value, maximum):
            return info.alias or name, value, maximum
    return None


def evaluate(spec: CodeRunSpec, policy: Policy) -> Decision | Denial:
    runtime = policy.runtimes.get(spec.language)
    if runtime is None:
        offered = ", ".join(sorted(policy.runtimes)) or "none"
        return Denial(Reason.POLICY_DENIED, "runtimes",
                      f"language {spec.language!r} is not offered by policy {policy.name!r}; "
                      f"use one of: {offered}")
    if any(f.path == runtime.code_file for f in spec.files or ()):
        return Denial(Reason.INVALID_SPEC, "files",
                      f"spec.files must not use the path {runtime.code_file!r}: the code itself is written there")
    asked = spec.limits.model_dump() if spec.limits else {}
    effective = ResourceLimits(**{name: getattr(policy.defaults, name) if asked.get(name) is None else asked[name]
                                  for name in ResourceLimits.model_fields})
    above = first_above(effective, policy.maximums)
    if above:
        wire, value, maximum = above
        return Denial(Reason.POLICY_DENIED, f"maximums.{wire}",
                      f"spec.limits.{wire}={value} is above the maximum {maximum} of policy "
                      f"{policy.name!r}; ask for at most {maximum}")
    compiled = policy.compiled_patterns.denied if policy.compiled_patterns else None
    denial = check_code(spec.language, spec.code, policy.code_rules, policy.name, compiled)
    if denial:
        return denial
    return Decision(policy=policy, runtime=runtime, limits=effective)


def select_policy(policy_ref: str | None, known: Mapping[str, Policy | InvalidPolicyMark]) -> Policy | Denial:
    """spec.policyRef names a policy of the run's namespace; without it the namespace's policy named
    `default` applies, else the built-in baseline. `known` holds the namespace's policies (a malformed one as
    the message that says what is wrong with it)."""
    name = policy_ref or NAMESPACE_DEFAULT_POLICY
    found = known.get(name)
    if found is None and name in (NAMESPACE_DEFAULT_POLICY, DEFAULT_POLICY.name):
        return DEFAULT_POLICY
    if found is None:  # never the other policies' names: a message may reach whoever asked (issue 17)
        return Denial(Reason.POLICY_DENIED, "policyRef",
                      f"policy {policy_ref!r} does not exist in this namespace (`kubectl get coderunpolicies` "
                      "lists the ones there); fix spec.policyRef or remove it to use the namespace's default")
    if isinstance(found, InvalidPolicyMark):
        return Denial(Reason.POLICY_DENIED, "policyRef",
                      f"policy {name!r} is invalid and cannot be applied: {found.message}; fix the CodeRunPolicy")
    return found


class InvalidPolicyMark:
    """A CodeRunPolicy the operator could not load, kept so runs that select it are refused with the reason."""

    def __init__(self, message: str):
        self.message = message
