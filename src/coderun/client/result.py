"""RunResult: a CodeRun's status as one typed object, plus where it lives. Pure."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from pydantic import ConfigDict, Field, PrivateAttr

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
    # The client that read the run, so `result.artifact(name)` can read its bytes (set by the client; a result
    # built from a document has none).
    _reader: Callable[..., Any] | None = PrivateAttr(None)

    def artifact(self, name: str, path: str | Path | None = None) -> Any:
        """The bytes of one artifact (inline or stored alike), or with `path` the file written there, through
        the client that returned this result (`client.artifact(result, name, path)`); with the async client,
        await it."""
        if self._reader is None:  # a programming slip, not the platform's failure: not a CodeRunError
            raise RuntimeError(f"this result of run {self.name} was not returned by a client: read the artifact "
                               "with client.artifact(result, name)")
        return self._reader(self, name, path)

    @property
    def skipped_line(self) -> str | None:
        """`1 output file not kept: big.csv (too-large)`: what the program wrote that the run did not keep, and
        why; None when everything was kept."""
        return skipped_line(self)

    def __str__(self) -> str:
        said = f"CodeRun {self.namespace}/{self.name}: {self.phase or 'Pending'}" + (
            f" ({self.reason})" if self.reason else "") + (
            f", exit code {self.exit_code}" if self.exit_code is not None else "")
        return " · ".join(filter(None, [said, self.skipped_line]))

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


MAX_SKIPPED_NAMES = 5


def skipped_line(result: CodeRunStatus) -> str | None:
    """The one line every client shows of status.artifactsSkipped (names and why, the first few)."""
    skipped = result.artifacts_skipped or []
    total = len(skipped) + (result.artifacts_skipped_unlisted or 0)
    if not total:
        return None
    names = ", ".join(f"{s.name} ({s.why})" for s in skipped[:MAX_SKIPPED_NAMES])
    more = total - min(len(skipped), MAX_SKIPPED_NAMES)
    return (f"{total} output file{'s' if total != 1 else ''} not kept: " + names
            + (f"{', ' if names else ''}{more} more" if more else ""))


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

