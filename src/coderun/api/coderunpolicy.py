"""The CodeRunPolicy API: what a platform team lets agents run, as YAML in git (policies/ has bundles).

Like CodeRun, the pydantic models are the one source of the CRD schema. The schema and its CEL rules refuse
a malformed policy at `kubectl apply`, naming the field; the operator's loader (coderun_operator/policy/load.py,
through the webhook) adds what CEL cannot check (an RE2 pattern that does not compile, defaults above maximums)
and says what to change.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import ConfigDict, Field, field_validator

from ..egress.credential import EGRESS_BUDGET, egress_weight

from .models import (LANGUAGE_PATTERN, QUANTITY_PATTERN, UNSANDBOXED_RUNTIME_CLASSES, ApiModel, Condition,
                     DataPolicy, EgressBudget, EgressRule, Limits, ResourceLimits, Runtime, _cel, _quantity_range)
from .scheduling import Scheduling

POLICY_KIND = "CodeRunPolicy"
POLICY_PLURAL = "coderunpolicies"
POLICY_SHORT_NAME = "crpol"
# The policy a namespace gets without spec.policyRef.
NAMESPACE_DEFAULT_POLICY = "default"

ADMISSION_ENFORCE = "Enforce"
ADMISSION_RECORD = "Record"
APPROVAL_NEVER, APPROVAL_ALWAYS, APPROVAL_WITH_EGRESS = "Never", "Always", "WithEgress"
EGRESS_TOO_LARGE = (f"the egress rules weigh more than {EGRESS_BUDGET} together (each rule: its host or cidr, 6 for "
                    "each port, 8 more): they travel in every run's proxy credential, which squid caps at 8 KB; "
                    "use fewer or shorter rules, or *. wildcards")


class DeniedPattern(ApiModel):
    """A pattern that code in one language must not contain (RE2 syntax, matched per line)."""
    language: str = Field(pattern=LANGUAGE_PATTERN, description="The language it applies to, e.g. javascript.")
    pattern: str = Field(min_length=1, max_length=512, description="An RE2 regular expression, e.g. child_process.")
    message: str | None = Field(None, max_length=256, description="Why it is denied, shown to the caller.")


class CodeRules(ApiModel):
    """Static checks of the submitted code before anything runs. They are a policy aid (a clear, early "no"),
    not the security boundary: the sandbox is. Python is checked with its own parser (ast), not text matching."""
    denied_python_imports: list[str] | None = Field(None, max_length=256, description=(
        "Modules Python code may not import; a module denies its submodules too (socket, ctypes, os.path)."),
        json_schema_extra={"items": {"type": "string", "maxLength": 128, "pattern": r"^[A-Za-z_][A-Za-z0-9_.]*$"}})
    denied_python_calls: list[str] | None = Field(None, max_length=256, description=(
        "Calls Python code may not make, by dotted name as written or through an import alias: eval, "
        "os.system, subprocess.Popen."),
        json_schema_extra={"items": {"type": "string", "maxLength": 128, "pattern": r"^[A-Za-z_][A-Za-z0-9_.]*$"}})
    denied_patterns: list[DeniedPattern] | None = Field(None, max_length=256, description=(
        "Patterns denied in other languages' code (and in Python's, if listed for python)."))


class Approval(ApiModel):
    """The supervisor pattern: a run waits as Pending/AwaitingApproval until someone with the RBAC verb `approve`
    on coderuns sets coderun.io/approved-by (or coderun.io/rejected-by) to their own username (`coderun approve
    NAME`); the API server refuses any other value (the chart's admission policies)."""
    required: str = Field(APPROVAL_NEVER, pattern=r"^(Never|Always|WithEgress)$", description=(
        "Never, Always, or WithEgress (only runs of a policy that allows egress)."))
    allow_self_approval: bool = Field(False, description=(
        "Let the person who created a run approve it. Off by default: a second person approves."))


class WarmPool(ApiModel):
    """Pre-started, single-use sandbox pods that answer a run in a fraction of a cold start. A run takes one when
    its cpu, memory and disk are the policy's defaults; any other run starts cold as usual."""
    size: int = Field(0, ge=0, le=200, description=(
        "Pods kept waiting per language; each holds the policy's default cpu and memory while it waits."))
    languages: list[str] | None = Field(None, max_length=32, description=(
        "The languages to keep pods for; unset means every runtime of the policy."),
        json_schema_extra={"items": {"type": "string", "maxLength": 32, "pattern": LANGUAGE_PATTERN}})
    cpu_request: str | None = Field(None, pattern=QUANTITY_PATTERN, description=(
        "CPU each waiting pod reserves on its node; its limit stays the policy's default cpu. Unset: the limit "
        "(Guaranteed, like a cold pod). Lower it to keep many pods on few nodes: a claimed pod then gets its full "
        "CPU share only once its in-place resize to the limit fits the node (pods/resize; until then, what it "
        "reserved)."), json_schema_extra=_quantity_range("10m", "64", "100m"))


class Sessions(ApiModel):
    """Whether runs of this policy may share a sandbox as a CodeRunSession, and how much. Off unless set: a
    session keeps a pod (its memory, its CPU) for as long as it lives, and lets one program's files (and, with
    keepState, its variables) reach the caller's next program."""
    allowed: bool = Field(False, description=(
        "Let CodeRunSessions select this policy. False (the default): a session naming it ends at once, "
        "reason PolicyDenied, and a policy changed to false ends its sessions (PolicyRemoved)."))
    max_sessions: int | None = Field(None, ge=1, le=1000, description=(
        "Sessions of this policy alive at once in the namespace (each holds a pod); a session beyond it ends "
        "at once, reason PolicyDenied. Unset: no cap beyond the namespace's quota."))
    max_lifetime_seconds: int = Field(3600, ge=60, le=86400, description=(
        "The longest spec.maxLifetimeSeconds a session may ask for (default 3600); a session asking more gets "
        "this, and its status.expiresAt says so."))
    max_idle_timeout_seconds: int = Field(1800, ge=10, le=86400, description=(
        "The longest spec.idleTimeoutSeconds a session may ask for (default 1800); a session asking more gets "
        "this."))
    allow_keep_state: bool = Field(True, description=(
        "Let sessions set keepState: true (one interpreter for all their runs, so variables persist). False: "
        "such a session ends at once, reason PolicyDenied; sessions with keepState false still keep files."))


class CodeRunPolicySpec(ApiModel):
    """Runtimes, limits, code rules, redaction, egress, concurrency and approval for the runs that select it."""
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("!has(self.egress) || self.egress.all(e, !has(e.cidr) || isCIDR(e.cidr))",
             "every egress cidr must be a CIDR such as 10.0.0.5/32 or 2001:db8::/64", ".egress"),
        _cel("!has(self.egress) || self.egress.map(e, (has(e.host) ? size(e.host) : size(e.cidr)) + "
             f"(has(e.ports) ? 6 * size(e.ports) : 0) + 8).sum() <= {EGRESS_BUDGET}", EGRESS_TOO_LARGE, ".egress"),
        _cel("!has(self.runtimes) || (has(self.allowUnsandboxedRuntime) && self.allowUnsandboxedRuntime) || "
             "!self.runtimes.exists(r, has(r.runtimeClassName) && r.runtimeClassName in "
             f"{list(UNSANDBOXED_RUNTIME_CLASSES)})",
             "runtimeClassName runc runs generated code without a sandbox: set allowUnsandboxedRuntime: true "
             "only if you mean it", ".runtimes"),
    ]})
    description: str | None = Field(None, max_length=1024, description="What this policy is for.")
    runtimes: list[Runtime] | None = Field(None, max_length=32, description=(
        "The languages offered, each once; unset means the built-in ones (python, javascript)."),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["language"]})
    defaults: Limits | None = Field(None, description="Limits a run gets when it does not ask; unset fields "
                                                      "take the built-in defaults.")
    maximums: Limits | None = Field(None, description="The most a run may ask for; above it a run is refused "
                                                      "naming the field, the value and the maximum.")
    max_processes: int | None = Field(None, ge=8, le=4096, description="Processes a program may have at once.")
    max_inodes: int | None = Field(None, ge=64, le=1048576, description="Files and directories under /tmp.")
    code_rules: CodeRules | None = None
    redaction_patterns: list[str] | None = Field(None, max_length=64, description=(
        "RE2 patterns redacted from output, errors and artifact names, besides the built-in secret patterns."),
        json_schema_extra={"items": {"type": "string", "maxLength": 512}})
    egress: list[EgressRule] | None = Field(None, max_length=64, description=(
        "Destinations runs may reach: host names through the egress proxy, address ranges directly. None by "
        "default: a sandbox reaches no network at all."))
    egress_budget: EgressBudget | None = None
    allow_cluster_egress: bool = Field(False, description=(
        "Allow egress CIDRs that cover the cluster's own pod, Service or node ranges, loopback or link-local "
        "addresses (the cloud metadata address): runs could then reach the operator, the API server, the "
        "kubelet and other tenants' pods. Without it such a CIDR is refused, naming it."))
    max_concurrent_runs: int | None = Field(None, ge=1, le=10000, description=(
        "Runs of this policy with a sandbox at once in the namespace, counted per policy (runs of the "
        "namespace's other policies count against their own caps); the rest wait as Pending/Queued and start "
        "in creation order."))
    approval: Approval | None = None
    admission: str = Field(ADMISSION_ENFORCE, pattern=r"^(Enforce|Record)$", description=(
        "Enforce: the validating webhook refuses a denied run at kubectl apply. Record: the run is created and "
        "ends Rejected in its status. Either way the operator records the denial."))
    ttl_seconds_after_finished: int | None = Field(None, ge=0, le=30 * 86400, description=(
        "Default time a finished run is kept (spec.ttlSecondsAfterFinished of a run overrides it), and the time "
        "an ended CodeRunSession of this policy is kept before it is deleted."))
    max_ttl_seconds_after_finished: int = Field(7 * 86400, ge=0, le=30 * 86400, description=(
        "The longest spec.ttlSecondsAfterFinished a run may ask for (default 604800, 7 days); a run asking "
        "more is refused naming this field. Finished runs are kept whole by the API server for that long."))
    allow_unsandboxed_runtime: bool = Field(False, description=(
        "Allow runtimeClassName runc: generated code then runs on the host kernel. For trusted code only."))
    warm_pool: WarmPool | None = None
    sessions: Sessions | None = Field(None, description=(
        "CodeRunSessions of this policy: allowed or not, how many, how long. Unset: no sessions."))
    data: DataPolicy | None = Field(None, description=(
        "Inputs by reference and artifacts in the store: which buckets, what caps (docs/data.md). Unset: the "
        "defaults (no S3 bucket; inputs up to 1 GiB each, 2 GiB in all; artifacts up to 5 MiB)."))
    scheduling: Scheduling | None = Field(None, description=(
        "Where the sandbox pods of this policy's runs, warm pool and sessions run, and what they pull images with: "
        "nodeSelector, tolerations, affinity, priorityClassName, imagePullSecrets (docs/security.md, Dedicated "
        "sandbox nodes). Each field set here replaces the chart's default for it (sandboxScheduling); unset "
        "fields take the default. Runs cannot set any of it."))
    start_deadline_seconds: int | None = Field(None, ge=10, le=3600, description=(
        "How long a sandbox pod may wait to be scheduled and started before its run fails (Unschedulable, with "
        "the scheduler's words, or StartFailed) or its session ends. Unset: 300. Raise it for nodes that a "
        "cluster autoscaler adds on demand; clients wait 360 s for a start by default."))

    @field_validator("egress")
    @classmethod
    def _egress_fits_a_credential(cls, egress: list[EgressRule] | None) -> list[EgressRule] | None:
        weight = sum(egress_weight(rule.host or rule.cidr or "", len(rule.ports or ())) for rule in egress or ())
        if weight > EGRESS_BUDGET:
            raise ValueError(f"{EGRESS_TOO_LARGE} (these weigh {weight})")
        return egress


class WarmPoolStatus(ApiModel):
    """How the policy's warm pool stands, every language together."""
    size: int = Field(description="Pods the pool keeps waiting: warmPool.size for each of its languages.")
    ready: int = Field(description="Pods waiting ready to be claimed now.")


class CodeRunPolicyStatus(ApiModel):
    """Whether the operator applies the policy, and how its warm pool stands. Only the operator writes it."""
    observed_generation: int | None = Field(None, description="The metadata.generation this status was written for.")
    conditions: list[Condition] | None = Field(None, description=(
        "Accepted: True when the operator applies the policy to the runs that select it; False when it cannot "
        "(the message says what to change), and those runs are refused."),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    warm_pool: WarmPoolStatus | None = Field(None, description="The warm pool, for a policy that has one.")


class CodeRunPolicy(ApiModel):
    """A policy for CodeRuns in its namespace: which languages, how much, what code, which network."""
    model_config = ConfigDict(extra="ignore")
    api_version: str = "coderun.io/v1alpha1"
    kind: str = POLICY_KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: CodeRunPolicySpec
    status: CodeRunPolicyStatus | None = None


def spec_digest(spec: dict[str, Any]) -> str:
    """sha256 of the spec as stored (canonical JSON): what an audit compares."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def merged_limits(base: ResourceLimits, override: Limits | None) -> ResourceLimits:
    """The built-in limits with a policy's fields on top."""
    if override is None:
        return base
    return base.model_copy(update={k: v for k, v in override.model_dump().items() if v is not None})
