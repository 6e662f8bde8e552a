"""Phases, reasons and condition types: named constants, so every writer and reader agrees."""
from enum import StrEnum


class Phase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    REJECTED = "Rejected"


class StartMode(StrEnum):
    WARM = "Warm"  # a pre-started pod of the policy's warm pool
    COLD = "Cold"  # a pod created for the run
    SESSION = "Session"  # the sandbox of the CodeRunSession the run names


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.REJECTED})


class Reason(StrEnum):
    # accepted / in flight
    ACCEPTED = "Accepted"
    POD_CREATED = "PodCreated"
    STARTED = "Started"
    # waiting before a sandbox is made
    QUEUED = "Queued"
    AWAITING_APPROVAL = "AwaitingApproval"
    APPROVED = "Approved"  # an Event: who approved a run that needed approval
    # the program's own outcome
    COMPLETED = "Completed"
    NON_ZERO_EXIT = "NonZeroExit"
    TIMEOUT = "Timeout"
    OOM_KILLED = "OOMKilled"
    OUTPUT_LIMIT_EXCEEDED = "OutputLimitExceeded"
    SIGNALED = "Signaled"
    DISK_LIMIT_EXCEEDED = "DiskLimitExceeded"
    PROCESS_LIMIT_EXCEEDED = "ProcessLimitExceeded"
    SANDBOX_VIOLATION = "SandboxViolation"
    EGRESS_BUDGET_EXCEEDED = "EgressBudgetExceeded"  # the program spent its policy's egress budget
    # refused before running
    POLICY_DENIED = "PolicyDenied"
    INVALID_SPEC = "InvalidSpec"
    REJECTED_BY_APPROVER = "RejectedByApprover"
    # the platform's fault, not the program's
    POD_DELETED = "PodDeleted"
    UNSCHEDULABLE = "Unschedulable"
    IMAGE_UNAVAILABLE = "ImageUnavailable"
    START_FAILED = "StartFailed"
    NAME_CONFLICT = "NameConflict"
    INTERNAL_ERROR = "InternalError"
    # output validation
    OUTPUT_VALID = "OutputValid"
    OUTPUT_INVALID = "OutputInvalid"
    # a CodeRunPolicy's Accepted condition (ACCEPTED when the operator applies it)
    INVALID_POLICY = "InvalidPolicy"
    # a run that names a session (spec.session) and cannot run in it; the message says why
    SESSION_NOT_FOUND = "SessionNotFound"          # no such CodeRunSession in the run's namespace
    SESSION_FORBIDDEN = "SessionForbidden"         # the session was created by someone else
    SESSION_ENDED = "SessionEnded"                 # the session ended (its status says why) before the run started
    SESSION_MISMATCH = "SessionMismatch"           # the run's language is not the session's


# Reasons that say the platform failed, not the program: never reused by the result cache.
INFRASTRUCTURE_REASONS = frozenset({
    Reason.POD_DELETED, Reason.UNSCHEDULABLE, Reason.IMAGE_UNAVAILABLE,
    Reason.START_FAILED, Reason.NAME_CONFLICT, Reason.INTERNAL_ERROR,
})


class ConditionType(StrEnum):
    ACCEPTED = "Accepted"
    RUNNING = "Running"
    COMPLETE = "Complete"
    FAILED = "Failed"
    # True on every terminal phase (Succeeded, Failed, Rejected): the one condition `kubectl wait` needs.
    FINISHED = "Finished"
    OUTPUT_VALID = "OutputValid"


class SessionPhase(StrEnum):
    """A CodeRunSession's phase: Pending until its sandbox is up, Ready between runs, Busy while one runs, Ended
    for good (the reason says why; later runs naming it end Rejected, reason SessionEnded)."""
    PENDING = "Pending"
    READY = "Ready"
    BUSY = "Busy"
    ENDED = "Ended"


class SessionReason(StrEnum):
    """Why a CodeRunSession is where it is; once Ended, why it ended (kept for good)."""
    # on the way
    ACCEPTED = "Accepted"
    POD_CREATED = "PodCreated"
    STARTED = "Started"                     # the sandbox answered: runs may go
    # how a session ends
    IDLE_TIMEOUT = "IdleTimeout"            # no run for the effective idleTimeoutSeconds
    LIFETIME_EXCEEDED = "LifetimeExceeded"  # the effective maxLifetimeSeconds since it started
    OOM_KILLED = "OOMKilled"                # a run exhausted the session's memory: the sandbox went with it
    INTERPRETER_LOST = "InterpreterLost"    # keepState: a run hung or broke the interpreter beyond recovery
    POLICY_REMOVED = "PolicyRemoved"        # its CodeRunPolicy was deleted, or no longer allows sessions
    POD_DELETED = "PodDeleted"              # its sandbox pod went away (evicted, deleted by someone)
    # refused before it started
    POLICY_DENIED = "PolicyDenied"          # the policy forbids sessions (or keepState), or its cap is reached
    INVALID_SPEC = "InvalidSpec"
    START_FAILED = "StartFailed"
    INTERNAL_ERROR = "InternalError"


class SessionConditionType(StrEnum):
    READY = "Ready"  # True while the session takes runs (phase Ready or Busy)
    ENDED = "Ended"  # True once it ended, however: what `kubectl wait --for=condition=Ended` waits for
