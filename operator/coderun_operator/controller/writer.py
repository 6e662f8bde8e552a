"""The one writer of a run's status: every status goes through `StatusWriter.write` (and a terminal one through
`finish`, which also posts the Event and counts the metrics). When the API server refuses a status, ever
smaller versions of it are tried (results/budget.py)."""
from __future__ import annotations

import copy
import logging
from datetime import datetime
from typing import Any, Callable, Mapping

from coderun.api.models import ApiModel, CodeRunStatus
from coderun.api.reasons import Phase
from coderun.api.text import one_line
from ..kube_api import KubeApi
from .. import metrics
from ..results.budget import smaller_statuses, status_budget
from ..results.lifecycle import expiry_time
from ..policy import Decision
from ..results.status import Outcome, terminal_status, waiting_status
from .store import Store

log = logging.getLogger("coderun")


def to_wire(status: ApiModel) -> dict[str, Any]:
    """The status as the API server takes it: camelCase, only the fields that were set (a field set to None
    stays, as null, to clear a stale value)."""
    return status.model_dump(by_alias=True, exclude_unset=True, mode="json")


def printable(candidate: Mapping[str, Any]) -> dict[str, Any]:
    """Messages (which quote error messages, identities and names) leave with control characters escaped:
    kubectl prints them to terminals."""
    wire = copy.deepcopy(dict(candidate))
    if wire.get("message"):
        wire["message"] = one_line(wire["message"])
    for condition in wire.get("conditions") or ():
        condition["message"] = one_line(condition.get("message") or "")
    return wire


class StatusWriter:
    """`on_finished(namespace)` is told of every run that reached a terminal status (its slot is free)."""

    def __init__(self, api: KubeApi, store: Store, clock: Callable[[], datetime], on_finished: Callable[[str], None]):
        self.api, self.store, self.now = api, store, clock
        self._on_finished = on_finished

    def write(self, run: Mapping[str, Any], status: CodeRunStatus) -> dict[str, Any] | None:
        """Patch /status; when the API server refuses it, ever smaller versions. The status written (its wire
        form), or None when the run is gone. The store takes the API server's answer, so no stale event undoes
        it."""
        meta = run["metadata"]
        refusals: list[str] = []
        for candidate in smaller_statuses(to_wire(status), status_budget(run), refusals):
            try:
                written = self.api.patch_run_status(meta["namespace"], meta["name"], printable(candidate))
            except self.api.Refused as e:
                refusals.append(str(e))
                log.warning("run %s/%s: status refused (%s); writing a smaller one", meta["namespace"],
                            meta["name"], str(e)[:300])
                continue
            if written is None:
                return None
            self.store.put_run(written)
            return candidate
        raise self.api.Refused(f"every status for this run was refused: {refusals[-1]}", 422)

    def finish(self, run: Mapping[str, Any], outcome: Outcome) -> dict[str, Any] | None:
        """The one writer of terminal statuses: write, tell people (an Event), count (metrics)."""
        meta = run["metadata"]
        written = self.write(run, terminal_status(run, outcome, self.now()))
        if written is None:
            return None
        self._on_finished(meta["namespace"])
        self.event(run, "Normal" if outcome.phase == Phase.SUCCEEDED else "Warning", outcome.reason,
                   written.get("message") or outcome.message)
        metrics.observe_finished(written, metrics.language_label((run.get("spec") or {}).get("language")))
        log.info("run %s/%s %s/%s", meta["namespace"], meta["name"], outcome.phase, outcome.reason)
        self.schedule_expiry(self.store.run(meta["uid"]) or run)
        return written

    def wait(self, run: Mapping[str, Any], decision: Decision | None, reason: str, message: str,
             tell: bool = True, upload: Mapping[str, Any] | None = None) -> None:
        """Pending, saying why (queued, awaiting approval), with the decision when there is one; written only when
        something changed (the tick comes back often). `tell`: an Event when the reason changes (not for a
        session's queue, where a harness queues dozens of runs at once)."""
        status = run.get("status") or {}
        if status.get("reason") == reason and status.get("message") == message and \
                (decision is None or status.get("decision")):
            return
        self.write(run, waiting_status(run, decision, reason, message, self.now(), upload))
        if tell and status.get("reason") != reason:
            self.event(run, "Normal", reason, message)

    def event(self, run: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        try:
            self.api.post_event(dict(run), type_, reason, one_line(message))
        except (self.api.Transient, self.api.Refused) as e:  # an Event is a courtesy, never a reason to retry
            log.warning("run %s: event not posted: %s", run["metadata"].get("name"), e)

    def schedule_expiry(self, run: Mapping[str, Any]) -> None:
        when = expiry_time(run, self.store.policies(run["metadata"]["namespace"]))
        if when is not None:
            self.store.expire_at(when, run["metadata"]["uid"])
