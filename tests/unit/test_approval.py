"""The approval verdict, pure: only the identities the API server stamped count, and a self-approval only where
the policy allows it; identities are shown bounded and on one line."""
import pytest

from coderun_operator.policy.approval import MAX_SHOWN_IDENTITY_CHARS, approval_verdict, shown_identity

CREATED = {"coderun.io/created-by": "alice"}


@pytest.mark.parametrize("annotations, allow_self, unverifiable, go, rejected, says", [
    (CREATED, False, None, False, False, "RBAC verb approve"),
    ({**CREATED, "coderun.io/approved-by": "bob"}, False, None, True, False, ""),
    ({**CREATED, "coderun.io/approved-by": "alice"}, False, None, False, False, "who created this run"),
    ({**CREATED, "coderun.io/approved-by": "alice"}, True, None, True, False, ""),
    ({"coderun.io/approved-by": "bob"}, False, None, False, False, "does not state who created it"),
    ({}, False, None, False, False, "create the run again stating it"),  # refused at once: nobody could approve
    ({"coderun.io/approved-by": "bob"}, True, None, True, False, ""),  # self-approval allowed: any approval goes
    ({**CREATED, "coderun.io/approved-by": "alice", "coderun.io/rejected-by": "bob"}, True, None, False, True,
     "rejected by bob"),
    ({**CREATED, "coderun.io/approved-by": "bob"}, False, "the VAP is gone", False, False, "cannot be verified"),
    ({**CREATED, "coderun.io/rejected-by": "bob"}, False, "the VAP is gone", False, False, "the VAP is gone"),
    ({**CREATED, "coderun.io/approved-by": ""}, False, None, False, False, "RBAC verb approve"),
])
def test_the_verdict(annotations, allow_self, unverifiable, go, rejected, says):
    verdict = approval_verdict(annotations, "p", allow_self, unverifiable)
    assert (verdict.go, verdict.rejected) == (go, rejected) and says in verdict.message
    # refused: it could never go (no stated creator, no self-approval allowed, the record trusted)
    assert verdict.refused == (not unverifiable and not rejected and not allow_self
                               and not annotations.get("coderun.io/created-by"))


def test_the_record_names_who_decided_and_who_created():
    verdict = approval_verdict({**CREATED, "coderun.io/approved-by": "bob"}, "p", False, None)
    assert verdict.record("T") == {"approvedBy": "bob", "creator": "alice", "time": "T"}


@pytest.mark.parametrize("raw, shown", [
    ("system:serviceaccount:team-a:agent", "system:serviceaccount:team-a:agent"),
    ("bob\nApproved-by: admin", "bob\\x0aApproved-by: admin"),
    ("eve\u202egnp.exe\u0000", "eve\\u202egnp.exe\\x00"),
    ("", "?"),
])
def test_identities_are_shown_on_one_line(raw, shown):
    assert shown_identity(raw) == shown


def test_a_long_identity_is_cut_with_bounded_work():
    shown = shown_identity("x" * 1_000_000)
    assert len(shown) == MAX_SHOWN_IDENTITY_CHARS and shown.endswith("...")


def test_a_binding_with_match_all_selectors_still_enforces():
    from coderun.api.identity import binding_enforces
    spec = {"policyName": "approval.coderun.io", "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {}, "objectSelector": {}, "matchPolicy": "Equivalent"}}
    assert binding_enforces({"spec": spec})
    assert not binding_enforces({"spec": {**spec, "validationActions": ["Audit"]}})
    assert not binding_enforces(None)
