"""Pure policy evaluation: which runtime a run gets, with which limits, or why it is refused."""
from coderun.api.models import ResourceLimits, Runtime
from coderun.api.policy import DEFAULT_POLICY, Decision, Denial, Policy, decision_from_record
from .evaluate import InvalidPolicyMark, evaluate, first_above, needs_use_permission, select_policy

__all__ = ["DEFAULT_POLICY", "Decision", "Denial", "InvalidPolicyMark", "Policy", "ResourceLimits", "Runtime",
           "decision_from_record", "evaluate", "first_above", "needs_use_permission", "select_policy"]
