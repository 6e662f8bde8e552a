"""The CodeRunSession API: one caller's sequence of runs in one sandbox (docs/sessions.md).

A session is a sandbox pod kept for its creator; each run in it is still a CodeRun of its own, naming the session
in spec.session. Like CodeRun and CodeRunPolicy, these models are the one source of the CRD schema.
"""
from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator

from .models import LANGUAGE_PATTERN, ApiModel, Condition, Limits, _cel
from .reasons import SessionPhase

SESSION_KIND = "CodeRunSession"
SESSION_PLURAL = "coderunsessions"
SESSION_SHORT_NAME = "crsess"

DEFAULT_IDLE_TIMEOUT_SECONDS = 600
DEFAULT_MAX_LIFETIME_SECONDS = 3600
MIN_IDLE_TIMEOUT_SECONDS = 10
MIN_LIFETIME_SECONDS = 60
MAX_LIFETIME_SECONDS = 86400  # the policy may cap it lower (spec.sessions.maxLifetimeSeconds)
IDLE_OVER_LIFETIME = "idleTimeoutSeconds must not exceed maxLifetimeSeconds"


class CodeRunSessionSpec(ApiModel):
    """The sandbox a session keeps, and for how long. Immutable once created: to change it, end the session
    (delete it) and create another."""
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        _cel("self == oldSelf", "spec is immutable once created; delete the session and create a new one"),
        _cel(f"(has(self.idleTimeoutSeconds) ? self.idleTimeoutSeconds : {DEFAULT_IDLE_TIMEOUT_SECONDS}) <= "
             f"(has(self.maxLifetimeSeconds) ? self.maxLifetimeSeconds : {DEFAULT_MAX_LIFETIME_SECONDS})",
             IDLE_OVER_LIFETIME, ".idleTimeoutSeconds"),
    ]})
    language: str = Field(pattern=LANGUAGE_PATTERN, description=(
        "The runtime of the session's sandbox, e.g. python; every run in the session must have this language."))
    policy_ref: str | None = Field(None, max_length=253, description=(
        "The CodeRunPolicy (in the session's namespace) for the session and all its runs: its runtime, limits, "
        "code rules, redaction and egress; it must allow sessions (spec.sessions.allowed). Empty means the "
        "namespace's policy named default; the built-in baseline allows no sessions."))
    keep_state: bool = Field(False, description=(
        "True: the runs share one interpreter, so a variable, an import or a function defined by one run is there "
        "for the next (each run's code still behaves as a file main.py of its own: tracebacks, __name__, "
        "sys.argv). False (the default): each run starts a fresh process; only the working directory's files "
        "persist."))
    limits: Limits | None = Field(None, description=(
        "The sandbox's memory, cpu and disk for the whole session, and the default timeoutSeconds and "
        "outputBytes of its runs (each run may set those two itself); unset fields take the policy's defaults."))
    idle_timeout_seconds: int = Field(DEFAULT_IDLE_TIMEOUT_SECONDS, ge=MIN_IDLE_TIMEOUT_SECONDS,
                                      le=MAX_LIFETIME_SECONDS, description=(
        "End the session when no run has been active for this long (capped by the policy's "
        "sessions.maxIdleTimeoutSeconds)."))
    max_lifetime_seconds: int = Field(DEFAULT_MAX_LIFETIME_SECONDS, ge=MIN_LIFETIME_SECONDS,
                                      le=MAX_LIFETIME_SECONDS, description=(
        "End the session this long after it was admitted (its sandbox created or claimed), busy or not "
        "(capped by the policy's sessions.maxLifetimeSeconds); a run in progress then ends with it."))

    @model_validator(mode="after")
    def _idle_within_lifetime(self) -> "CodeRunSessionSpec":
        if self.idle_timeout_seconds > self.max_lifetime_seconds:
            raise ValueError(IDLE_OVER_LIFETIME)
        return self


class CodeRunSessionStatus(ApiModel):
    """Where the session stands. Only the operator writes it, through this model; every field is declared so
    none is pruned. Each run's own result is in its CodeRun."""
    phase: SessionPhase | None = Field(None, description=(
        "Pending (no sandbox yet), Ready (between runs), Busy (a run has been in the sandbox for a quarter of a "
        "second, or was when the operator last looked: a shorter run leaves the phase as it was), or Ended (for "
        "good). Each run's own status says where that run is, at once."))
    reason: str | None = Field(None, description="Why the session is in this phase, a CamelCase word; once "
                                                 "Ended, why it ended (IdleTimeout, LifetimeExceeded, OOMKilled, ...).")
    message: str | None = Field(None, description="What happened and, when it ended, what to do next.")
    pod_name: str | None = Field(None, description="The session's sandbox pod (deleted when the session ends).")
    start_mode: str | None = Field(None, description=(
        "Warm: the session took a pre-started pod of its policy's warm pool; Cold: a pod was created for it."),
        json_schema_extra={"enum": ["Warm", "Cold"]})
    creator: str | None = Field(None, max_length=512, description=(
        "The identity that created the session, as it stated it and the API server checked it (annotation "
        "coderun.io/created-by): the only one whose runs may name it."))
    current_run: str | None = Field(None, max_length=253, description=(
        "The CodeRun in the session's sandbox, once it has been there a quarter of a second (or the operator's "
        "tick saw it); with phase Busy."))
    runs_done: int | None = Field(None, ge=0, description="Runs that ended in the session (any result).")
    last_activity: str | None = Field(None, description=(
        "When a run of the session last started or ended (or the sandbox started): the idle timeout counts from "
        "here."), json_schema_extra={"format": "date-time"})
    expires_at: str | None = Field(None, description=(
        "When the session will end by its lifetime, whatever it is doing: its admission + the effective "
        "maxLifetimeSeconds."), json_schema_extra={"format": "date-time"})
    idle_expires_at: str | None = Field(None, description=(
        "When the session will end if no run comes: lastActivity + the effective idleTimeoutSeconds (moves with "
        "the runs: written after a run, once a queue of runs is done, and at least every 5 s meanwhile; the "
        "operator ends an idle session by its runs' own times, never by a stale value here)."), json_schema_extra={"format": "date-time"})
    idle_timeout_seconds: int | None = Field(None, ge=MIN_IDLE_TIMEOUT_SECONDS, le=MAX_LIFETIME_SECONDS, description=(
        "The effective idle timeout: spec.idleTimeoutSeconds within the policy's sessions.maxIdleTimeoutSeconds."))
    documents_reserved: int | None = Field(None, ge=0, description=(
        "Sequence numbers the operator has reserved for its input documents to the session's runner, in blocks: "
        "every document sent took a number below this one, once. Each document's MAC covers its number and the "
        "runner takes only numbers past the last it read, so no document can be replayed or reordered; numbers "
        "reserved and never used (an operator restarted) are skipped."))
    documents_sent: int | None = Field(None, ge=0, description=(
        "Deprecated, never written: the count of documents an operator before documentsReserved wrote. Read as "
        "a reservation (the greater of the two), so a session alive across the upgrade keeps its numbering."))
    start_time: str | None = Field(None, description="When the sandbox answered and runs could start.",
                                   json_schema_extra={"format": "date-time"})
    end_time: str | None = Field(None, description="When the session ended.", json_schema_extra={"format": "date-time"})
    policy: str | None = Field(None, description="The policy that applies to the session and its runs.")
    policy_digest: str | None = Field(None, description="sha256 of that policy's spec when the session started.")
    effective_limits: Limits | None = Field(None, description="The sandbox's limits after the policy's defaults.")
    observed_generation: int | None = Field(None, description="The metadata.generation this status was written for.")
    conditions: list[Condition] | None = Field(None, description=(
        "Ready (True while the session takes runs) and Ended (True once it ended, however: what "
        "`kubectl wait --for=condition=Ended` waits for), per the Kubernetes API conventions."),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})


class CodeRunSession(ApiModel):
    """One caller's sandbox for a sequence of CodeRuns: files, and with keepState the interpreter, persist."""
    model_config = ConfigDict(extra="ignore")
    api_version: str = "coderun.io/v1alpha1"
    kind: str = SESSION_KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: CodeRunSessionSpec
    status: CodeRunSessionStatus | None = None
