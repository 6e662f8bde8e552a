"""evaluate(spec, policy) -> Decision | Denial, with messages that say what to change."""
from __future__ import annotations

from dataclasses import fields

from kubernetes.utils import parse_quantity

from ..api.models import CodeRunSpec
from ..api.reasons import Reason
from .model import DEFAULT_POLICY, Decision, Denial, Policy, ResourceLimits

_QUANTITY_FIELDS = {"memory", "cpu", "disk"}
_CAMEL = {"timeout_seconds": "timeoutSeconds", "output_bytes": "outputBytes"}


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
    for f in fields(ResourceLimits):
        value = asked.get(f.name)
        if value is None:
            value = getattr(policy.defaults, f.name)
        maximum = getattr(policy.maximums, f.name)
        if _exceeds(f.name, value, maximum):
            wire = _CAMEL.get(f.name, f.name)
            return Denial(Reason.POLICY_DENIED, f"maximums.{wire}",
                          f"spec.limits.{wire}={value} is above the maximum {maximum} of policy "
                          f"{policy.name!r}; ask for at most {maximum}")
        effective[f.name] = value
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
