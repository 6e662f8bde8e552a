"""Who created a run and who approved it, as the API server knows them: never a string the caller chose.

The caller states its own identity and the API server checks the statement: no mutation, so the same admission
policies hold on every Kubernetes from 1.30 (ValidatingAdmissionPolicy GA) to the newest, inside the API server
itself (no webhook that can be down):

- the ValidatingAdmissionPolicy `approval.coderun.io` refuses a coderun.io/created-by that is not the requester's
  own username (request.userInfo), created-by-groups that are not the requester's own groups, a creator changed
  or added after creation, a session (or a run naming one) that does not state its creator, a verdict at
  creation, a verdict (approved-by, rejected-by) that is not the requester's own username or comes from someone
  without the RBAC verb `approve` on coderuns, and a verdict changed once given (a self-approval, which does not
  count, may be replaced by another approver);
- the ValidatingAdmissionPolicy `session.coderun.io` refuses a CodeRun naming a CodeRunSession that another
  identity created, or that has ended (docs/sessions.md): the sessions are its parameters.

The SDK, the CLI and the MCP server learn their identity from a SelfSubjectReview and state it on every run and
session they create; a person with kubectl adds the annotation (the refusal says the exact line). A run that
states no creator runs as any other, but nothing that needs its creator is allowed to it (a policy other than
`default`, an earlier run's artifact, a session, an approval that may be a self-approval).

The operator trusts these annotations only while the ValidatingAdmissionPolicy and its binding are installed
(it checks). `python -m coderun.api.crd` writes them to crds/ (what `make up-host` applies) and to the chart.
"""
from __future__ import annotations

from typing import Any

from .coderunsession import SESSION_KIND, SESSION_PLURAL
from .models import API_VERSION, GROUP, PLURAL

CREATED_BY = f"{GROUP}/created-by"
CREATED_BY_GROUPS = f"{GROUP}/created-by-groups"  # newline-separated; groups containing a newline are left out
APPROVED_BY = f"{GROUP}/approved-by"
REJECTED_BY = f"{GROUP}/rejected-by"
APPROVE_VERB = "approve"
USE_VERB = "use"  # on coderunpolicies/<name>: needed to name a policy other than `default` in spec.policyRef

APPROVAL_POLICY = "approval.coderun.io"
SESSION_POLICY = "session.coderun.io"
ADMISSION_API_VERSION = "admissionregistration.k8s.io/v1"

# Runs and sessions: the API server checks who says they created each, and keeps it (a session's creator is the
# one identity whose runs may use it). The verdict rules have nothing to act on for a session: nobody approves one.
_MATCH = {"resourceRules": [{"apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                             "resources": [PLURAL, SESSION_PLURAL]}]}
_GROUPS = "request.userInfo.groups.filter(g, !g.contains('\\n')).join('\\n')"


def _annotation(obj: str, key: str) -> str:
    """The annotation's value, '' when absent (oldObject only exists on UPDATE)."""
    guard = "request.operation == 'UPDATE' && " if obj == "oldObject" else ""
    return (f"{guard}has({obj}.metadata.annotations) && '{key}' in {obj}.metadata.annotations ? "
            f"{obj}.metadata.annotations['{key}'] : ''")


_NAMES = {"createdBy": CREATED_BY, "createdByGroups": CREATED_BY_GROUPS, "approvedBy": APPROVED_BY,
          "rejectedBy": REJECTED_BY}
_VARIABLES = [{"name": name, "expression": _annotation("object", key)} for name, key in _NAMES.items()] + [
    {"name": "old" + name[0].upper() + name[1:], "expression": _annotation("oldObject", key)}
    for name, key in _NAMES.items()] + [
    {"name": "requesterGroups", "expression": _GROUPS},
    {"name": "verdictChanged", "expression": "request.operation == 'UPDATE' && (variables.approvedBy != "
     "variables.oldApprovedBy || variables.rejectedBy != variables.oldRejectedBy)"},
    {"name": "decidedBefore", "expression": "variables.oldApprovedBy != '' || variables.oldRejectedBy != ''"},
    # A self-approval does not count (unless the policy allows it, and then the run has started already), so
    # another approver may replace it rather than leave the run waiting for ever.
    # So is any approval of a run that does not state its creator (it never counts, or the run ran already).
    {"name": "selfApprovalReplaced", "expression": "variables.oldRejectedBy == '' && (variables.oldCreatedBy == '' "
     "|| variables.oldApprovedBy == variables.oldCreatedBy) && variables.approvedBy != ''"},
]

# Double quotes: the text goes inside CEL string literals (messageExpression), which single quotes would end.
WHOAMI = 'kubectl auth whoami -o jsonpath="{.status.userInfo.username}"'
HOW_TO_APPROVE = (f"an approver runs `coderun approve NAME` (or `coderun reject NAME`), or `kubectl annotate crun NAME "
                  f"{APPROVED_BY}=$({WHOAMI})` after creation: the API server checks that the value is their own "
                  "username")
HOW_TO_STATE = ("the SDK, the CLI and the MCP server add it for you; with kubectl add the annotation "
                f"{CREATED_BY}: $({WHOAMI})")


def _rule(expression: str, name: str, message: str | None = None, message_expression: str | None = None
          ) -> dict[str, str]:
    rule = {"expression": expression, "reason": "Forbidden"}
    if message_expression:
        rule["messageExpression"] = message_expression
    else:
        rule["message"] = f"{message} (rule {name})"
    return rule


def approval_policy() -> dict[str, Any]:
    validations = [
        _rule("request.operation != 'CREATE' || (variables.approvedBy == '' && variables.rejectedBy == '')",
              "approval-after-creation",
              f"a CodeRun cannot be created approved or rejected: remove {APPROVED_BY} and {REJECTED_BY}; "
              f"{HOW_TO_APPROVE}"),
        _rule("request.operation != 'CREATE' || variables.createdBy == '' || variables.createdBy == "
              "request.userInfo.username", "creator-identity",
              message_expression=f"'{CREATED_BY} must be your own username, ' + request.userInfo.username + ', as "
              f"the API server knows it (rule creator-identity): {HOW_TO_STATE}'"),
        _rule("request.operation != 'CREATE' || variables.createdByGroups == '' || (variables.createdBy != '' && "
              "variables.createdByGroups == variables.requesterGroups)", "creator-identity",
              f"{CREATED_BY_GROUPS} must be your own groups as the API server knows them (`kubectl auth whoami`), "
              f"one a line, beside {CREATED_BY}; or leave it out (the run's creator then counts with no groups)"),
        # A session's creator is the one identity whose runs may use it: nothing to check against if unstated.
        _rule(f"request.operation != 'CREATE' || variables.createdBy != '' || (request.resource.resource == "
              f"'{PLURAL}' && !has(object.spec.session))", "creator-required",
              message_expression=f"'a CodeRunSession, and a CodeRun naming one, states who creates it: add the "
              f"annotation {CREATED_BY}: ' + request.userInfo.username + ' (rule creator-required); the SDK, the "
              "CLI and the MCP server add it for you'"),
        _rule("request.operation != 'UPDATE' || (variables.createdBy == variables.oldCreatedBy && "
              "variables.createdByGroups == variables.oldCreatedByGroups)", "creator-identity",
              f"{CREATED_BY} and {CREATED_BY_GROUPS} record who created the run and cannot be changed or removed"),
        _rule("!variables.verdictChanged || !variables.decidedBefore || variables.selfApprovalReplaced",
              "approval-is-final",
              f"{APPROVED_BY} and {REJECTED_BY} cannot be changed or removed once set (only a self-approval, which "
              "does not count, may be replaced by another approver); create a new CodeRun to decide again"),
        _rule("!variables.verdictChanged || ((variables.approvedBy == variables.oldApprovedBy || variables.approvedBy"
              " == request.userInfo.username) && (variables.rejectedBy == variables.oldRejectedBy || "
              "variables.rejectedBy == request.userInfo.username))", "approver-identity",
              message_expression=f"'{APPROVED_BY} and {REJECTED_BY} must hold your own username, ' + "
              f"request.userInfo.username + ' (rule approver-identity): {HOW_TO_APPROVE}'"),
        _rule(f"!variables.verdictChanged || authorizer.group('{GROUP}').resource('{PLURAL}')"
              f".namespace(request.namespace).name(request.name).check('{APPROVE_VERB}').allowed()",
              "approve-permission",
              message_expression=f"'user ' + request.userInfo.username + ' may not approve or reject CodeRuns in "
              f"namespace ' + request.namespace + ' (rule approve-permission): that needs the RBAC verb "
              f"{APPROVE_VERB} on {PLURAL}.{GROUP}, e.g. a RoleBinding to the approver ClusterRole of the coderun chart'"),
    ]
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": APPROVAL_POLICY, "labels": {"app.kubernetes.io/part-of": "coderun"}},
            "spec": {"failurePolicy": "Fail", "matchConstraints": _MATCH, "variables": _VARIABLES,
                     "validations": validations}}


def session_policy() -> dict[str, Any]:
    """A CodeRun naming a session (spec.session) is refused at creation unless the requester created that session
    and it has not ended. CEL cannot fetch the session, so the sessions are the policy's parameters: the binding
    selects every CodeRunSession of the run's namespace, the rules are evaluated once per session, and only the
    one the run names can refuse it. No session at all (or not the one named, or one the API server has not seen
    yet) lets the run through: the operator then refuses it (SessionNotFound), and checks the creator again
    before any run starts (the backstop)."""
    named = "params.metadata.name == object.spec.session"
    creator = _annotation("params", CREATED_BY)
    validations = [
        _rule(f"!variables.named || (variables.sessionCreator != '' && variables.sessionCreator == "
              "request.userInfo.username)", "session-creator",
              message_expression="'CodeRunSession ' + object.spec.session + ' was created by another identity: only "
              "its creator may run in it; create a session of your own (rule session-creator)'"),
        _rule("!variables.named || !has(params.status) || !has(params.status.phase) || params.status.phase != "
              "'Ended'", "session-ended",
              message_expression="'CodeRunSession ' + object.spec.session + ' has ended (' + "
              "(has(params.status.reason) ? params.status.reason : 'no reason given') + '): create a new session "
              "(rule session-ended)'"),
    ]
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": SESSION_POLICY, "labels": {"app.kubernetes.io/part-of": "coderun"}},
            # Ignore, not Fail: when the API server cannot resolve the paramKind (seen right after the CRDs were
            # applied again) a Fail policy refuses every CodeRun, session or not; the operator's backstop still
            # refuses another identity's run in a session before it starts (SessionForbidden).
            "spec": {"failurePolicy": "Ignore", "paramKind": {"apiVersion": API_VERSION, "kind": SESSION_KIND},
                     # CREATE only: a run's later updates (finalizers, approvals) must not fail once its session ended.
                     "matchConstraints": {"resourceRules": [{"apiGroups": [GROUP], "apiVersions": ["*"],
                                                             "operations": ["CREATE"], "resources": [PLURAL]}]},
                     "matchConditions": [{"name": "names-a-session", "expression": "has(object.spec.session)"}],
                     "variables": [{"name": "named", "expression": named},
                                   {"name": "sessionCreator", "expression": creator}],
                     "validations": validations}}


def _binding(kind: str, name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": ADMISSION_API_VERSION, "kind": f"{kind}Binding",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "coderun"}},
            "spec": {"policyName": name, **spec}}


def admission_policies() -> list[dict[str, Any]]:
    return [approval_policy(), _binding("ValidatingAdmissionPolicy", APPROVAL_POLICY, validationActions=["Deny"]),
            session_policy(), _binding("ValidatingAdmissionPolicy", SESSION_POLICY, validationActions=["Deny"],
                                       # No namespace: the run's own. Allow: a namespace without sessions (and
                                       # every run without spec.session in it) must not be refused for it.
                                       paramRef={"selector": {}, "parameterNotFoundAction": "Allow"})]


def binding_enforces(binding: dict[str, Any] | None) -> bool:
    """Whether a ValidatingAdmissionPolicyBinding makes the approval policy deny (not only warn or audit), for
    every CodeRun: no parameters, no selector or rule narrowing it (empty selectors match everything)."""
    spec = (binding or {}).get("spec") or {}
    match = spec.get("matchResources") or {}
    narrowed = any(match.get(k) for k in ("namespaceSelector", "objectSelector", "resourceRules",
                                          "excludeResourceRules"))
    return (spec.get("policyName") == APPROVAL_POLICY and "Deny" in (spec.get("validationActions") or ())
            and not narrowed and not spec.get("paramRef"))
