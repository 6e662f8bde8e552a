"""A finished run's audit: the node agent asked (audit.py), its record stored in a ConfigMap owned by the run
before the status names it, the summary bounded and redacted into status.audit (results/audit.py). Only for
runs that had a sandbox pod; never raises, never waits past the agent's deadline."""
from __future__ import annotations

from typing import Any, Mapping

from ..kube_api import KubeApi
from ..audit import NOT_INSTALLED, AgentAnswer, AuditAgent, since_ns
from ..policy.redact import Redactor
from ..results.frame import FrameError
from ..results.audit import audit_status, record_text, unavailable, with_audit, with_record
from ..results.status import Outcome
from .children import store_audit_record
from .placement import Collected


def ask_agent(agent: AuditAgent | None, run: Mapping[str, Any], pod: Mapping[str, Any],
              keeps_state: bool) -> AgentAnswer | str:
    """What the node's agent says of the run's container, or why it says nothing. A keepState session's
    interpreter outlives each run, so the record of a run there is never seen complete: the agent is not made
    to wait for it (the record says complete: false). `keeps_state` comes from the session's spec (immutable),
    never from the pod, whose labels and annotations more hands than the operator's may write."""
    if agent is None:
        return NOT_INSTALLED
    return agent.ask(pod, since_ns(run.get("status") or {}), wait=not keeps_state)


def node_saw_oom_kill(answer: AgentAnswer | str) -> bool:
    return isinstance(answer, AgentAnswer) and answer.oom_killed


def oom_evidence(collected: Collected, answer: AgentAnswer | str) -> bool:
    """Whether the OOM killer ended the program, every witness in one place: the sandbox's own word (a container
    OOMKilled, a session ended by it), or the node's count for a program killed by a SIGKILL nobody explains
    (containerd's OOM event can trail the exit it explains). Without a frame, the node's word (the container's
    own is read with the pod's state)."""
    node = node_saw_oom_kill(answer)
    if isinstance(collected.frame, FrameError):
        return node
    return collected.oom_killed or (node and collected.frame.killed_unexplained)


def audited(api: KubeApi, answer: AgentAnswer | str, run: Mapping[str, Any], outcome: Outcome,
            redactor: Redactor) -> Outcome:
    """The outcome with status.audit: the agent's summary, or Unavailable saying why."""
    if not isinstance(answer, AgentAnswer):
        return with_audit(outcome, unavailable(answer))
    audit, redactions = audit_status(answer.summary, redactor)
    if audit["source"] == "Unavailable":
        return with_audit(outcome, audit)
    text, cut = record_text(answer.record, redactor)
    name = store_audit_record(api, run, text) if text else None
    return with_audit(outcome, with_record(audit, name, answer.record_cut + cut), redactions)
