"""What the sandbox offers: languages with their images and limits, from the policy the operator applies."""
from __future__ import annotations

from pydantic import BaseModel

from ..api.models import ResourceLimits
from ..api.policy import DEFAULT_POLICY, Policy


class RuntimeInfo(BaseModel):
    language: str
    image: str
    policy: str
    default_limits: dict[str, str | int]
    maximum_limits: dict[str, str | int]


def offered_runtimes(policy: Policy = DEFAULT_POLICY) -> list[RuntimeInfo]:
    """The runtimes of a policy (the built-in one until CodeRunPolicy objects are read from the cluster)."""
    return [RuntimeInfo(language=r.language, image=r.image, policy=policy.name,
                        default_limits=_wire(policy.defaults), maximum_limits=_wire(policy.maximums))
            for r in sorted(policy.runtimes.values(), key=lambda r: r.language)]


def _wire(limits: ResourceLimits) -> dict[str, str | int]:
    """camelCase, as spec.limits spells them."""
    return limits.model_dump(by_alias=True)
