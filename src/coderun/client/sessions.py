"""Sessions in the SDK (docs/sessions.md), the pure part: the CodeRunSession to create, a run's spec in it, and the
session's status typed. The sync and async clients do the I/O (sync.Session, aio.AsyncSession).

The SDK never waits for the session to be Ready before its first run: a run naming a session that is not Ready
yet waits in the operator's queue (Pending, Queued) and starts once it is, so `run` right after `session(...)`
costs no extra round trip. `Session.wait_ready` waits when a caller wants to know first (the CLI's `session
create` does: a session its policy refuses is said there, not at the first run).
"""
from __future__ import annotations

import secrets
import uuid
from datetime import datetime, timezone
from typing import Any, Mapping

from pydantic import ConfigDict, Field

from ..api.coderunsession import SESSION_KIND, CodeRunSessionSpec, CodeRunSessionStatus
from ..api.models import API_VERSION, CodeRunSpec, Limits
from ..api.reasons import Reason, SessionPhase
from .errors import CodeRunError
from .result import RunResult
from .waiting import STARTUP_ALLOWANCE_SECONDS, UNKNOWN_RUN_TIMEOUT_SECONDS
from .request import CLIENT_LABEL, CREATE_TOKEN_ANNOTATION, CREATED_AT_ANNOTATION, RunRequest, new_run_name, \
    rfc3339_millis

DEFAULT_SESSION_PREFIX = "session-"
# How long wait_ready waits by default: the operator's own bound on a sandbox that does not start, and a margin.
SESSION_READY_WAIT_SECONDS = STARTUP_ALLOWANCE_SECONDS


class SessionInfo(CodeRunSessionStatus):
    """A CodeRunSession's status (phase, reason, pod, runs done, when it expires) plus where it lives."""
    model_config = ConfigDict(extra="ignore")

    name: str = Field(description="The CodeRunSession's name.")
    namespace: str = Field(description="The CodeRunSession's namespace.")

    @property
    def ended(self) -> bool:
        return self.phase == SessionPhase.ENDED


class SessionEnded(CodeRunError):
    """The session ended (idle, lifetime, memory, policy, deleted): its status says why; start a new one."""

    def __init__(self, info: SessionInfo):
        self.info = info
        super().__init__(f"CodeRunSession {info.namespace}/{info.name} has ended ({info.reason}): {info.message}; "
                         "create a new session")


class SessionNotReady(CodeRunError):
    """The session did not take runs within the caller's wait; it may still start (its status says what it waits
    for)."""

    def __init__(self, info: SessionInfo, waited_seconds: float):
        self.info = info
        said = ", ".join(filter(None, [info.reason, (info.message or "").strip()[:600]]))
        super().__init__(f"CodeRunSession {info.namespace}/{info.name} is not ready after {waited_seconds:.0f}s "
                         f"(last seen: {info.phase or 'no status yet'}" + (f": {said}" if said else "") + ")")


def settled(info: SessionInfo) -> bool:
    """The session takes runs (Ready, Busy) or never will (Ended, its reason and message saying why: the policy
    refused it, its sandbox could not start)."""
    return info.phase in (SessionPhase.READY, SessionPhase.BUSY, SessionPhase.ENDED)


def why_over(info: SessionInfo | None, namespace: str, name: str) -> CodeRunError | None:
    """Why a call in a session failed when the session is over: it ended (SessionEnded, its status says how) or
    it was deleted (no `info`); None while it lives (the failure was the call's own)."""
    if info is None:
        return CodeRunError(f"CodeRunSession {namespace}/{name} was deleted; create a new session")
    return SessionEnded(info) if info.ended else None


def refused_as_ended(result: RunResult) -> bool:
    """The operator refused the run because its session had ended (the session's status says how)."""
    return result.rejected and result.reason == Reason.SESSION_ENDED


def refused_as_over(result: RunResult) -> bool:
    """The operator refused the run because its session had ended or was deleted (the SDK raises the latter as
    the operator's RunRejected, "does not exist"; a conversation that holds the session must drop it for both)."""
    return result.rejected and result.reason in (Reason.SESSION_ENDED, Reason.SESSION_NOT_FOUND)


def session_info(obj: Mapping[str, Any]) -> SessionInfo:
    meta = obj.get("metadata") or {}
    return SessionInfo.model_validate({**(obj.get("status") or {}), "name": meta.get("name", ""),
                                       "namespace": meta.get("namespace", "")})


def session_spec(language: str, *, policy: str | None, keep_state: bool, limits: Limits | Mapping[str, Any] | None,
                 idle_timeout: int | None, max_lifetime: int | None) -> CodeRunSessionSpec:
    """The session's spec from the SDK's keyword arguments (unset ones take the CRD's defaults)."""
    fields: dict[str, Any] = {"language": language, "policy_ref": policy, "keep_state": keep_state,
                              "limits": Limits.model_validate(limits) if isinstance(limits, Mapping) else limits}
    if idle_timeout is not None:
        fields["idle_timeout_seconds"] = idle_timeout
    if max_lifetime is not None:
        fields["max_lifetime_seconds"] = max_lifetime
    return CodeRunSessionSpec(**fields)


def build_session_body(spec: CodeRunSessionSpec, *, client_name: str, labels: Mapping[str, str] | None = None,
                       name: str | None = None, now: datetime | None = None,
                       creator: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The CodeRunSession to create, named by the client (as runs are), labelled with the client's name, stating
    its creator (request.creator_annotations: a session must, its creator alone may run in it)."""
    metadata = {"name": name or new_run_name(DEFAULT_SESSION_PREFIX),
                "labels": {CLIENT_LABEL: client_name, **(labels or {})},
                "annotations": {CREATED_AT_ANNOTATION: rfc3339_millis(now or datetime.now(timezone.utc)),
                                CREATE_TOKEN_ANNOTATION: uuid.uuid4().hex, **(creator or {})}}
    return {"apiVersion": API_VERSION, "kind": SESSION_KIND, "metadata": metadata,
            "spec": spec.model_dump(by_alias=True, exclude_none=True)}


def run_in_session_spec(request: RunRequest, session: str) -> CodeRunSpec:
    """A run's spec in the session: the session's sandbox sets memory and cpu, so a request that asks for them
    is refused here, before the API server would, saying what to do instead."""
    if request.memory is not None or request.cpu is not None:
        raise CodeRunError("a run in a session shares the session's sandbox: set memory and cpu when creating the "
                           "session (limits=...), not per run")
    return request.to_spec().model_copy(update={"session": session})


BATCH_LABEL = "coderun.io/batch"


def batch_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """The labels of one `map`'s runs: the caller's, and a batch id of its own, so one list and one watch select
    exactly that batch."""
    return {**(labels or {}), BATCH_LABEL: secrets.token_hex(8)}


def batch_requests(programs, language: str, timeout: int | None) -> list[RunRequest]:
    """`map`'s programs as requests: code in the session's language with `timeout`, or RunRequests as given."""
    return [p if isinstance(p, RunRequest) else RunRequest(code=p, language=language, timeout=timeout)
            for p in programs]


def batch_wait_seconds(requests: list[RunRequest], wait_timeout: float | None) -> float:
    """How long `map` waits: the caller's `wait_timeout`, else every run's limit in turn (they go one at a time)
    plus start-up once."""
    if wait_timeout is not None:
        return wait_timeout
    return STARTUP_ALLOWANCE_SECONDS + sum(r.timeout or UNKNOWN_RUN_TIMEOUT_SECONDS for r in requests)

