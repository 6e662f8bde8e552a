"""The policy's word on a CodeRunSession, pure: allowed or not, its sandbox's limits, its idle and lifetime caps,
the namespace's maxSessions; and the decision for a run in it (the session's policy and sandbox, the run's own
timeout and output caps, the policy's code rules per run)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from coderun.api.coderunsession import CodeRunSessionSpec
from coderun.api.models import CodeRunSpec, Limits, ResourceLimits, Runtime
from coderun.api.policy import Decision, Denial, Policy
from coderun.api.reasons import SessionReason
from coderun.sandbox.runner.protocol import can_keep_state
from .evaluate import effective_limits, evaluate

# What a session's own limits are; a run in it may set only timeoutSeconds and outputBytes (CEL says so at apply).
SANDBOX_LIMITS = ("memory", "cpu", "disk")


@dataclass(frozen=True)
class SessionDecision:
    """An allowed session: its policy, runtime, the sandbox's limits and the effective idle and lifetime."""
    policy: Policy
    decision: Decision  # what the sandbox pod is built from (the session's limits as a run's)
    idle_timeout_seconds: int
    max_lifetime_seconds: int


def session_verdict(spec: CodeRunSessionSpec, policy: Policy, alive: int) -> SessionDecision | Denial:
    """`policy`: the one the session selects (policy.evaluate.select_policy); `alive`: the namespace's other live
    sessions of that policy. Caps are applied, not refused."""
    sessions = policy.sessions
    if sessions is None or not sessions.allowed:
        return _denied("sessions.allowed", f"policy {policy.name!r} does not allow sessions (spec.sessions.allowed); "
                       "run without a session, or ask the platform team for a policy that allows them", policy)
    if spec.keep_state and not sessions.allow_keep_state:
        return _denied("sessions.allowKeepState", f"policy {policy.name!r} does not allow keepState sessions; create "
                       "the session with keepState: false (files persist, variables do not)", policy)
    if sessions.max_sessions is not None and alive >= sessions.max_sessions:
        return _denied("sessions.maxSessions", f"policy {policy.name!r} allows {sessions.max_sessions} live sessions "
                       "in this namespace and that many are alive; end one (delete it) and create this one again",
                       policy)
    runtime = policy.runtimes.get(spec.language)
    if runtime is None:
        return _denied("runtimes", f"language {spec.language!r} is not offered by policy {policy.name!r}; use one "
                       f"of: {', '.join(sorted(policy.runtimes)) or 'none'}", policy)
    if spec.keep_state and not keeps_state(runtime):
        return Denial(SessionReason.START_FAILED, "keepState", f"keepState: true needs a Python runtime run as "
                      f"`python3 -u FILE.py` (policy {policy.name!r} runs {spec.language} as "
                      f"{' '.join(runtime.command)!r}); create the session with keepState: false",
                      policy.name, policy.digest)
    limits = effective_limits(spec.limits, policy)
    if isinstance(limits, Denial):
        return replace(limits, policy=policy.name, policy_digest=policy.digest)
    return SessionDecision(policy=policy, decision=Decision(policy=policy, runtime=runtime, limits=limits),
                           idle_timeout_seconds=min(spec.idle_timeout_seconds, sessions.max_idle_timeout_seconds),
                           max_lifetime_seconds=min(spec.max_lifetime_seconds, sessions.max_lifetime_seconds))


def run_in_session(spec: CodeRunSpec, sandbox: ResourceLimits, policy: Policy) -> Decision | Denial:
    """A run in a session: the policy's verdict (code rules, maximums) on the run with the session's memory, cpu
    and disk, and its own timeout and output caps where it set them (the session's otherwise)."""
    own = spec.limits.model_dump() if spec.limits else {}
    limits = Limits(**{name: own.get(name) if own.get(name) is not None and name not in SANDBOX_LIMITS
                       else getattr(sandbox, name) for name in Limits.model_fields})
    return evaluate(spec.model_copy(update={"limits": limits}), policy)


def keeps_state(runtime: Runtime) -> bool:
    """Whether the runner can hold one interpreter for a session of this runtime (runner kept_interpreter.py)."""
    return can_keep_state({"language": runtime.language, "command": list(runtime.command),
                         "codeFile": runtime.code_file})


def _denied(rule: str, message: str, policy: Policy) -> Denial:
    return Denial(SessionReason.POLICY_DENIED, rule, message, policy.name, policy.digest)
