"""The cold placement: a sandbox pod of the run's own, created with its children (input ConfigMap, routes) and
followed through the watch until its container ended; the frame is read from its log, vouched for by the
termination message; the pod is deleted after the terminal write. A warm pod (warm/placement.py) is followed the
same way once claimed."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Mapping

from coderun.api.reasons import Phase, Reason, StartMode
from ..builders import code_hash
from ..builders.egress import EgressAccess
from ..builders.names import CONTAINER_NAME
from ..data_plane import DataPlane
from ..policy import DEFAULT_POLICY, Decision
from ..results.frame import FrameError, RunnerFrame, parse_frame
from ..results.pod_state import (has_failed, is_running, pod_level_failure, start_verdict, terminated,
                                 waiting_message)
from ..results.status import (Outcome, decision_fields, parse_time, running_status, started_status,
                              unstarted_status)
from .attach import STREAM_LIMIT_BYTES
from .children import create_sandbox
from .placement import Admitted, Again, Collected
from .store import Store, owner_uid
from .writer import StatusWriter


class ColdPlacement:
    mode: str = StartMode.COLD
    shares_sandbox = False

    def __init__(self, api: Any, store: Store, writer: StatusWriter, clock: Callable[[], datetime],
                 data: DataPlane | None = None):
        self.api, self.store, self.writer, self.now, self.data = api, store, writer, clock, data

    def place(self, run: Mapping[str, Any], admitted: Admitted, egress: EgressAccess | None) -> bool | Outcome:
        spec, decision = admitted.spec, admitted.decision
        try:  # the namespace's deny-all is refused like any child (a quota, a namespace being deleted)
            pod_name, conflict, proxy_pod = create_sandbox(self.api, run, spec, decision, egress,
                                                           self.now().timestamp(), admitted.run_data,
                                                           self.data.laid if self.data is not None else None)
        except self.api.Refused as refused:
            return Outcome(Phase.FAILED, Reason.START_FAILED, f"{refused}; the namespace's quota or admission "
                           "policy must allow the sandbox", decision_fields(decision))
        if conflict:
            return Outcome(Phase.FAILED, Reason.NAME_CONFLICT, conflict, decision_fields(decision))
        status = started_status(run, decision, pod_name, code_hash(spec), admitted.key, self.mode, self.now(),
                                proxy_pod=proxy_pod)
        if self.writer.write(run, status) is not None:
            self.writer.event(run, "Normal", Reason.POD_CREATED, f"sandbox pod {pod_name} created")
        return True

    def follow(self, run: Mapping[str, Any], decision: Decision | None,
               pod_event_deleted: bool) -> Collected | Outcome | Again | None:
        """Running, a verdict on a pod that cannot start, and the frame once the container terminated (read as
        soon as the kubelet says so, about a second before the pod phase moves)."""
        meta, status = run["metadata"], run.get("status") or {}
        ns = meta["namespace"]
        pod = self.store.pod(meta["uid"])
        if pod is not None and pod["metadata"]["name"] != status["podName"]:
            pod = None  # a warm pod given up for a cold start: not this run's pod any more
        if pod is None and not pod_event_deleted:
            pod = self.api.get_pod(ns, status["podName"])  # not in the store (yet): ask before calling it gone
            if pod is not None and owner_uid(pod) != meta["uid"]:
                pod = None  # a pod under its name that is not this run's: this run's pod is gone
            if pod is not None:
                self.store.put_pod(pod)
        if pod is None:
            return Outcome(Phase.FAILED, Reason.POD_DELETED, f"the sandbox pod {status['podName']} was deleted "
                           "before the program finished; create the CodeRun again")
        if terminated(pod):
            return self._collect(run, pod)
        limits = decision.limits if decision is not None else None
        failure = pod_level_failure(pod, limits) if has_failed(pod) else None
        if failure:
            return failure
        if is_running(pod):
            if status.get("phase") != Phase.RUNNING and not self._answering_soon(run):
                self.writer.write(run, running_status(run, self.now()))
            return self._running(run, pod)
        started = parse_time(status.get("startTime")) or self.now()
        deadline = (decision.policy if decision is not None else DEFAULT_POLICY).start_deadline_seconds
        verdict = start_verdict(pod, (self.now() - started).total_seconds(), deadline, self.api.nodes)
        if verdict:
            return verdict
        waiting = waiting_message(pod["metadata"]["name"], pod, deadline)
        if status.get("reason") == Reason.POD_CREATED and status.get("message") != waiting \
                and self._says_why_it_waits(pod):
            self.writer.write(run, unstarted_status(waiting))  # the scheduler's word, as soon as it is said
        return None

    def _collect(self, run: Mapping[str, Any], pod: Mapping[str, Any]) -> Collected:
        """The container ended: read the log once and trust only the frame the termination message vouches for."""
        state = terminated(pod) or {}
        text, complete = self.api.read_log(run["metadata"]["namespace"], pod["metadata"]["name"], CONTAINER_NAME,
                                           STREAM_LIMIT_BYTES)
        frame: RunnerFrame | FrameError
        try:
            frame = parse_frame(text, state.get("message"), complete)
        except FrameError as e:
            frame = e
        return Collected(pod, frame, oom_killed=state.get("reason") == "OOMKilled")

    # What a warm pod's follow does otherwise (warm/placement.py).
    def _answering_soon(self, run: Mapping[str, Any]) -> bool:
        return False

    def _running(self, run: Mapping[str, Any], pod: Mapping[str, Any]) -> Again | None:
        return None

    def _says_why_it_waits(self, pod: Mapping[str, Any]) -> bool:
        """Whether a pending pod's waiting words go to the run's status: a cold pod's always."""
        return True

    def vet(self, run: Mapping[str, Any], collected: Collected) -> Again | None:
        return None

    def keeps_state(self, run: Mapping[str, Any]) -> bool:
        return False

    def release(self, run: Mapping[str, Any], pod_name: str | None) -> None:
        if pod_name:
            self.api.delete_pod(run["metadata"]["namespace"], pod_name)

    def due(self, run: Mapping[str, Any]) -> bool:
        """A pod that must start within its deadline."""
        status = run.get("status") or {}
        return status.get("phase") == Phase.PENDING and bool(status.get("podName"))
