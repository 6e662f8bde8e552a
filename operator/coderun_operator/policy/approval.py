"""Whether a run that needs approval may go on, pure: from the identities stated on it, which the API server checked.

The annotations count only while the chart's admission policies guard them (the caller checks that and passes
what is wrong otherwise): then created-by is who created the run and approved-by / rejected-by is who decided,
each refused at the API server unless it was the requester's own username. A self-approval does not count unless the policy allows it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from coderun.api.identity import APPROVE_VERB, APPROVED_BY, CREATED_BY, HOW_TO_STATE, REJECTED_BY
from coderun.api.text import one_line

MAX_SHOWN_IDENTITY_CHARS = 128


def shown_identity(value: str | None) -> str:
    """An identity as messages, Events and the status show it: no control or format characters (a newline or a
    bidi override could forge a second line), at most MAX_SHOWN_IDENTITY_CHARS. Bounded work on any input."""
    clean = one_line((value or "")[:MAX_SHOWN_IDENTITY_CHARS + 1])
    return clean[:MAX_SHOWN_IDENTITY_CHARS - 3] + "..." if len(clean) > MAX_SHOWN_IDENTITY_CHARS else clean or "?"


@dataclass(frozen=True)
class Verdict:
    """go: run it; rejected: end it; neither: wait, saying why in `message`. approver/rejecter/creator are the
    raw identities (compare those; show them with shown_identity)."""
    go: bool = False
    rejected: bool = False
    refused: bool = False  # it can never go: end it, the policy's refusal
    message: str = ""
    approver: str | None = None
    rejecter: str | None = None
    creator: str | None = None

    def record(self, time: str) -> dict[str, str]:
        """status.approval."""
        fields = {"approvedBy": self.approver if self.go else None, "rejectedBy": self.rejecter,
                  "creator": self.creator}
        return {**{k: shown_identity(v) for k, v in fields.items() if v}, "time": time}


def approval_verdict(annotations: Mapping[str, str], policy_name: str, allow_self_approval: bool,
                     unverifiable: str | None) -> Verdict:
    """`unverifiable`: why the annotations cannot be trusted now (the admission policy is missing), or None."""
    if unverifiable:
        return Verdict(message=f"policy {policy_name!r} requires approval, which cannot be verified now: "
                               f"{unverifiable}; the run waits until it can")
    creator = annotations.get(CREATED_BY) or None
    rejecter, approver = annotations.get(REJECTED_BY) or None, annotations.get(APPROVED_BY) or None
    if rejecter:
        return Verdict(rejected=True, rejecter=rejecter, creator=creator,
                       message=f"rejected by {shown_identity(rejecter)} ({REJECTED_BY})")
    if not creator and not allow_self_approval:  # no approval could ever be told from a self-approval
        return Verdict(refused=True, message=(
            f"policy {policy_name!r} requires another person's approval, which cannot be told from a "
            f"self-approval when the run does not state who created it ({CREATED_BY}): create the run again "
            f"stating it ({HOW_TO_STATE})"))
    if not approver:
        return Verdict(creator=creator, message=(
            f"policy {policy_name!r} requires approval: waiting for someone with the RBAC verb {APPROVE_VERB} on "
            f"coderuns to run `coderun approve NAME` (or `coderun reject NAME`; with kubectl, `kubectl annotate crun "
            f"NAME {APPROVED_BY}=<their username>`)"))
    if allow_self_approval or creator != approver:
        return Verdict(go=True, approver=approver, creator=creator)
    return Verdict(approver=approver, creator=creator, message=(
        f"approved by {shown_identity(approver)}, who created this run: policy {policy_name!r} does not allow "
        "self-approval (spec.approval.allowSelfApproval), so the run still waits for another approver (their "
        f"{APPROVED_BY} replaces this one) or a rejection"))
