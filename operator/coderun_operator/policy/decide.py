"""The verdict on a run: the decision recorded at admission if there is one, else the selected policy's. Pure;
the controller (at admission) and the webhook (at `kubectl apply`) ask the same function."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from pydantic import ValidationError

from coderun.api.models import CodeRunSpec, DecisionRecord
from coderun.api.policy import Decision, Denial, decision_from_record
from coderun.api.reasons import Reason
from .evaluate import evaluate, needs_use_permission, select_policy, use_denial


def no_requester(name: str) -> Denial:
    return use_denial(f"spec.policyRef names {name!r}, and no requester is known to check the permission to use it")


def parse_spec(spec: Mapping[str, Any]) -> CodeRunSpec | Denial:
    """The typed spec, or InvalidSpec naming the first field the model refuses. The spec is immutable (the CRD
    says so), so a run's is parsed once."""
    try:
        return CodeRunSpec.model_validate(spec)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return Denial(Reason.INVALID_SPEC, "schema", f"spec.{where}: {first['msg']}"[:1024])


def verdict(spec: CodeRunSpec, recorded: Mapping[str, Any] | None, policies: Mapping[str, Any] | None = None,
            may_use: Callable[[str], Denial | None] = no_requester) -> Decision | Denial:
    """The decision recorded at admission if there is one (a policy changed since cannot change it), else the
    selected policy's. `policies` are the run's namespace's CodeRunPolicies by name; `may_use(name)` says whether
    the run's requester may name that policy (asked before whether it exists, so a refusal tells nothing about
    it)."""
    if recorded:
        return decision_from_record(DecisionRecord.model_validate(recorded))
    if needs_use_permission(spec.policy_ref):
        denial = may_use(spec.policy_ref)
        if denial:
            return denial
    policy = select_policy(spec.policy_ref, policies or {})
    if isinstance(policy, Denial):
        return policy
    return evaluate(spec, policy)


def decide(run: Mapping[str, Any], policies: Mapping[str, Any] | None = None,
           may_use: Callable[[str], Denial | None] = no_requester) -> tuple[CodeRunSpec | None, Decision | Denial]:
    """The typed spec and the verdict on a run as it is (the webhook's question, asked once per run)."""
    spec = parse_spec(run.get("spec") or {})
    if isinstance(spec, Denial):
        return None, spec
    return spec, verdict(spec, (run.get("status") or {}).get("decision"), policies, may_use)
