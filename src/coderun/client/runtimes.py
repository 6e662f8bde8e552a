"""What the sandbox offers: languages with their images and limits, from the policy that applies."""
from __future__ import annotations

from typing import Any, Mapping

from pydantic import BaseModel

from ..api.models import ResourceLimits
from ..api.policy import DEFAULT_POLICY, InvalidPolicy, Policy, read_policy_object


class RuntimeInfo(BaseModel):
    language: str
    image: str
    policy: str
    runtime_class: str = "gvisor"
    default_limits: dict[str, str | int]
    maximum_limits: dict[str, str | int]
    egress: list[str] = []
    approval: str = "Never"
    max_concurrent_runs: int | None = None


def effective_policy(policy_object: Mapping[str, Any] | None) -> Policy:
    """The policy a CodeRunPolicy object describes (the built-in baseline without one). A malformed object is
    the operator's to refuse with a reason; here it raises ValueError naming the field."""
    if policy_object is None:
        return DEFAULT_POLICY
    try:
        return read_policy_object(policy_object)[1]
    except InvalidPolicy as e:
        raise ValueError(f"CodeRunPolicy {policy_object['metadata']['name']}: {e}") from None


def offered_runtimes(policy: Policy = DEFAULT_POLICY) -> list[RuntimeInfo]:
    return [RuntimeInfo(language=r.language, image=r.image, policy=policy.name, runtime_class=r.runtime_class_name,
                        default_limits=_wire(policy.defaults), maximum_limits=_wire(policy.maximums),
                        egress=[(rule.host or rule.cidr) + (":" + ",".join(str(p.port) for p in rule.ports)
                                                            if rule.ports else "") for rule in policy.egress],
                        approval=policy.approval, max_concurrent_runs=policy.max_concurrent_runs)
            for r in sorted(policy.runtimes.values(), key=lambda r: r.language)]


def _wire(limits: ResourceLimits) -> dict[str, str | int]:
    """camelCase, as spec.limits spells them."""
    return limits.model_dump(by_alias=True)
