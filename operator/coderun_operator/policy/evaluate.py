"""evaluate(spec, policy) -> Decision | Denial, with messages that say what to change."""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping, TypeGuard

from kubernetes.utils import parse_quantity

from coderun.api.models import CodeRunSpec
from coderun.api.reasons import Reason
from coderun.api.models import Limits, ResourceLimits
from coderun.api.coderunpolicy import NAMESPACE_DEFAULT_POLICY
from coderun.api.policy import DEFAULT_POLICY, Decision, Denial, Policy
from .approval import shown_identity
from .code_rules import check_code

_QUANTITY_FIELDS = {"memory", "cpu", "disk"}


def _exceeds(name: str, asked: str | int, maximum: str | int) -> bool:
    if name in _QUANTITY_FIELDS:
        return bool(parse_quantity(asked) > parse_quantity(maximum))
    return int(asked) > int(maximum)


def first_above(asked: ResourceLimits, maximums: ResourceLimits) -> tuple[str, object, object] | None:
    """(wire field name, value, maximum) of the first limit above its maximum, else None."""
    for name, info in ResourceLimits.model_fields.items():
        value, maximum = getattr(asked, name), getattr(maximums, name)
        if _exceeds(name, value, maximum):
            return info.alias or name, value, maximum
    return None


def effective_limits(asked: Limits | None, policy: Policy) -> ResourceLimits | Denial:
    """The limits asked for, the policy's defaults where unset, or the refusal of the first above its maximum
    (a run's, and a session's for its sandbox)."""
    given = asked.model_dump() if asked else {}
    effective = ResourceLimits(**{name: getattr(policy.defaults, name) if given.get(name) is None else given[name]
                                  for name in ResourceLimits.model_fields})
    above = first_above(effective, policy.maximums)
    if above:
        wire, value, maximum = above
        return Denial(Reason.POLICY_DENIED, f"maximums.{wire}",
                      f"spec.limits.{wire}={value} is above the maximum {maximum} of policy "
                      f"{policy.name!r}; ask for at most {maximum}")
    return effective


def evaluate(spec: CodeRunSpec, policy: Policy) -> Decision | Denial:
    """The policy's verdict; a refusal names the policy and its digest, like an admission does."""
    verdict = _verdict(spec, policy)
    if isinstance(verdict, Denial):
        return replace(verdict, policy=policy.name, policy_digest=policy.digest)
    return verdict


def _verdict(spec: CodeRunSpec, policy: Policy) -> Decision | Denial:
    runtime = policy.runtimes.get(spec.language)
    if runtime is None:
        offered = ", ".join(sorted(policy.runtimes)) or "none"
        return Denial(Reason.POLICY_DENIED, "runtimes",
                      f"language {spec.language!r} is not offered by policy {policy.name!r}; "
                      f"use one of: {offered}")
    if any(f.path == runtime.code_file for f in spec.files or ()):
        return Denial(Reason.INVALID_SPEC, "files",
                      f"spec.files must not use the path {runtime.code_file!r}: the code itself is written there")
    effective = effective_limits(spec.limits, policy)
    if isinstance(effective, Denial):
        return effective
    ttl = spec.ttl_seconds_after_finished
    if ttl is not None and ttl > policy.max_ttl_seconds_after_finished:
        return Denial(Reason.POLICY_DENIED, "maxTtlSecondsAfterFinished",
                      f"spec.ttlSecondsAfterFinished={ttl} is above the maximum {policy.max_ttl_seconds_after_finished}"
                      f" of policy {policy.name!r} (maxTtlSecondsAfterFinished); ask for at most "
                      f"{policy.max_ttl_seconds_after_finished}")
    compiled = policy.compiled_patterns.denied if policy.compiled_patterns else None
    denial = check_code(spec.language, spec.code, policy.code_rules, policy.name, compiled)
    if denial:
        return denial
    return Decision(policy=policy, runtime=runtime, limits=effective)


def select_policy(policy_ref: str | None, known: Mapping[str, Policy | InvalidPolicyMark]) -> Policy | Denial:
    """spec.policyRef names a policy of the run's namespace; without it the namespace's policy named `default`
    applies. The built-in baseline applies only where the namespace has no CodeRunPolicy at all, and can never
    be named: a namespace's policies are its platform team's word. `known` holds the namespace's policies (a
    malformed one as the message that says what is wrong with it). Whether the run's creator may name a policy
    is checked apart (needs_use_permission); no message here lists the namespace's other policies."""
    if policy_ref == DEFAULT_POLICY.name:
        return Denial(Reason.POLICY_DENIED, "policyRef",
                      f"spec.policyRef: {DEFAULT_POLICY.name!r} is the built-in baseline for namespaces without "
                      "any CodeRunPolicy and cannot be named; remove spec.policyRef to use the namespace's default")
    name = policy_ref or NAMESPACE_DEFAULT_POLICY
    if not known:
        return DEFAULT_POLICY if name == NAMESPACE_DEFAULT_POLICY else Denial(
            Reason.POLICY_DENIED, "policyRef", f"spec.policyRef: policy {name!r} does not exist in this namespace; "
            "fix spec.policyRef or remove it to use the namespace's default")
    found = known.get(name)
    if found is None and policy_ref:
        return Denial(Reason.POLICY_DENIED, "policyRef",
                      f"spec.policyRef: policy {name!r} does not exist in this namespace; fix spec.policyRef or "
                      "remove it to use the namespace's default")
    if found is None:
        return Denial(Reason.POLICY_DENIED, "policyRef",
                      f"this namespace has CodeRunPolicies but none named {NAMESPACE_DEFAULT_POLICY!r}, so a run "
                      "must name one in spec.policyRef (one you are allowed to use), or the namespace's owners add a "
                      f"{NAMESPACE_DEFAULT_POLICY!r} policy")
    if isinstance(found, InvalidPolicyMark):
        return Denial(Reason.POLICY_DENIED, "policyRef",
                      f"policy {name!r} is invalid and cannot be applied: {found.message}; fix the CodeRunPolicy")
    return found


def needs_use_permission(policy_ref: str | None) -> TypeGuard[str]:
    """Naming a policy other than the namespace's `default` is an authorization decision: the creator needs the
    RBAC verb `use` on coderunpolicies/<name> (the baseline cannot be named at all)."""
    return bool(policy_ref) and policy_ref not in (NAMESPACE_DEFAULT_POLICY, DEFAULT_POLICY.name)


def use_denial(message: str | None = None, user: str | None = None, name: str | None = None) -> Denial:
    """The refusal of a policyRef its creator may not name: `message`, or the standard one for `user` and
    `name` (it says neither whether the policy exists nor which others do)."""
    if message is None:
        message = (f"{shown_identity(user)} may not use CodeRunPolicy {name!r} in this namespace: naming a policy "
                   f"other than {NAMESPACE_DEFAULT_POLICY!r} in spec.policyRef needs the RBAC verb use on "
                   f"coderunpolicies/{name}; remove spec.policyRef, or ask the namespace's owners for that permission")
    return Denial(Reason.POLICY_DENIED, "policyRef", message)


class InvalidPolicyMark:
    """A CodeRunPolicy the operator could not load, kept so runs that select it are refused with the reason."""

    def __init__(self, message: str):
        self.message = message
