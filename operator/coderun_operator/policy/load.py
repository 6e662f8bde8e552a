"""A CodeRunPolicy object as policy data, or a message that names the field to fix."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from kubernetes.utils import parse_quantity

from coderun.api.policy import InvalidPolicy, Policy, read_policy_object
from .egress import PROXY_ENABLED, cluster_egress_refusal, host_rule_refusal
from .evaluate import first_above
from .patterns import PatternBudgetExceeded, compile_policy_patterns

__all__ = ["InvalidPolicy", "policy_from_object"]


def policy_from_object(obj: Mapping[str, Any], proxy_enabled: bool = PROXY_ENABLED) -> Policy:
    """The policy a CodeRunPolicy object describes; InvalidPolicy if the schema refuses it (read_policy_object,
    shared with the client) or it is malformed in a way the CRD schema cannot see (an RE2 pattern that does not
    compile, a default above its maximum, a host rule without an egress proxy)."""
    spec, policy = read_policy_object(obj)
    refusal = cluster_egress_refusal([rule.cidr for rule in spec.egress or ()], spec.allow_cluster_egress) or \
        host_rule_refusal([rule.host for rule in spec.egress or ()], proxy_enabled)
    if refusal:
        raise InvalidPolicy(refusal)
    rules = spec.code_rules.denied_patterns if spec.code_rules and spec.code_rules.denied_patterns else ()
    try:
        compiled = compile_policy_patterns(spec.redaction_patterns or (), [r.pattern for r in rules])
    except PatternBudgetExceeded as e:
        raise InvalidPolicy(str(e)) from None
    policy = dataclasses.replace(policy, compiled_patterns=compiled)
    unknown = [lang for lang in policy.warm_pool_languages if lang not in policy.runtimes]
    if unknown:
        raise InvalidPolicy(f"spec.warmPool.languages: {unknown[0]!r} is not a runtime of this policy; use one of "
                            f"{sorted(policy.runtimes)}")
    request = policy.warm_pool_cpu_request
    if request and parse_quantity(request) > parse_quantity(policy.defaults.cpu):
        raise InvalidPolicy(f"spec.warmPool.cpuRequest={request} is above the pods' cpu limit, spec.defaults.cpu="
                            f"{policy.defaults.cpu}; lower cpuRequest or raise the default")
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
