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
    OUTPUT_VALID = "OutputValid"
