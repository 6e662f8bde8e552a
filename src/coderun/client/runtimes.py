"""What the sandbox offers: languages with their images and limits, from the policy that applies."""
from __future__ import annotations

from typing import Any, Mapping

from pydantic import BaseModel

from ..api.models import ResourceLimits
from ..api.coderunpolicy import NAMESPACE_DEFAULT_POLICY
from ..api.policy import DEFAULT_POLICY, InvalidPolicy, Policy, read_policy_object
from .errors import CodeRunError
from .steps import GetPolicy, Plan


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


def runtimes_plan(policy: str | None) -> Plan[list[RuntimeInfo]]:
    """What a run gets: the CodeRunPolicy named `policy`, else the namespace's `default`, else the built-in
    baseline (the operator's selection). A missing `default` means the baseline; a missing named one is an error."""
    name = policy or NAMESPACE_DEFAULT_POLICY
    try:
        found = yield GetPolicy(name)
    except CodeRunError as e:
        if e.status != 404 or name != NAMESPACE_DEFAULT_POLICY:
            raise
        found = None
    return offered_runtimes(effective_policy(found))


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
