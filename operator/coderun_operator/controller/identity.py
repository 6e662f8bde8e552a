"""Who created a run, as far as the operator can trust it: the annotations the caller stated and the API server's
admission policy checked (coderun/api/identity.py), counted only while that policy and its binding are installed."""
from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping

from coderun.api.coderunpolicy import POLICY_PLURAL
from coderun.api.identity import (APPROVAL_POLICY, CREATED_BY, CREATED_BY_GROUPS, HOW_TO_STATE, USE_VERB,
                                  binding_enforces)
from ..kube_api import KubeApi
from ..policy import Denial
from ..policy.evaluate import use_denial

GUARD_CACHE_SECONDS = 10


class IdentityGuard:
    """Whether the API server guards the identity annotations now, asked at most every GUARD_CACHE_SECONDS (a
    transient failure to ask is raised, not cached: the run waits and is reconciled again)."""

    def __init__(self, api: KubeApi, clock: Callable[[], datetime]):
        self._api, self._clock = api, clock
        self._lock = threading.Lock()
        self._answer: tuple[datetime, str | None] | None = None

    def problem(self) -> str | None:
        """None when the annotations can be trusted, else why not, in words that say what to fix."""
        now = self._clock()
        with self._lock:
            if self._answer and now - self._answer[0] < timedelta(seconds=GUARD_CACHE_SECONDS):
                return self._answer[1]
        problem = self._ask()
        with self._lock:
            self._answer = (now, problem)
        return problem

    def _ask(self) -> str | None:
        try:
            policy = self._api.read_admission_policy(APPROVAL_POLICY)
            binding = self._api.read_admission_policy_binding(APPROVAL_POLICY)
        except self._api.Refused as e:
            return (f"the operator cannot read the ValidatingAdmissionPolicy {APPROVAL_POLICY} ({e}); grant it get "
                    "on validatingadmissionpolicies and validatingadmissionpolicybindings (the chart's ClusterRole)")
        if policy is None:
            return (f"the ValidatingAdmissionPolicy {APPROVAL_POLICY} is not installed; install the coderun chart, or "
                    "`kubectl apply -f crds/` where the operator runs without it")
        if (policy.get("spec") or {}).get("failurePolicy", "Fail") != "Fail":
            return f"the ValidatingAdmissionPolicy {APPROVAL_POLICY} must have failurePolicy Fail; reinstall the chart"
        if not binding_enforces(binding):
            return (f"the ValidatingAdmissionPolicyBinding {APPROVAL_POLICY} is missing or does not enforce it "
                    "(validationActions [Deny], no matchResources or paramRef); reinstall the coderun chart")
        return None


def recorded_creator(run: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    """(username, groups) the run's creator stated and the API server checked when it was created, or None."""
    annotations = run["metadata"].get("annotations") or {}
    user = annotations.get(CREATED_BY)
    if not user:
        return None
    return user, [g for g in (annotations.get(CREATED_BY_GROUPS) or "").split("\n") if g]


def user_may_use(api: KubeApi, user: str, groups: list[str], namespace: str) -> Callable[[str], Denial | None]:
    """For decide(): may this user name the policy? Asked of the API server (a SubjectAccessReview)."""
    def check(name: str) -> Denial | None:
        if user and api.allowed(user, groups, USE_VERB, POLICY_PLURAL, namespace, name):
            return None
        return use_denial(user=user, name=name)
    return check


def creator_may_use(api: KubeApi, guard: IdentityGuard, run: Mapping[str, Any]) -> Callable[[str], Denial | None]:
    """For decide() at admission: may the run's creator, as the API server recorded them, name the policy?"""
    def check(name: str) -> Denial | None:
        why = f"spec.policyRef names {name!r}, which needs the RBAC verb {USE_VERB} on {POLICY_PLURAL}/{name}"
        problem = guard.problem()
        if problem:
            return use_denial(f"{why}, and the run's creator cannot be verified: {problem}")
        creator = recorded_creator(run)
        if creator is None:
            return use_denial(f"{why}, and the run does not state its creator ({CREATED_BY}): create it again "
                              f"stating it ({HOW_TO_STATE})")
        return user_may_use(api, *creator, run["metadata"]["namespace"])(name)
    return check
