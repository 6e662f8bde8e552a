"""Pure policy evaluation: which runtime a run gets, with which limits, or why it is refused."""
from coderun.api.models import ResourceLimits
from coderun.api.policy import DEFAULT_POLICY, Decision, Denial, Policy, Runtime
from .evaluate import evaluate, select_policy

__all__ = ["DEFAULT_POLICY", "Decision", "Denial", "Policy", "ResourceLimits", "Runtime", "evaluate", "select_policy"]
