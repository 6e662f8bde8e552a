"""Claiming a warm pod for a run, and the fallbacks to a cold start. The state (live attaches, runs that must
start cold, warm runs whose runner took its input from an earlier operator) lives in `Claims`.

Going cold is a status write (Pending, no pod) and nothing more here: the controller's reconcile, level-
triggered, then finds a run without a pod and admits it again; `cold_only` makes that start cold.
"""
from __future__ import annotations

import logging
import queue
import secrets
import threading
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping

from coderun.api.models import CodeRunSpec
from coderun.api.reasons import Reason, StartMode
from coderun.sandbox.runner.protocol import ACCEPTED_PREFIX, FRAME_PREFIX
from ...kube_api import KubeApi
from ... import metrics
from ...builders import LABEL_POOL, build_network_policy, claim_patch, code_hash, warm_input
from ...builders.egress import EgressAccess
from ...builders.names import CONTAINER_NAME
from ...builders.session import session_claim_patch
from ...policy import Decision, Policy
from ...results.status import parse_time, started_status, unplaced_status
from ..children import input_configmap
from ..store import Store
from ..writer import StatusWriter
from ..attach import ATTACH_SECONDS, Channel
from .trust import (accepted_line, claimed_cpu_request, deadline_seconds, has_frame, is_genuine, is_ready,
                    key_of, nonce_digest, run_pool_key, wanted_pools)

log = logging.getLogger("coderun")

# A claimed pod whose runner has not said it accepted its input this long after the claim, with no attach
# in this process to send it (the operator restarted), never got it: the run starts cold.
UNSENT_INPUT_SECONDS = 15
MAX_ATTACHES = 256
RUNNING_STATUS_AFTER_SECONDS = 1
FED_LOG_BYTES = 4096  # a pool pod's log before any claim: empty, or an attacher's input announced first
FED_LOG_READ_SECONDS = 2  # read under the session's lock: a slow kubelet costs the session the pool, not the tick

# What a claimed pod's attach brings back for its run: (run uid, pod name, the stream's text or None if no input
# was sent, nonce).
WarmReply = Callable[[str, str, "str | None", str], None]


class Claims:
    def __init__(self, api: KubeApi, store: Store, writer: StatusWriter, clock: Callable[[], datetime],
                 wake_pool: Callable[[], None], hand_back: WarmReply):
        self.api, self.store, self.writer, self.now = api, store, writer, clock
        self._wake_pool, self._hand_back = wake_pool, hand_back
        self.attaches: dict[str, threading.Thread] = {}  # run uid -> the thread attached to its claimed pod
        self.cold_only: set[str] = set()  # runs whose warm pod failed: they start cold
        self.accepted_elsewhere: set[str] = set()  # warm runs whose runner announced its input to an earlier operator

    def forget(self, uid: str) -> None:
        self.cold_only.discard(uid)
        self.accepted_elsewhere.discard(uid)

    def try_start(self, run: Mapping[str, Any], spec: CodeRunSpec, decision: Decision, key: str | None,
                  egress: EgressAccess | None = None, run_data: Mapping[str, Any] | None = None) -> bool:
        """Start the run on a warm pod if its policy keeps a pool it fits and a pod is ready: True when it did
        (or the run is gone), False to start it cold. `egress`: the proxy, for a policy with host rules (the
        run's credential, for the proxy pod `egress` is pinned to, travels with its input; the pool's NetworkPolicy
        already routes its pods to every proxy pod)."""
        meta = run["metadata"]
        ns, uid = meta["namespace"], meta["uid"]
        claimed = self.store.pod(uid)
        if claimed is not None and LABEL_POOL in (claimed["metadata"].get("labels") or {}):
            # Claimed by an operator that stopped before recording it: no input was sent (the status comes
            # first), but its nonce died with that operator. Give the pod up and claim afresh.
            self.api.delete_pod(ns, claimed["metadata"]["name"])
            self.store.forget_pod(claimed)
        if uid in self.cold_only or len(self.attaches) >= MAX_ATTACHES:
            return False
        language = metrics.language_label(decision.runtime.language)
        wanted = self._current_pools(ns, decision)
        if not any(lang == decision.runtime.language for lang, _ in wanted.values()):
            return False
        pool = run_pool_key(ns, decision)
        if pool not in wanted:
            metrics.POOL_MISSES.labels(language, "limits").inc()
            return False
        nonce = secrets.token_hex(32)
        patched = self.claim(ns, pool, wanted[pool][1], decision.limits.timeout_seconds,
                             lambda pod, deadline: claim_patch(run, pod, deadline, nonce_digest(nonce)))
        if patched is None:
            metrics.POOL_MISSES.labels(language, "empty").inc()
            return False
        metrics.POOL_CLAIMS.labels(language).inc()
        return self._accept(run, spec, decision, key, patched, nonce, egress, run_data)

    def claim_for_session(self, session: Mapping[str, Any], decision: Decision,
                          lifetime_seconds: int) -> dict[str, Any] | None:
        """A warm pod for a session, when its policy keeps a pool its limits fit and a pod there has the session's
        lifetime left: the pod as claimed (the session's from now on), or None to start the session's own."""
        ns = session["metadata"]["namespace"]
        pool, wanted = run_pool_key(ns, decision), self._current_pools(ns, decision)
        if pool not in wanted:
            return None
        patched = self.claim(ns, pool, wanted[pool][1], lifetime_seconds,
                             lambda pod, deadline: session_claim_patch(session, pod, deadline), self._never_fed)
        if patched is not None:
            metrics.POOL_CLAIMS.labels(metrics.language_label(decision.runtime.language)).inc()
            self.ask_whole_cpu(ns, patched["metadata"]["name"], decision)
        return patched

    def _never_fed(self, pod: Mapping[str, Any]) -> bool:
        """Whether no one attached to the pool pod first: its runner announces any input it takes (its log's first
        line). A session keeps its pod for many runs, so the look (one log read) is worth it there; a pod fed
        first is deleted, and the pool starts another. A run's claim does not look: its input would be dropped,
        and it goes cold (`go_cold`). One fed between the look and the claim ends its session at once."""
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        try:
            text, _ = self.api.read_log(ns, name, CONTAINER_NAME, FED_LOG_BYTES, timeout=FED_LOG_READ_SECONDS)
        except self.api.Transient:
            return False  # not known: another pod, or the session's own
        if ACCEPTED_PREFIX not in text:
            return True
        log.warning("warm pod %s/%s took an input before any claim (someone attached to it): deleting it", ns, name)
        try:
            self.api.delete_pod(ns, name)
            self.store.forget_pod(pod)
        except self.api.Transient as e:  # the refill's outlived check ends it later
            log.info("warm pod %s/%s: not deleted now: %s", ns, name, str(e)[:300])
        return False

    def _current_pools(self, ns: str, decision: Decision) -> dict[str, tuple[str, Decision]]:
        """The pools the decision's policy keeps as it is now; none if the policy changed since the decision."""
        policy = self.store.policies(ns).get(decision.policy.name)
        if not isinstance(policy, Policy) or policy.digest != decision.policy.digest:
            return {}
        return wanted_pools(ns, policy)

    def ask_whole_cpu(self, ns: str, pod_name: str, decision: Decision) -> None:
        """A claimed pod of a pool that reserves less CPU than its pods' limit asks for all of it (pods/resize).
        Best effort: its run or session goes on with the pool's request either way."""
        if not decision.policy.warm_pool_cpu_request:
            return
        try:
            self.api.resize_pod_cpu(ns, pod_name, CONTAINER_NAME, claimed_cpu_request(decision.limits.cpu))
        except Exception as e:  # noqa: BLE001 - a claimed pod's request must never take the operator down
            log.info("warm pod %s/%s: its CPU request stays the pool's: %s", ns, pod_name, str(e)[:300])

    def claim(self, ns: str, pool: str, pool_decision: Decision, seconds: int,
              patch_for: Callable[[Mapping[str, Any], int], list[dict[str, Any]]],
              usable: Callable[[Mapping[str, Any]], bool] = lambda pod: True) -> dict[str, Any] | None:
        """The oldest ready pod of the pool that is genuinely the pool's, has `seconds` left and is `usable`, made
        a run's or a session's by `patch_for(pod, its new deadline)`: the pod as patched, or None when none could
        be. The pool is woken either way, to fill the place or to start a pod."""
        now = self.now()
        try:
            for pod in sorted((p for p in self.store.pool_pods()
                               if p["metadata"].get("namespace") == ns and key_of(p) == pool and is_ready(p)),
                              key=lambda p: p["metadata"].get("creationTimestamp") or ""):
                deadline = deadline_seconds(pod, seconds, now)
                if deadline is None or not is_genuine(pod, pool_decision) or not usable(pod):
                    continue
                try:
                    patched = self.api.claim_pod(ns, pod["metadata"]["name"], patch_for(pod, deadline))
                except self.api.Refused as e:  # e.g. RBAC without pods patch: the pool cannot serve, never a failure
                    log.warning("warm pool of %s/%s: %s; starting cold", ns, pool_decision.policy.name, e)
                    return None
                if patched is None:
                    continue  # another replica, run or session took it first
                self.store.forget_pod(pod)  # no longer the pool's
                self.store.put_pod(patched)
                return patched
            return None
        finally:
            self._wake_pool()

    def _accept(self, run: Mapping[str, Any], spec: CodeRunSpec, decision: Decision, key: str | None,
                pod: Mapping[str, Any], nonce: str, egress: EgressAccess | None,
                run_data: Mapping[str, Any] | None = None) -> bool:
        """The claim in the status, then the input: its thread attaches while the status is written (the
        handshake is off the critical path) and sends only once the claim is recorded."""
        meta, pod_name = run["metadata"], pod["metadata"]["name"]
        status = started_status(run, decision, pod_name, code_hash(spec), key, StartMode.WARM, self.now(),
                                f"warm sandbox pod {pod_name} claimed; sending the program",
                                egress.pod if egress else None)
        recorded: queue.Queue[bool] = queue.Queue(maxsize=1)
        document = warm_input(input_configmap(run, spec, decision, egress, self.now().timestamp(),
                                              run_data=run_data), nonce)
        after_sent = self._after_sent(run, decision, egress, pod_name)
        thread = threading.Thread(target=self._serve, name=f"warm-{meta['name'][:40]}", daemon=True,
                                  args=(meta["uid"], meta["namespace"], pod_name, document, nonce,
                                        decision.limits.timeout_seconds, recorded, after_sent))
        self.attaches[meta["uid"]] = thread
        thread.start()
        written = None
        try:
            written = self.writer.write(run, status)
        finally:  # a failed write sends nothing: the next reconcile finds the claimed pod and gives it up
            recorded.put(written is not None)
        if written is None:
            self.api.delete_pod(meta["namespace"], pod_name)  # the run is gone
        return True

    def _serve(self, uid: str, ns: str, pod_name: str, document: bytes, nonce: str, timeout_seconds: int,
               recorded: queue.Queue[bool], after_sent: Callable[[], None]) -> None:
        """The claimed pod's one exchange (its own thread): attach while the claim is recorded, send the input once
        it is, read the frame. No input sent hands back None (the run goes cold); a stream that ended without a
        frame hands nothing back: the pod's end brings the result through the log."""
        def claim_recorded() -> bool:
            try:
                return recorded.get(timeout=ATTACH_SECONDS * 3)
            except queue.Empty:
                return False
        channel = Channel(self.api, ns, pod_name)
        try:
            sent, received = channel.exchange(document, has_frame, timeout_seconds, claim_recorded, after_sent)
        finally:
            channel.close()
            self.attaches.pop(uid, None)
        if not sent:
            metrics.POOL_ATTACH_FAILURES.inc()
            self._hand_back(uid, pod_name, None, nonce)
            return
        text = received.decode("ascii", "replace")
        if FRAME_PREFIX in text:
            self._hand_back(uid, pod_name, text, nonce)

    def _after_sent(self, run: Mapping[str, Any], decision: Decision, egress: EgressAccess | None,
                    pod_name: str) -> Callable[[], None]:
        """What a claimed pod gets while its program starts, off the input's path, each best effort (the program
        runs either way): a pool that reserves less CPU than its pods' limit asks for all of it (pods/resize);
        a policy with egress gives the run its own NetworkPolicy, as a cold run has, so its routes are the ones
        its decision recorded for as long as it runs, whatever becomes of the pool's."""
        ns = run["metadata"]["namespace"]
        routes = (build_network_policy(run, decision.policy.egress, egress.route if egress else None)
                  if decision.policy.egress else None)

        def after_sent() -> None:
            self.ask_whole_cpu(ns, pod_name, decision)
            if routes:
                try:
                    self.api.create_or_get(routes)
                except Exception as e:  # noqa: BLE001 - a warm pod's extras must never take the operator down
                    log.info("warm pod %s/%s: its own NetworkPolicy was not made: %s", ns, pod_name, str(e)[:300])
        return after_sent

    def go_cold(self, run: Mapping[str, Any], pod_name: str, why: str) -> bool:
        """Give a warm pod up before its program ran: delete it and write the run back to Pending without a pod.
        True when that was written: the caller reconciles the run again, which starts it cold."""
        meta, status = run["metadata"], run.get("status") or {}
        if status.get("podName") != pod_name or status.get("startMode") != StartMode.WARM:
            return False
        self.cold_only.add(meta["uid"])
        pod = self.store.pod(meta["uid"])
        self.api.delete_pod(meta["namespace"], pod_name)
        if pod is not None and pod["metadata"]["name"] == pod_name:
            self.store.forget_pod(pod)
        log.info("run %s/%s: %s; starting it cold", meta["namespace"], meta["name"], why)
        return self.writer.write(run, unplaced_status(Reason.ACCEPTED, f"{why}; starting cold")) is not None

    def recover(self, run: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
        """A Warm run with its pod still running and no attach here (this replica started after the claim): if
        the runner announced the input, the program runs and its end brings the result; if not, and the claim is
        old enough that no sender can still be connecting, the input never arrived and the run goes cold (True:
        reconcile it again)."""
        meta, status = run["metadata"], run.get("status") or {}
        if meta["uid"] in self.attaches or meta["uid"] in self.accepted_elsewhere:
            return False
        claimed = parse_time(status.get("startTime"))
        if claimed is None or self.now() - claimed < timedelta(seconds=UNSENT_INPUT_SECONDS):
            return False
        text, _ = self.api.read_log(meta["namespace"], pod["metadata"]["name"], CONTAINER_NAME, 4096)
        if accepted_line(pod) in text:
            self.accepted_elsewhere.add(meta["uid"])
            return False
        return self.go_cold(run, pod["metadata"]["name"], "the warm pod never received this run's input (the "
                            "operator restarted after claiming it)")

    def answering_soon(self, run: Mapping[str, Any]) -> bool:
        """A warm run whose attach is live and younger than a second: its result is likely on the way, so the
        Running status (one more write beside the program) waits for the tick; a longer program gets it then."""
        claimed = parse_time((run.get("status") or {}).get("startTime"))
        return (run["metadata"]["uid"] in self.attaches and claimed is not None
                and self.now() - claimed < timedelta(seconds=RUNNING_STATUS_AFTER_SECONDS))
