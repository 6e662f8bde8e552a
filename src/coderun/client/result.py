"""RunResult: a CodeRun's status as one typed object, plus where it lives. Pure."""
from __future__ import annotations

from typing import Any, Mapping

from pydantic import ConfigDict, Field

from ..api.models import CodeRunStatus
from ..api.reasons import INFRASTRUCTURE_REASONS, TERMINAL_PHASES, Phase, Reason


class RunResult(CodeRunStatus):
    """Every CodeRunStatus field (stdout, stderr, exit_code, error, metrics, artifacts, ...) plus the run's name.

    A run that ended badly is still a RunResult: check `succeeded`, `reason` and `exit_code`."""
    # An operator newer than this SDK may add status fields: ignore them rather than fail to read a result.
    model_config = ConfigDict(extra="ignore")

    name: str = Field(description="The CodeRun's name.")
    namespace: str = Field(description="The CodeRun's namespace.")
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: str | None = Field(None, description="The CodeRun's creationTimestamp.")

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def succeeded(self) -> bool:
        return self.phase == Phase.SUCCEEDED

    @property
    def rejected(self) -> bool:
        return self.phase == Phase.REJECTED

    @property
    def infrastructure_failure(self) -> bool:
        """The platform failed (pod deleted, unschedulable, internal error), not the program: worth a retry."""
        return self.reason in INFRASTRUCTURE_REASONS

    @property
    def timed_out(self) -> bool:
        """The program hit its own time limit (not the caller's wait: that raises RunTimeout)."""
        return self.reason == Reason.TIMEOUT


def result_from_object(obj: Mapping[str, Any]) -> RunResult:
    """A RunResult from a CodeRun as the API returns it (a dict), with or without a status yet."""
    meta = obj.get("metadata") or {}
    return RunResult.model_validate({
        **(obj.get("status") or {}),
        "name": meta.get("name", ""), "namespace": meta.get("namespace", ""),
        "labels": meta.get("labels") or {}, "createdAt": meta.get("creationTimestamp"),
    })


def is_finished(obj: Mapping[str, Any] | None) -> bool:
    return bool(obj) and (obj.get("status") or {}).get("phase") in TERMINAL_PHASES


def results_from_list(listed: Mapping[str, Any]) -> list[RunResult]:
    """A CodeRun list as results, oldest first."""
    results = [result_from_object(item) for item in listed.get("items") or []]
    return sorted(results, key=lambda r: (r.created_at or "", r.name))

