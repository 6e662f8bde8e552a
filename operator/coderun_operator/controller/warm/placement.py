"""The warm placement: a ready pool pod claimed for the run (claim.py), its input sent over one attach and its
frame read straight off the stream; otherwise it is followed as a cold run's pod is (cold.py), and a pod that
never ran the run's program is given up for a cold start (AGAIN)."""
from __future__ import annotations

import logging
from typing import Any, Mapping

from coderun.api.reasons import StartMode
from ...builders.egress import EgressAccess
from ...results.frame import FrameError, parse_streamed_frame
from ...results.pod_state import not_scheduled_because
from ...results.status import Outcome
from ..cold import ColdPlacement
from ..placement import AGAIN, Admitted, Again, Collected
from ..store import is_terminal
from .claim import Claims
from .trust import incomplete_input, ran_this_claim

log = logging.getLogger("coderun")


class WarmPlacement(ColdPlacement):
    mode: str = StartMode.WARM

    def __init__(self, claims: Claims):
        super().__init__(claims.api, claims.store, claims.writer, claims.now)
        self.claims = claims

    def place(self, run: Mapping[str, Any], admitted: Admitted, egress: EgressAccess | None) -> bool | Outcome:
        """False when the pool has no pod for it (or it must start cold): the cold placement is next. A run with
        inputs by reference starts cold: a pool pod has no room of its own for them (docs/data.md)."""
        if admitted.spec.inputs:
            return False
        return self.claims.try_start(run, admitted.spec, admitted.decision, admitted.key, egress, admitted.run_data)

    def streamed(self, run: Mapping[str, Any], pod_name: str, text: str | None, nonce: str) -> Collected | Again | None:
        """What the claim's attach brought back (from its thread): no input sent (None: the pod is given up), or
        the stream's frame, vouched by the claim's nonce. Anything less is left to the pod's end (the log and the
        termination message hold the same frame)."""
        if text is None:
            return self.go_cold(run, pod_name, "the warm pod could not be attached")
        if is_terminal(run) or (run.get("status") or {}).get("podName") != pod_name:
            return None
        try:
            frame = parse_streamed_frame(text, nonce)
        except FrameError as e:
            log.warning("run %s: %s; waiting for the pod's log", run["metadata"]["name"], e)
            return None
        if frame.killed_unexplained:
            # Only the container's end (and the node's count) says whether it was the OOM killer, as for a cold run.
            return None
        pod = self.store.pod(run["metadata"]["uid"])
        if pod is None or pod["metadata"]["name"] != pod_name:
            pod = {"metadata": {"name": pod_name}}
        return Collected(pod, frame)

    def go_cold(self, run: Mapping[str, Any], pod_name: str, why: str) -> Again | None:
        """Give the warm pod up; the run, written back to Pending without a pod, is placed again: cold."""
        return AGAIN if self.claims.go_cold(run, pod_name, why) else None

    def vet(self, run: Mapping[str, Any], collected: Collected) -> Again | None:
        """A frame that proves this run's program never ran in the pod gives the pod up (AGAIN even when the write
        back to Pending did not land: the frame is never this run's result; the controller places it again only
        once its status has no pod)."""
        pod_name = collected.pod["metadata"]["name"]
        if isinstance(collected.frame, FrameError):
            return None
        if incomplete_input(collected.frame):
            return self.go_cold(run, pod_name, "the warm pod's input was cut short; the program did not run") \
                or AGAIN
        if not ran_this_claim(collected.frame, collected.pod):
            return self.go_cold(run, pod_name, "the warm pod ran an input that was not this run's (someone "
                                "attached to it first); this run's program did not run there") or AGAIN
        return None

    def _answering_soon(self, run: Mapping[str, Any]) -> bool:
        return self.claims.answering_soon(run)

    def _running(self, run: Mapping[str, Any], pod: Mapping[str, Any]) -> Again | None:
        """A pod claimed before this operator started: the runner's word says whether its input arrived."""
        current = self.store.run(run["metadata"]["uid"]) or run
        return AGAIN if self.claims.recover(current, pod) else None

    def _says_why_it_waits(self, pod: Mapping[str, Any]) -> bool:
        """A claimed pod is scheduled already: only a scheduler's word (a resize it has no room for) is news."""
        return bool(not_scheduled_because(pod))

    def due(self, run: Mapping[str, Any]) -> bool:
        """The claim's input and its Running status are timed (claim.py)."""
        return True
