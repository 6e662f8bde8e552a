"""A policy's RE2 patterns (redaction and denied code patterns), compiled once when the policy is loaded.

They belong to the loaded policy object: the store holds one per CodeRunPolicy (its uid and spec digest), a
changed policy replaces it and a deleted one drops it, so its compiled programs go with it. Nothing caches
patterns process-wide (only the fixed built-in redaction patterns).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import re2

from coderun.api.policy import Policy
from .evaluate import InvalidPolicyMark
from .redact import InvalidPattern, Redactor, compile_pattern

# All of one policy's patterns together, in RE2 instructions (each pattern: at most PATTERN_MAX_PROGRAM).
# Ordinary patterns compile to tens of instructions, so 320 of them fit many times over.
POLICY_MAX_PROGRAM = 40_000


class PatternBudgetExceeded(ValueError):
    """A pattern or the policy's patterns together are too costly; the message names the field."""


@dataclass(frozen=True, eq=False)
class CompiledPatterns:
    redactor: Redactor
    denied: tuple[re2._Regexp, ...]  # index-aligned with codeRules.deniedPatterns
    program_size: int  # instructions of all of them together (what the budget counts)


def compile_policy_patterns(redaction: Sequence[str], denied: Sequence[str]) -> CompiledPatterns:
    """Compile every pattern within its own budget and all within the policy's; PatternBudgetExceeded names the
    first field that does not fit (spec.redactionPatterns[i] or spec.codeRules.deniedPatterns[i].pattern)."""
    named = [(f"spec.redactionPatterns[{i}]", p) for i, p in enumerate(redaction)]
    named += [(f"spec.codeRules.deniedPatterns[{i}].pattern", p) for i, p in enumerate(denied)]
    compiled, total = [], 0
    for where, pattern in named:
        try:
            regex = compile_pattern(pattern)
        except InvalidPattern as e:
            raise PatternBudgetExceeded(f"{where}: {e}") from None
        total += regex.programsize
        if total > POLICY_MAX_PROGRAM:
            raise PatternBudgetExceeded(
                f"{where}: the policy's patterns together compile to more than {POLICY_MAX_PROGRAM} RE2 "
                f"instructions (this one: {regex.programsize}); use fewer or simpler patterns")
        compiled.append(regex)
    return CompiledPatterns(Redactor(compiled[:len(redaction)]), tuple(compiled[len(redaction):]), total)


def redactor(policy: Policy | None, live_policies: Mapping[str, Policy | InvalidPolicyMark]) -> Redactor:
    """The redactor the loaded policy compiled, when the run's recorded policy is still the live one (same
    digest); else one for this result only (the policy changed or went: its patterns are not kept for it)."""
    live = live_policies.get(policy.name) if policy else None
    if policy and isinstance(live, Policy) and live.digest == policy.digest and live.compiled_patterns:
        compiled: CompiledPatterns = live.compiled_patterns  # Any on the light install's Policy
        return compiled.redactor
    return Redactor(policy.redaction_patterns if policy else ())
