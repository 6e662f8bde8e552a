"""evaluate(spec, policy) -> Decision | Denial, with messages that say what to change."""
from __future__ import annotations

from kubernetes.utils import parse_quantity

from coderun.api.models import CodeRunSpec
from coderun.api.reasons import Reason
from coderun.api.models import ResourceLimits
from coderun.api.policy import DEFAULT_POLICY, Decision, Denial, Policy

_QUANTITY_FIELDS = {"memory", "cpu", "disk"}


def _exceeds(name: str, asked, maximum) -> bool:
    if name in _QUANTITY_FIELDS:
        return parse_quantity(asked) > parse_quantity(maximum)
    return asked > maximum


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
    effective = {}
    for name, info in ResourceLimits.model_fields.items():
        value = asked.get(name)
        if value is None:
            value = getattr(policy.defaults, name)
        maximum = getattr(policy.maximums, name)
        if _exceeds(name, value, maximum):
            wire = info.alias or name
            return Denial(Reason.POLICY_DENIED, f"maximums.{wire}",
                          f"spec.limits.{wire}={value} is above the maximum {maximum} of policy "
                          f"{policy.name!r}; ask for at most {maximum}")
        effective[name] = value
    return Decision(policy=policy, runtime=runtime, limits=ResourceLimits(**effective))


def select_policy(policy_ref: str | None, known: dict[str, Policy]) -> Policy | Denial:
    """The named policy, or the built-in default when none (or "default") is named."""
    if not policy_ref or policy_ref in ("default", DEFAULT_POLICY.name):
        return DEFAULT_POLICY
    policy = known.get(policy_ref)
    if policy is None:
        names = ", ".join(sorted(known)) or "none besides the built-in default"
        return Denial(Reason.POLICY_DENIED, "policyRef",
                      f"policy {policy_ref!r} does not exist (known: {names}); remove spec.policyRef "
                      f"to use the built-in default")
    return policy
