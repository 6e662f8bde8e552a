"""The session placement: a run naming a CodeRunSession goes to the session's sandbox, one at a time in creation
order, decided under the session's limits and its policy as it is now (`SessionRuns.decide`); its document goes
over the session's kept attach and its frame comes back off the stream, else from the sandbox's log or end
(`SessionRuns.follow`). The sandbox is the session's: it is kept after the run, whose end passes the turn to the
next run in the session's queue (`turns`, drained by the controller outside every run lock)."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from coderun.api.reasons import StartMode
from ...builders.egress import EgressAccess
from ...policy import Decision
from ...results.status import Outcome
from ..placement import Admitted, Again, Collected
from ..store import is_terminal
from ..workqueue import WorkQueue
from .runs import HeldFrame, SessionRuns


class SessionPlacement:
    mode: str = StartMode.SESSION
    shares_sandbox = True

    def __init__(self, runs: SessionRuns):
        self.runs = runs
        # runs that ended (refused, or finished): the run behind each in its session's queue is looked at next
        self.turns: WorkQueue[str] = WorkQueue()

    def decide(self, run: Mapping[str, Any]) -> Admitted | Outcome | None:
        return self.runs.decide(run)

    def place(self, run: Mapping[str, Any], admitted: Admitted, egress: EgressAccess | None) -> bool | Outcome:
        return self.runs.send(run, admitted, egress) or True  # (None: sent, or it waits for the sandbox)

    def follow(self, run: Mapping[str, Any], decision: Decision | None,
               pod_event_deleted: bool) -> Collected | Outcome | Again | None:
        return self._collected(run, self.runs.follow(run))

    def streamed(self, run: Mapping[str, Any], sent: bool, text: str, nonce: str) -> Collected | Outcome | None:
        """What the run's stream brought back (from its thread): its frame, or why it has none (see
        `SessionRuns.streamed`)."""
        return self._collected(run, self.runs.streamed(run, sent, text, nonce))

    def _collected(self, run: Mapping[str, Any], held: HeldFrame | Outcome | None) -> Collected | Outcome | None:
        if isinstance(held, HeldFrame):
            return Collected(self.runs.sandbox_of(run), held.frame, held.oom_killed)
        return held

    def vet(self, run: Mapping[str, Any], collected: Collected) -> Again | None:
        return None

    def keeps_state(self, run: Mapping[str, Any]) -> bool:
        return self.runs.keeps_state(run)

    def release(self, run: Mapping[str, Any], pod_name: str | None) -> None:
        """The session's pod is kept; the run's held frame is let go, and the next run gets its turn (not after a
        terminal write the API refused: the run is gone, and its stream's end or deletion moves the queue)."""
        self.runs.finished(run)
        after = self.runs.store.run(run["metadata"]["uid"])
        if after is None or is_terminal(after):
            self.turns.add(run["metadata"]["uid"])

    def pass_turns(self, ensure_policies: Callable[[], None]) -> None:
        """Outside every run lock: each ended run's session moves (its next run, its status)."""
        def turn(uid: str) -> None:
            run = self.runs.store.run(uid)
            if run is not None:
                self.runs.after_run(run, ensure_policies)
        self.turns.drain(turn)

    def due(self, run: Mapping[str, Any]) -> bool:
        """A run in the sandbox with no stream to bring its frame (the sandbox's log or end will)."""
        return run["metadata"]["uid"] not in self.runs.streams
