"""A CodeRunPolicy object as policy data, or a message that names the field to fix."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from kubernetes.utils import parse_quantity
from pydantic import ValidationError

from coderun.api.coderunpolicy import CodeRunPolicySpec
from coderun.api.policy import Policy, policy_from_spec
from .egress import cluster_egress_refusal
from .evaluate import first_above
from .patterns import PatternBudgetExceeded, compile_policy_patterns


class InvalidPolicy(ValueError):
    """The policy cannot be applied; the message names the field and what to change."""


def policy_from_object(obj: Mapping[str, Any]) -> Policy:
    """The policy a CodeRunPolicy object describes; InvalidPolicy if it is malformed in a way the CRD schema
    cannot see (an RE2 pattern that does not compile, a default above its maximum)."""
    name = (obj.get("metadata") or {}).get("name") or "?"
    raw = obj.get("spec") or {}
    try:
        spec = CodeRunPolicySpec.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        raise InvalidPolicy(f"spec.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    refusal = cluster_egress_refusal([rule.cidr for rule in spec.egress or ()], spec.allow_cluster_egress)
    if refusal:
        raise InvalidPolicy(refusal)
    rules = spec.code_rules.denied_patterns if spec.code_rules and spec.code_rules.denied_patterns else ()
    try:
        compiled = compile_policy_patterns(spec.redaction_patterns or (), [r.pattern for r in rules])
    except PatternBudgetExceeded as e:
        raise InvalidPolicy(str(e)) from None
    policy = dataclasses.replace(policy_from_spec(name, raw, spec, (obj.get("metadata") or {}).get("uid")),
                                 compiled_patterns=compiled)
    unknown = [lang for lang in policy.warm_pool_languages if lang not in policy.runtimes]
    if unknown:
        raise InvalidPolicy(f"spec.warmPool.languages: {unknown[0]!r} is not a runtime of this policy; use one of "
                            f"{sorted(policy.runtimes)}")
    request = policy.warm_pool_cpu_request
    if request and parse_quantity(request) > parse_quantity(policy.defaults.cpu):
        raise InvalidPolicy(f"spec.warmPool.cpuRequest={request} is above the pods' cpu limit, spec.defaults.cpu="
                            f"{policy.defaults.cpu}; lower cpuRequest or raise the default")
    if policy.warm_pool_size and policy.egress:  # CEL refuses it at apply; a policy from elsewhere may not be
        raise InvalidPolicy("spec.warmPool: a warm pool cannot serve a policy with egress; remove one of them")
    if policy.ttl_seconds_after_finished > policy.max_ttl_seconds_after_finished:
        raise InvalidPolicy(f"spec.ttlSecondsAfterFinished={policy.ttl_seconds_after_finished} is above "
                            f"spec.maxTtlSecondsAfterFinished={policy.max_ttl_seconds_after_finished}; lower the "
                            "first or raise the second")
    above = first_above(policy.defaults, policy.maximums)
    if above:
        wire, value, maximum = above
        raise InvalidPolicy(f"spec.defaults.{wire}={value} is above the maximum {maximum}; lower "
                            f"spec.defaults.{wire} or raise spec.maximums.{wire}")
    return policy
