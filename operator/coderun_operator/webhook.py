"""The validating admission webhook: what needs the policy, at `kubectl apply` time.

The CRD schema and its CEL rules stay the first line (types, sizes, paths); the webhook adds what only the
policy knows. A CodeRun its policy denies is refused with the policy's own message when the policy says
`admission: Enforce` (under `Record` it is created and ends Rejected in its status), and a malformed
CodeRunPolicy is refused naming the field. The operator decides again when it admits a run, so a run that
got past the webhook (it was down, `failurePolicy: Ignore`) still ends with the same verdict, in its status.
"""
from __future__ import annotations

from typing import Any, Mapping

from coderun.api.coderunpolicy import ADMISSION_ENFORCE
from .controller import Controller
from .controller.identity import user_may_use
from .policy import Denial, Policy, select_policy
from .policy.decide import decide
from .policy.load import InvalidPolicy, policy_from_object


def review_run(run: Mapping[str, Any], ctl: Controller, userinfo: Mapping[str, Any]) -> str | None:
    """The message to refuse a new CodeRun with, or None to let it be created. Nothing is allowed on the
    built-in baseline before the namespace's policies are known: until every policy was listed once this
    raises (the API server then applies the webhook's failurePolicy; the operator decides again anyway).
    A run in a session is the session's policy's to judge, which the operator does when the run's turn comes (the
    namespace's `default` may not be that policy, or not exist); the API server's session.coderun.io has already
    checked who may use the session."""
    if (run.get("spec") or {}).get("session"):
        return None
    ctl.ensure_policies_listed()
    namespace = run["metadata"].get("namespace") or ""
    policies = ctl.store.policies(namespace)
    requester = user_may_use(ctl.api, str(userinfo.get("username") or ""),
                             [str(g) for g in userinfo.get("groups") or ()], namespace)  # the API server's word
    spec, verdict = decide(run, policies, requester)
    if not isinstance(verdict, Denial) or spec is None:
        return None  # allowed, or a spec the CRD schema already refuses with its own message
    selected = select_policy(spec.policy_ref, policies)
    if verdict.rule != "policyRef" and isinstance(selected, Policy) and selected.admission != ADMISSION_ENFORCE:
        return None  # Record: the run is created and ends Rejected in its status
    return f"{verdict.message} [{verdict.rule}]"


def review_policy(policy: Mapping[str, Any]) -> str | None:
    try:
        policy_from_object(policy)
    except InvalidPolicy as e:
        return f"CodeRunPolicy {(policy.get('metadata') or {}).get('name')}: {e}"
    return None
