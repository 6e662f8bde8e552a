"""What the sandbox offers: languages with their images and limits, from the policy the operator applies."""
from __future__ import annotations

from dataclasses import asdict

from pydantic import BaseModel

from ..policy.model import DEFAULT_POLICY, Policy


class RuntimeInfo(BaseModel):
    language: str
    image: str
    policy: str
    default_limits: dict[str, str | int]
    maximum_limits: dict[str, str | int]


def offered_runtimes(policy: Policy = DEFAULT_POLICY) -> list[RuntimeInfo]:
    """The runtimes of a policy (the built-in one until CodeRunPolicy objects are read from the cluster)."""
    return [RuntimeInfo(language=r.language, image=r.image, policy=policy.name,
                        default_limits=asdict(policy.defaults), maximum_limits=asdict(policy.maximums))
            for r in sorted(policy.runtimes.values(), key=lambda r: r.language)]
