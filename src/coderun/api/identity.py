"""Who created a run and who approved it, as the API server knows them: never a string the caller chose.

Three admission policies run inside the API server itself (no webhook that can be down):

- the MutatingAdmissionPolicy `identity.coderun.io` stamps coderun.io/created-by (and -groups) with the
  requester's identity on CREATE, over whatever the caller wrote, and rewrites a newly set approved-by or
  rejected-by value to the requester's username (so `kubectl annotate crun NAME coderun.io/approved-by=yes`
  records who did it);
- the ValidatingAdmissionPolicy `approval.coderun.io` refuses what the mutation cannot make true: a verdict at
  creation, a changed creator, a verdict that is not the requester's own name or from someone without the RBAC
  verb `approve` on coderuns, and a verdict changed once given (a self-approval, which does not count, may be
  replaced by another approver);
- the ValidatingAdmissionPolicy `session.coderun.io` refuses a CodeRun naming a CodeRunSession that another
  identity created, or that has ended (docs/sessions.md): the sessions are its parameters.

The first two cover CodeRunSessions too: a session's creator is recorded the same way, and is the one identity
whose runs may use it.

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
IDENTITY_POLICY = "identity.coderun.io"
SESSION_POLICY = "session.coderun.io"
ADMISSION_API_VERSION = "admissionregistration.k8s.io/v1"

# Runs and sessions: the API server records who created each, and keeps it (a session's creator is the one
# identity whose runs may use it). The verdict rules have nothing to act on for a session: nobody approves one.
_MATCH = {"resourceRules": [{"apiGroups": [GROUP], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                             "resources": [PLURAL, SESSION_PLURAL]}]}
_GROUPS = "request.userInfo.groups.filter(g, !g.contains('\\n')).join('\\n')"


def _annotation(obj: str, key: str) -> str:
    """The annotation's value, '' when absent (oldObject only exists on UPDATE)."""
    guard = "request.operation == 'UPDATE' && " if obj == "oldObject" else ""
    return (f"{guard}has({obj}.metadata.annotations) && '{key}' in {obj}.metadata.annotations ? "
            f"{obj}.metadata.annotations['{key}'] : ''")


def _path(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


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
    {"name": "selfApprovalReplaced", "expression": "variables.oldRejectedBy == '' && variables.oldCreatedBy != '' "
     "&& variables.oldApprovedBy == variables.oldCreatedBy && variables.approvedBy != ''"},
]

HOW_TO_APPROVE = (f"an approver runs `kubectl annotate crun NAME {APPROVED_BY}=yes` (or {REJECTED_BY}=yes) after "
                  "creation, and the API server records their own username")


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
        _rule("request.operation != 'CREATE' || ((variables.createdBy == '' || variables.createdBy == "
              "request.userInfo.username) && (variables.createdByGroups == '' || variables.createdByGroups == "
              "variables.requesterGroups))", "creator-identity",
              f"{CREATED_BY} and {CREATED_BY_GROUPS} are written by the API server: remove them from the CodeRun"),
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


def _stamp_on_create() -> str:
    user, groups = "request.userInfo.username", "variables.requesterGroups"
    return ("request.operation != 'CREATE' ? [] : has(object.metadata.annotations) ? ["
            f"JSONPatch{{op: 'add', path: '{_path(CREATED_BY)}', value: {user}}}, "
            f"JSONPatch{{op: 'add', path: '{_path(CREATED_BY_GROUPS)}', value: {groups}}}] : ["
            f"JSONPatch{{op: 'add', path: '/metadata/annotations', value: {{'{CREATED_BY}': {user}, "
            f"'{CREATED_BY_GROUPS}': {groups}}}}}]")


def _requester_as(variable: str, key: str) -> str:
    """A newly set or changed verdict annotation becomes the requester's username."""
    old = "old" + variable[0].upper() + variable[1:]
    return (f"request.operation == 'UPDATE' && variables.{variable} != '' && variables.{variable} != "
            f"variables.{old} ? [JSONPatch{{op: 'replace', path: '{_path(key)}', value: request.userInfo.username}}]"
            " : []")


def identity_policy() -> dict[str, Any]:
    variables = [v for v in _VARIABLES if v["name"] in ("approvedBy", "rejectedBy", "oldApprovedBy",
                                                        "oldRejectedBy", "requesterGroups")]
    mutations = [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}
                 for expression in (_stamp_on_create(), _requester_as("approvedBy", APPROVED_BY),
                                    _requester_as("rejectedBy", REJECTED_BY))]
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": IDENTITY_POLICY, "labels": {"app.kubernetes.io/part-of": "coderun"}},
            "spec": {"failurePolicy": "Fail", "reinvocationPolicy": "Never", "matchConstraints": _MATCH,
                     "variables": variables, "mutations": mutations}}


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
    return [identity_policy(), _binding("MutatingAdmissionPolicy", IDENTITY_POLICY),
            approval_policy(), _binding("ValidatingAdmissionPolicy", APPROVAL_POLICY, validationActions=["Deny"]),
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
