"""Policy data: runtimes, default and maximum limits, code rules, egress, concurrency, approval. Frozen, so a
decision cannot drift. `read_policy_object` turns a CodeRunPolicy object into one for the client and the operator;
the operator's loader (coderun_operator/policy/load.py) adds the checks only code can make."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from pydantic import ValidationError

from .coderunpolicy import (ADMISSION_ENFORCE, ADMISSION_RECORD, APPROVAL_ALWAYS, APPROVAL_NEVER,
                            APPROVAL_WITH_EGRESS, CodeRules, CodeRunPolicySpec, Sessions, merged_limits, spec_digest)
from .models import DataPolicy, DecisionRecord, EgressBudget, EgressRule, ResourceLimits, Runtime
from .scheduling import Scheduling


# The operator's bound on a sandbox pod that is not scheduled or started: the run then fails Unschedulable (or
# StartFailed, ImageUnavailable). The clients' default wait covers it (client/waiting.py).
START_DEADLINE_SECONDS = 300


@dataclass(frozen=True)
class Policy:
    name: str
    runtimes: dict[str, Runtime]
    defaults: ResourceLimits
    maximums: ResourceLimits
    digest: str = "builtin"
    ttl_seconds_after_finished: int = 3600
    # The longest spec.ttlSecondsAfterFinished a run may ask for: every finished run is kept in the API server
    # (and, slimmed, in the operator's memory) this long at most.
    max_ttl_seconds_after_finished: int = 7 * 86400
    # How long a pod may wait to be scheduled or to start before the run fails instead of pending forever.
    start_deadline_seconds: int = START_DEADLINE_SECONDS
    # Inputs by reference and artifact caps (docs/data.md); the defaults when the policy sets none.
    data: DataPolicy = field(default_factory=DataPolicy)
    redaction_patterns: tuple[str, ...] = field(default_factory=tuple)
    # Enforced by the runner inside the sandbox (the kubelet's podPidsLimit is the backstop outside it).
    max_processes: int = 128
    max_inodes: int = 16384
    code_rules: CodeRules | None = None
    egress: tuple[EgressRule, ...] = ()
    egress_budget: EgressBudget | None = None
    max_concurrent_runs: int | None = None
    approval: str = APPROVAL_NEVER
    allow_self_approval: bool = False
    admission: str = ADMISSION_ENFORCE
    # Pre-started pods kept per language in the policy's namespace (0: none, the built-in policy's case).
    warm_pool_size: int = 0
    warm_pool_languages: tuple[str, ...] = ()
    warm_pool_cpu_request: str | None = None
    uid: str | None = None  # the CodeRunPolicy object's, so its pool pods go when it goes
    sessions: Sessions | None = None  # CodeRunSessions of this policy (None: none allowed)
    # Where its sandbox pods run (None: the chart's defaults for every field; coderun_operator/builders/scheduling.py)
    scheduling: Scheduling | None = None
    # Its RE2 patterns compiled by the operator's loader (coderun_operator/policy/patterns.py): they live and go with
    # this object, one per CodeRunPolicy uid and spec digest.
    compiled_patterns: Any = field(default=None, compare=False, repr=False)

    def approval_required(self) -> bool:
        return self.approval == APPROVAL_ALWAYS or (self.approval == APPROVAL_WITH_EGRESS and bool(self.egress))


@dataclass(frozen=True)
class Decision:
    """An allowed run: the policy, the runtime and the limits after defaults."""
    policy: Policy
    runtime: Runtime
    limits: ResourceLimits

    def record(self) -> DecisionRecord:
        p = self.policy
        return DecisionRecord(policy=p.name, policy_digest=p.digest, runtime=self.runtime, limits=self.limits,
                              egress=list(p.egress) or None, egress_budget=p.egress_budget,
                              redaction_patterns=list(p.redaction_patterns) or None,
                              max_processes=p.max_processes, max_inodes=p.max_inodes,
                              ttl_seconds_after_finished=p.ttl_seconds_after_finished,
                              approval_required=p.approval_required(), allow_self_approval=p.allow_self_approval,
                              max_concurrent_runs=p.max_concurrent_runs,
                              data=None if p.data == DataPolicy() else p.data, scheduling=p.scheduling,
                              start_deadline_seconds=None if p.start_deadline_seconds == START_DEADLINE_SECONDS
                              else p.start_deadline_seconds)


def decision_from_record(record: DecisionRecord) -> Decision:
    """The decision recorded at admission, as the builders and the result pipeline take it."""
    policy = Policy(name=record.policy, digest=record.policy_digest, runtimes={record.runtime.language: record.runtime},
                    defaults=record.limits, maximums=record.limits, egress=tuple(record.egress or ()),
                    egress_budget=record.egress_budget,
                    redaction_patterns=tuple(record.redaction_patterns or ()), max_processes=record.max_processes,
                    max_inodes=record.max_inodes, ttl_seconds_after_finished=record.ttl_seconds_after_finished,
                    approval=APPROVAL_ALWAYS if record.approval_required else APPROVAL_NEVER,
                    allow_self_approval=record.allow_self_approval,
                    max_concurrent_runs=record.max_concurrent_runs, data=record.data or DataPolicy(),
                    scheduling=record.scheduling,
                    start_deadline_seconds=record.start_deadline_seconds or START_DEADLINE_SECONDS)
    return Decision(policy=policy, runtime=record.runtime, limits=record.limits)


@dataclass(frozen=True)
class Denial:
    """A refused run. `rule` names the policy rule, `message` says what to change; `policy` and `policy_digest`
    name the policy that said no, when one did (an audit must tell which version of which policy refused)."""
    reason: str
    rule: str
    message: str
    policy: str | None = None
    policy_digest: str | None = None


SANDBOX_PYTHON_IMAGE = "coderun.local/sandbox-python:v2"
SANDBOX_NODE_IMAGE = "coderun.local/sandbox-node:v2"

# The built-in policy, for namespaces without a CodeRunPolicy: the baseline limits of the design, the caller may
# ask for less or for more up to the maximums. It records its refusals in the run's status (a typed Rejected
# result for every client) rather than refusing at creation; a CodeRunPolicy enforces at admission by default.
DEFAULT_POLICY = Policy(
    name="builtin-default",
    runtimes={
        "python": Runtime(language="python", image=SANDBOX_PYTHON_IMAGE,
                          command=["python3", "-u", "main.py"], code_file="main.py"),
        "javascript": Runtime(language="javascript", image=SANDBOX_NODE_IMAGE, command=["node", "main.js"],
                              code_file="main.js"),
    },
    defaults=ResourceLimits(timeout_seconds=5, memory="256Mi", cpu="1", disk="64Mi", output_bytes=64 * 1024),
    maximums=ResourceLimits(timeout_seconds=300, memory="2Gi", cpu="2", disk="1Gi", output_bytes=256 * 1024),
    admission=ADMISSION_RECORD,
)


class InvalidPolicy(ValueError):
    """The policy cannot be applied; the message names the field and what to change."""


def read_policy_object(obj: Mapping[str, Any]) -> tuple[CodeRunPolicySpec, Policy]:
    """A CodeRunPolicy object, read once for the client and the operator alike: its validated spec and the policy
    data it describes. InvalidPolicy names the first field the schema refuses; what only code can check (RE2
    patterns, cluster egress, defaults above maximums) the operator checks after (coderun_operator/policy/load.py)."""
    meta = obj.get("metadata") or {}
    raw = obj.get("spec") or {}
    try:
        spec = CodeRunPolicySpec.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        raise InvalidPolicy(f"spec.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    return spec, policy_from_spec(meta.get("name") or "?", raw, spec, meta.get("uid"))


def policy_from_spec(name: str, raw: dict[str, Any], spec: CodeRunPolicySpec, uid: str | None = None) -> Policy:
    """A CodeRunPolicy's spec as policy data: the built-in values wherever the spec is silent."""
    ttl = spec.ttl_seconds_after_finished
    return Policy(
        name=name, runtimes={r.language: r for r in spec.runtimes} if spec.runtimes else dict(DEFAULT_POLICY.runtimes),
        defaults=merged_limits(DEFAULT_POLICY.defaults, spec.defaults),
        maximums=merged_limits(DEFAULT_POLICY.maximums, spec.maximums), digest=spec_digest(raw),
        ttl_seconds_after_finished=min(DEFAULT_POLICY.ttl_seconds_after_finished,
                                       spec.max_ttl_seconds_after_finished) if ttl is None else ttl,
        max_ttl_seconds_after_finished=spec.max_ttl_seconds_after_finished,
        redaction_patterns=tuple(spec.redaction_patterns or ()),
        max_processes=spec.max_processes or DEFAULT_POLICY.max_processes,
        max_inodes=spec.max_inodes or DEFAULT_POLICY.max_inodes,
        code_rules=spec.code_rules, egress=tuple(spec.egress or ()), egress_budget=spec.egress_budget,
        max_concurrent_runs=spec.max_concurrent_runs,
        approval=spec.approval.required if spec.approval else APPROVAL_NEVER, admission=spec.admission,
        allow_self_approval=spec.approval.allow_self_approval if spec.approval else False,
        warm_pool_size=spec.warm_pool.size if spec.warm_pool else 0, uid=uid,
        warm_pool_cpu_request=spec.warm_pool.cpu_request if spec.warm_pool else None,
        warm_pool_languages=tuple(spec.warm_pool.languages or ()) if spec.warm_pool else (),
        sessions=spec.sessions, data=spec.data or DataPolicy(), scheduling=spec.scheduling,
        start_deadline_seconds=spec.start_deadline_seconds or START_DEADLINE_SECONDS)
