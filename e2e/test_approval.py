"""Approvals on the real cluster, with people as kubectl impersonates them (`--as=alice`): approving takes the RBAC
verb `approve`, which creating a run does not give; the API server itself checks it (the ValidatingAdmissionPolicy
approval.coderun.io), and that who created a run and who approved it are the requesters' own usernames, whatever
they typed; the creator may not approve their own run unless the policy says so."""
from __future__ import annotations

import pytest

from conftest import APPROVER_VERBS, CREATOR_VERBS, create_as, grant, wait_for
from framework.policy import apply_policy, status_of


def annotate_as(cluster, user: str, namespace: str, name: str, annotation: str, check: bool = False):
    return cluster.kubectl("--as", user, "annotate", "--overwrite", "crun", name, "-n", namespace, annotation,
                           check=check)


def awaiting(cluster, namespace: str, name: str, says: str = "") -> dict:
    def waiting():
        status = status_of(cluster.get_run(namespace, name))
        return status if status.get("reason") == "AwaitingApproval" and says in status.get("message", "") else None
    return wait_for(waiting, 30, f"{name} to wait for approval ({says or 'any message'})")


def supervised(operator, namespace: str, **approval) -> None:
    apply_policy(operator, namespace, "default", {"approval": {"required": "Always", **approval}})
    grant(operator, namespace, "alice", CREATOR_VERBS)


PROGRAM = {"language": "python", "code": "print('approved')"}


def test_a_creator_cannot_approve_nor_create_a_run_approved(operator, namespace):
    supervised(operator, namespace)
    at_creation = create_as(operator, "alice", namespace, PROGRAM, {"coderun.io/approved-by": "me"}, check=False)
    assert at_creation.returncode != 0, at_creation.stdout
    assert "approval-after-creation" in at_creation.stderr and "kubectl annotate crun" in at_creation.stderr
    admin = operator.identity()["coderun.io/created-by"]
    impostor = create_as(operator, "alice", namespace, PROGRAM, {"coderun.io/created-by": admin}, check=False)
    assert impostor.returncode != 0 and "creator-identity" in impostor.stderr, impostor.stderr
    assert "must be your own username, alice" in impostor.stderr, impostor.stderr  # the refusal says what to write
    masters = create_as(operator, "alice", namespace, PROGRAM, {"coderun.io/created-by-groups": "system:masters"},
                        check=False)  # her name, a group not hers
    assert masters.returncode != 0 and "creator-identity" in masters.stderr, masters.stderr
    name = create_as(operator, "alice", namespace, PROGRAM)  # stating herself: accepted
    run = operator.get_run(namespace, name)
    assert run["metadata"]["annotations"]["coderun.io/created-by"] == "alice"
    awaiting(operator, namespace, name, "RBAC verb approve")
    refused = annotate_as(operator, "alice", namespace, name, "coderun.io/approved-by=alice")
    assert refused.returncode != 0 and "approve-permission" in refused.stderr and "alice" in refused.stderr, \
        refused.stderr
    forged = annotate_as(operator, "alice", namespace, name, "coderun.io/created-by=bob")
    assert forged.returncode != 0 and "creator-identity" in forged.stderr, forged.stderr
    status = awaiting(operator, namespace, name)
    assert not status.get("podName") and "coderun.io/approved-by" not in operator.get_run(
        namespace, name)["metadata"]["annotations"]


def test_an_approver_approves_and_the_status_names_the_servers_identity(operator, namespace):
    supervised(operator, namespace)
    grant(operator, namespace, "bob", APPROVER_VERBS)
    name = create_as(operator, "alice", namespace, PROGRAM)
    awaiting(operator, namespace, name)
    as_someone = annotate_as(operator, "bob", namespace, name, "coderun.io/approved-by=yes")
    assert as_someone.returncode != 0 and "approver-identity" in as_someone.stderr, as_someone.stderr
    assert "own username, bob" in as_someone.stderr, as_someone.stderr  # the refusal names the value to write
    annotate_as(operator, "bob", namespace, name, "coderun.io/approved-by=bob", check=True)
    run = operator.wait_run(namespace, name)
    status = status_of(run)
    assert (status["phase"], status["stdout"]) == ("Succeeded", "approved\n"), status
    assert run["metadata"]["annotations"]["coderun.io/approved-by"] == "bob"
    assert status["approval"]["approvedBy"] == "bob" and status["approval"]["creator"] == "alice", status
    assert status["approval"]["time"]
    changed = annotate_as(operator, "bob", namespace, name, "coderun.io/rejected-by=bob")  # final once given
    assert changed.returncode != 0 and "approval-is-final" in changed.stderr, changed.stderr


@pytest.mark.parametrize("allow_self", [False, True], ids=["self-approval-waits", "allowSelfApproval"])
def test_a_self_approval_counts_only_where_the_policy_allows_it(operator, namespace, allow_self):
    supervised(operator, namespace, allowSelfApproval=allow_self)
    grant(operator, namespace, "alice", APPROVER_VERBS)
    name = create_as(operator, "alice", namespace, PROGRAM)
    awaiting(operator, namespace, name)
    annotate_as(operator, "alice", namespace, name, "coderun.io/approved-by=alice", check=True)
    if allow_self:
        status = status_of(operator.wait_run(namespace, name))
        assert status["phase"] == "Succeeded" and status["approval"]["approvedBy"] == "alice", status
        return
    status = awaiting(operator, namespace, name, "who created this run")
    assert "allowSelfApproval" in status["message"] and not status.get("podName"), status
    # Another approver's approval replaces the one that does not count.
    grant(operator, namespace, "bob", APPROVER_VERBS)
    annotate_as(operator, "bob", namespace, name, "coderun.io/approved-by=bob", check=True)
    status = status_of(operator.wait_run(namespace, name))
    assert status["phase"] == "Succeeded" and status["approval"]["approvedBy"] == "bob", status


def test_a_rejected_run_ends_naming_who_rejected_it(operator, namespace):
    supervised(operator, namespace)
    grant(operator, namespace, "bob", APPROVER_VERBS)
    name = create_as(operator, "alice", namespace, PROGRAM)
    awaiting(operator, namespace, name)
    annotate_as(operator, "bob", namespace, name, "coderun.io/rejected-by=bob", check=True)
    status = status_of(operator.wait_run(namespace, name))
    assert (status["phase"], status["reason"]) == ("Rejected", "RejectedByApprover"), status
    assert "rejected by bob" in status["message"] and status["approval"]["rejectedBy"] == "bob", status
    assert not status.get("podName")
