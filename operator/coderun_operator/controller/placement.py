"""Where a run's program runs: a cold pod of its own (cold.py), a warm pool pod claimed for it (warm/placement.py),
or a CodeRunSession's sandbox (session/placement.py). The controller (reconcile.py) reads one lifecycle for all
three, admit -> place -> follow -> collect -> finish, and asks the run's `Placement` (and its decision source,
`Decide`) only what differs between them; everything else exists once: admission (approval, the cache, slots),
egress access, the finish from a frame (OOM evidence, redaction, validation, artifacts, audit, the network
summary, the terminal write).

The placement is chosen once per start: a run naming a session goes to the session's; any other to a warm pod
when its pool has one, else cold. Once placed, its status's startMode names it, and every later step of the run
asks that placement. A placement given up before its program ran (a warm pod that goes cold, a session's attach
that sent nothing) writes the run back to Pending without a pod and says `AGAIN`: the next reconcile places it
anew.

What comes next is written once against this seam, not per start mode: a placement says where the program runs
(`Collected.pod`, the sandbox the frame came from) and brings its output (the attach stream, controller/attach.py,
or the pod's log) to `follow`; inputs and artifacts from the store (data_plane.py) are resolved once before
`place` and travel in `Admitted.run_data` to whichever placement takes the run; output streamed while the program
runs hooks in at `follow`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from coderun.api.models import CodeRunSpec
from ..builders.egress import EgressAccess
from ..policy import Decision
from ..results.frame import FrameError, RunnerFrame
from ..results.status import Outcome


@dataclass(frozen=True)
class Admitted:
    """A run its decision source let go: its spec, its decision, its cache key (None: not cacheable), and whether
    it takes one of its policy's maxConcurrentRuns slots."""
    spec: CodeRunSpec
    decision: Decision
    key: str | None = None
    takes_slot: bool = False
    # run.json's `data` (data_plane.py): the run's inputs by reference and its data grant; None without the store
    run_data: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Collected:
    """A run's frame, or why there is none, from the sandbox it ran in; `oom_killed`: the sandbox's own word that
    the OOM killer ended the program (the container's state, or the session's end)."""
    pod: Mapping[str, Any]
    frame: RunnerFrame | FrameError
    oom_killed: bool = False


class Again:
    """The run's placement was given up before its program ran: reconcile it again, to place it anew."""


AGAIN = Again()


# A run's decision source (its policy, in reconcile.py; or its session's limits and policy, session/placement.py):
# Admitted; an Outcome to end it with (refused); None when it waits (its status says why) or was answered already
# (the cache). It is chosen with the placements it may go to: a session's, or warm then cold.
Decide = Callable[[Mapping[str, Any]], "Admitted | Outcome | None"]


class Placement(Protocol):
    # the startMode a run placed here records
    mode: str
    # The sandbox outlives the run and holds earlier runs' state (a session's): no cache key for its result, and
    # its pod is kept after the run.
    shares_sandbox: bool

    def place(self, run: Mapping[str, Any], admitted: Admitted, egress: EgressAccess | None) -> bool | Outcome:
        """Start the program here: True when it did (its status names the sandbox), or the run waits or is gone;
        False when it cannot be placed here (the next placement is tried); an Outcome to end it with."""

    def follow(self, run: Mapping[str, Any], decision: Decision | None,
               pod_event_deleted: bool) -> Collected | Outcome | Again | None:
        """Where the placed run is: its frame once its program ended, an Outcome when it cannot end with one, AGAIN
        when the placement was given up, None while it runs (status words written on the way)."""

    def vet(self, run: Mapping[str, Any], collected: Collected) -> Again | None:
        """AGAIN when the frame proves the program never ran here (the placement is given up)."""

    def keeps_state(self, run: Mapping[str, Any]) -> bool:
        """The program ran in an interpreter that outlives it (a keepState session's)."""

    def release(self, run: Mapping[str, Any], pod_name: str | None) -> None:
        """After the run's terminal write: let its sandbox go (delete its pod, or hand the session's on)."""

    def due(self, run: Mapping[str, Any]) -> bool:
        """Whether the tick must look at the placed run (a clock runs, or nothing else will bring its end)."""
