"""The warm pool: pre-started sandbox pods per policy and language, each claimed once by a run that fits it.

A pool pod is the sandbox pod of a cold run with its runner already up and waiting on stdin. A run whose
policy keeps a pool, and whose cpu, memory and disk are the pool's, claims a ready pod with one conditional
patch, records the claim in its status, then a session thread attaches, sends the input with a fresh nonce
and reads the frame straight off the stream: no pod start, no kubelet relist on the critical path.

Nothing here is needed for a result, only for speed. The claimed pod is owned by the run and followed like a
cold run's pod, so if the stream breaks (or the operator dies) the result still comes from the log and the
termination message once the container ends. The input is only ever sent by the session that claimed the pod;
a pod whose input never arrived is deleted and the run starts cold, and a runner that got only part of its
input never runs the program (InputIncomplete), so no program runs twice.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import math
import queue
import secrets
import threading
import time
from datetime import datetime, timedelta
from typing import Any, Mapping

from kubernetes.utils import parse_quantity

from coderun.api.reasons import Phase, Reason, StartMode
from coderun.sandbox.runner.protocol import ACCEPTED_PREFIX, FRAME_PREFIX, INPUT_INCOMPLETE
from .. import metrics
from ..builders import (ANNOTATION_NONCE_SHA256, ANNOTATION_POOL_KEY, LABEL_POOL, LABEL_POOL_LANGUAGE,
                        build_input_configmap, build_pool_pod, claim_patch, code_hash, warm_input)
from ..builders.names import fit_name
from ..builders.objects import CONTAINER_NAME, POD_DEADLINE_MARGIN_SECONDS
from ..policy import Decision, Policy
from ..results.pod_state import is_running, terminated
from ..results.status import accepted_status, created_at, millis_between, parse_time
from . import core
from .store import owner_uid

log = logging.getLogger("coderun")

# An unclaimed pod is replaced after this long, so a pool never keeps a pod (or an image) for ever.
POOL_IDLE_SECONDS = 3600
# The attach handshake and the input; past this the pod is given up and the run starts cold.
ATTACH_SECONDS = 10
# The most result a stream may carry (the log's own cap).
STREAM_LIMIT_BYTES = 8 * 1024 * 1024
# A claimed pod whose runner has not said it accepted its input this long after the claim, with no session
# in this process to send it (the operator restarted), never got it: the run starts cold.
UNSENT_INPUT_SECONDS = 15
# After a start, pool pods whose policy the watch has not delivered yet are not stale.
STARTUP_GRACE_SECONDS = 30
MAX_SESSIONS = 256
# Pool pods starting at once per pool: a gVisor start costs about a CPU-second, which claimed pods need more.
MAX_STARTING = 4
RUNNING_STATUS_AFTER_SECONDS = 1

# A pool whose pods the API server refused is not asked again before this (a quota does not lift at once).
REFUSED_RETRY_SECONDS = 30

_started = time.monotonic()
_refused_until: dict[tuple[str, str], float] = {}


def pool_key(namespace: str, policy: Policy | str, digest: str, runtime, limits) -> str:
    """What makes pods interchangeable: namespace, policy (name and exact spec), image, sandbox runtime and the
    resources fixed at pod creation. Timeout and output caps travel with the input, so they may differ."""
    name = policy if isinstance(policy, str) else policy.name
    parts = (namespace, name, digest, runtime.language, runtime.image, runtime.runtime_class_name,
             limits.cpu, limits.memory, limits.disk)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def run_pool_key(namespace: str, decision: Decision) -> str:
    return pool_key(namespace, decision.policy.name, decision.policy.digest, decision.runtime, decision.limits)


def wanted_pools(namespace: str, policy: Policy) -> dict[str, tuple[str, Decision]]:
    """The pools a policy asks for: pool key -> (language, the decision its pods are built from)."""
    if not isinstance(policy, Policy) or policy.warm_pool_size <= 0 or policy.egress:
        return {}
    pools = {}
    for language in policy.warm_pool_languages or tuple(policy.runtimes):
        runtime = policy.runtimes.get(language)
        if runtime is not None:
            decision = Decision(policy=policy, runtime=runtime, limits=policy.defaults)
            pools[pool_key(namespace, policy, policy.digest, runtime, policy.defaults)] = (language, decision)
    return pools


def is_ready(pod: Mapping[str, Any]) -> bool:
    return is_running(pod) and not pod["metadata"].get("deletionTimestamp")


def is_spent(pod: Mapping[str, Any]) -> bool:
    """An unclaimed pool pod that can never serve: it ended (idle deadline, a crash) or is being deleted."""
    return bool(terminated(pod) or pod["metadata"].get("deletionTimestamp")
                or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"))


# ---------------------------------------------------------------------------------------------- claiming
def try_start(ctl: core.Controller, run: Mapping[str, Any], spec, decision: Decision, key: str | None) -> bool:
    """Start the run on a warm pod if its policy keeps a pool it fits and a pod is ready: True when it did (or
    the run is gone), False to start it cold."""
    meta = run["metadata"]
    ns, uid = meta["namespace"], meta["uid"]
    claimed = ctl.store.pod(uid)
    if claimed is not None and LABEL_POOL in (claimed["metadata"].get("labels") or {}):
        # Claimed by an operator that stopped before recording it: no input was sent (the status comes first),
        # but its nonce died with that operator. Give the pod up and claim afresh.
        ctl.api.delete_pod(ns, claimed["metadata"]["name"])
        ctl.store.forget_pod(claimed)
    if uid in ctl.cold_only or len(ctl.sessions) >= MAX_SESSIONS:
        return False
    policy = ctl.store.policies(ns).get(decision.policy.name)
    language = metrics.language_label(decision.runtime.language)
    if not isinstance(policy, Policy) or policy.digest != decision.policy.digest:
        return False
    wanted = wanted_pools(ns, policy)
    if not any(lang == decision.runtime.language for lang, _ in wanted.values()):
        return False
    pool = run_pool_key(ns, decision)
    if pool not in wanted:
        metrics.POOL_MISSES.labels(language, "limits").inc()
        return False
    now, (_, pool_decision) = ctl.now(), wanted[pool]
    for pod in sorted((p for p in ctl.store.pool_pods()
                       if p["metadata"].get("namespace") == ns and _key_of(p) == pool and is_ready(p)),
                      key=lambda p: p["metadata"].get("creationTimestamp") or ""):
        deadline = _deadline_seconds(pod, decision.limits.timeout_seconds, now)
        if deadline is None or not is_genuine(pod, pool_decision):
            continue
        nonce = secrets.token_hex(32)
        try:
            patched = ctl.api.claim_pod(ns, pod["metadata"]["name"],
                                        claim_patch(run, pod, deadline, nonce_digest(nonce)))
        except ctl.api.Refused as e:  # e.g. RBAC without pods patch: the pool cannot serve; never a run's failure
            log.warning("warm pool of %s/%s: %s; the run starts cold", ns, decision.policy.name, e)
            break
        if patched is None:
            continue  # another replica or run took it first
        ctl.store.put_pod(patched)
        metrics.POOL_CLAIMS.labels(language).inc()
        ctl.wake_pool()
        return _accept(ctl, run, spec, decision, key, patched, nonce)
    metrics.POOL_MISSES.labels(language, "empty").inc()
    ctl.wake_pool()
    return False


def nonce_digest(nonce: str) -> str:
    return hashlib.sha256(nonce.encode()).hexdigest()


def is_genuine(pod: Mapping[str, Any], decision: Decision) -> bool:
    """The pod is exactly the pool pod the operator builds for this pool, in every field that decides what runs
    and what it can reach. Anyone who may create pods in the namespace can copy the labels; a pod of their own
    (another image, no gVisor, a mounted token) must never receive a run's input."""
    wanted = build_pool_pod(pod["metadata"].get("namespace") or "", decision,
                            {LABEL_POOL: "", LABEL_POOL_LANGUAGE: "", "key": ""}, POOL_IDLE_SECONDS)["spec"]
    have = pod.get("spec") or {}
    # Defaulted or left out by the API server when false or empty: compared as "not set".
    pod_fields = ("runtimeClassName", "hostNetwork", "hostPID", "hostIPC", "securityContext", "dnsPolicy",
                  "dnsConfig", "initContainers", "ephemeralContainers", "shareProcessNamespace", "hostUsers")
    container_fields = ("image", "command", "args", "env", "envFrom", "securityContext", "stdin", "stdinOnce",
                        "volumeMounts", "workingDir")
    same = lambda a, b, fields: all((a.get(f) or None) == (b.get(f) or None) for f in fields)  # noqa: E731
    if not same(have, wanted, pod_fields) or len(have.get("containers") or ()) != 1:
        return False
    # Unset means true for these two: only an explicit false is the pool's.
    if have.get("automountServiceAccountToken") is not False or have.get("enableServiceLinks") is not False:
        return False
    container, expected = have["containers"][0], wanted["containers"][0]
    return (same(container, expected, container_fields)
            and _quantities((container.get("resources") or {}).get("limits")) ==
            _quantities(expected["resources"]["limits"])
            and [(v.get("name"), _quantities(v.get("emptyDir"))) for v in have.get("volumes") or ()] ==
            [(v["name"], _quantities(v.get("emptyDir"))) for v in wanted["volumes"]])


def _quantities(mapping: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Quantities by value: the API server may write 100663296 back as 96Mi."""
    if mapping is None:
        return None
    try:
        return {k: parse_quantity(v) for k, v in mapping.items()}
    except (ValueError, TypeError):
        return {"unreadable": mapping}


def _key_of(pod: Mapping[str, Any]) -> str | None:
    return (pod["metadata"].get("annotations") or {}).get(ANNOTATION_POOL_KEY)


def _deadline_seconds(pod: Mapping[str, Any], timeout_seconds: int, now: datetime) -> int | None:
    """The pod's new activeDeadlineSeconds (counted from its start): this run's timeout from now on, plus the
    cold pod's margin. None when it would exceed what the pod has left (the API server allows only shrinking)."""
    started = parse_time((pod.get("status") or {}).get("startTime"))
    current = (pod.get("spec") or {}).get("activeDeadlineSeconds") or POOL_IDLE_SECONDS
    if started is None:
        return None
    wanted = math.ceil(max((now - started).total_seconds(), 0)) + timeout_seconds + POD_DEADLINE_MARGIN_SECONDS
    return wanted if wanted <= current else None


def _accept(ctl: core.Controller, run: Mapping[str, Any], spec, decision: Decision, key: str | None,
            pod: Mapping[str, Any], nonce: str) -> bool:
    """The claim in the status, then the input: the session attaches while the status is written (the handshake
    is off the critical path) and sends only once the claim is recorded."""
    meta, now, pod_name = run["metadata"], ctl.now(), pod["metadata"]["name"]
    status = accepted_status(run, decision, pod_name, decision.runtime.image, code_hash(spec), now)
    status["startMode"] = StartMode.WARM
    status["message"] = f"warm sandbox pod {pod_name} claimed; sending the program"
    status["metrics"] = {**((run.get("status") or {}).get("metrics") or {}),
                         "queueMillis": millis_between(created_at(run), now)}
    if key:
        status["cacheKey"] = key
    recorded: queue.Queue[bool] = queue.Queue(maxsize=1)
    document = warm_input(build_input_configmap(run, spec, decision), nonce)
    session = threading.Thread(target=_session, name=f"warm-{meta['name'][:40]}", daemon=True,
                               args=(ctl, meta["uid"], meta["namespace"], pod_name, document, nonce,
                                     decision.limits.timeout_seconds, recorded))
    ctl.sessions[meta["uid"]] = session
    session.start()
    written = None
    try:
        written = ctl.write_status(run, status)
    finally:  # a failed write sends nothing: the next reconcile finds the claimed pod and gives it up
        recorded.put(written is not None)
    if written is None:
        ctl.api.delete_pod(meta["namespace"], pod_name)  # the run is gone
    return True


# ---------------------------------------------------------------------------------------------- the session
def _session(ctl: core.Controller, uid: str, ns: str, pod_name: str, document: bytes, nonce: str,
             timeout_seconds: int, recorded: queue.Queue) -> None:
    """Attach, wait for the claim to be recorded, send the input, read the frame; hand it to the collector. A
    failure before the input was sent gives the pod up (the run goes cold); after it, the log is the fallback."""
    received, sent, attached = b"", False, None
    try:
        attached = ctl.api.attach(ns, pod_name, CONTAINER_NAME)
    except ctl.api.Transient as e:
        log.warning("warm pod %s/%s: %s", ns, pod_name, e)
    except Exception as e:  # noqa: BLE001 - a session must never take the operator down
        log.error("warm pod %s/%s: attach failed: %s: %s", ns, pod_name, type(e).__name__, str(e)[:300])
    try:
        if not recorded.get(timeout=ATTACH_SECONDS * 3):
            return  # the claim is not in the status: nothing may be sent
        if attached is not None:
            attached.send(document)
            sent = True
            received = attached.read_until(_has_frame, STREAM_LIMIT_BYTES,
                                           timeout_seconds + POD_DEADLINE_MARGIN_SECONDS)
    except queue.Empty:
        return
    except ctl.api.Transient as e:
        log.warning("warm pod %s/%s: %s", ns, pod_name, e)
    except Exception as e:  # noqa: BLE001
        log.error("warm pod %s/%s: session failed: %s: %s", ns, pod_name, type(e).__name__, str(e)[:300])
    finally:
        if attached is not None:
            attached.close()
        ctl.sessions.pop(uid, None)
    if not sent:
        metrics.POOL_ATTACH_FAILURES.inc()
        ctl.with_run(uid, lambda run: go_cold(ctl, run, pod_name, "the warm pod could not be attached"))
        return
    text = received.decode("ascii", "replace")
    if FRAME_PREFIX in text:
        from .collection import collect_streamed
        ctl.with_run(uid, lambda run: collect_streamed(ctl, run, pod_name, text, nonce))
    # else: the stream ended without a frame; the pod's end brings the result through the log


def _has_frame(received: bytes) -> bool:
    at = received.find(b"\n" + FRAME_PREFIX.encode())
    return at >= 0 and received.find(b"\n", at + 1) >= 0


def go_cold(ctl: core.Controller, run: Mapping[str, Any], pod_name: str, why: str) -> None:
    """Give a warm pod up before its program ran: delete it and start the run again as a cold run."""
    meta, status = run["metadata"], run.get("status") or {}
    if status.get("podName") != pod_name or status.get("startMode") != StartMode.WARM:
        return
    ctl.cold_only.add(meta["uid"])
    pod = ctl.store.pod(meta["uid"])
    ctl.api.delete_pod(meta["namespace"], pod_name)
    if pod is not None and pod["metadata"]["name"] == pod_name:
        ctl.store.forget_pod(pod)
    log.info("run %s/%s: %s; starting it cold", meta["namespace"], meta["name"], why)
    written = ctl.write_status(run, {"phase": Phase.PENDING, "reason": Reason.ACCEPTED, "podName": None,
                                     "startMode": None, "startTime": None, "message": f"{why}; starting cold"})
    if written is not None:
        from .admission import admit
        admit(ctl, ctl.store.run(meta["uid"]) or run)


def recover(ctl: core.Controller, run: Mapping[str, Any], pod: Mapping[str, Any]) -> None:
    """A Warm run with its pod still running and no session here (this replica started after the claim): if
    the runner announced the input, the program runs and its end brings the result; if not, and the claim is
    old enough that no sender can still be connecting, the input never arrived and the run goes cold."""
    meta, status = run["metadata"], run.get("status") or {}
    if meta["uid"] in ctl.sessions or meta["uid"] in ctl.accepted_elsewhere:
        return
    claimed = parse_time(status.get("startTime"))
    if claimed is None or ctl.now() - claimed < timedelta(seconds=UNSENT_INPUT_SECONDS):
        return
    text, _ = ctl.api.read_log(meta["namespace"], pod["metadata"]["name"], CONTAINER_NAME, 4096)
    if accepted_line(pod) in text:
        ctl.accepted_elsewhere.add(meta["uid"])
        return
    go_cold(ctl, run, pod["metadata"]["name"], "the warm pod never received this run's input (the operator "
            "restarted after claiming it)")


def accepted_line(pod: Mapping[str, Any]) -> str:
    """What the pod's runner prints once it holds this claim's input (runner.accept_stdin_input)."""
    return f"{ACCEPTED_PREFIX}{claimed_digest(pod)[:16]}\n"


def claimed_digest(pod: Mapping[str, Any]) -> str:
    return (pod["metadata"].get("annotations") or {}).get(ANNOTATION_NONCE_SHA256) or "-"


def ran_this_claim(frame, pod: Mapping[str, Any]) -> bool:
    """A warm pod's frame is this run's only if it carries the nonce whose digest the claim recorded: a pod
    someone else attached to first ran their input, not this run's."""
    return isinstance(frame.nonce, str) and hmac.compare_digest(nonce_digest(frame.nonce), claimed_digest(pod))


def answering_soon(ctl: core.Controller, run: Mapping[str, Any]) -> bool:
    """A warm run whose session is live and younger than a second: its result is likely on the way, so the
    Running status (one more write beside the program) waits for the tick; a longer program gets it then."""
    claimed = parse_time((run.get("status") or {}).get("startTime"))
    return (run["metadata"]["uid"] in ctl.sessions and claimed is not None
            and ctl.now() - claimed < timedelta(seconds=RUNNING_STATUS_AFTER_SECONDS))


def incomplete_input(frame) -> bool:
    return frame.reason == INPUT_INCOMPLETE


# ---------------------------------------------------------------------------------------------- the pool
def refill(ctl: core.Controller) -> None:
    """Keep every pool at its size: create what is missing, delete what no policy wants (changed, shrunk,
    removed) and pods that can never serve. Runs on the tick and when a claim wakes it."""
    wanted: dict[tuple[str, str], tuple[str, Decision, int]] = {}
    for namespace, policies in ctl.store.all_policies().items():
        for policy in policies.values():
            for key, (language, decision) in wanted_pools(namespace, policy).items():
                wanted[(namespace, key)] = (language, decision, policy.warm_pool_size)
    by_pool: dict[tuple[str, str], list[dict[str, Any]]] = {}
    settled = time.monotonic() - _started > STARTUP_GRACE_SECONDS
    for pod in ctl.store.pool_pods():
        meta = pod["metadata"]
        pool = (meta.get("namespace"), _key_of(pod))
        # A pod that is not what the pool builds now (an older operator's, e.g. before the input had a volume
        # of its own, or a look-alike) would never be claimed, yet fill the pool's place: replace it.
        outdated = pool in wanted and not is_genuine(pod, wanted[pool][1])
        if is_spent(pod) or (pool not in wanted and settled) or outdated:
            if not meta.get("deletionTimestamp"):
                _delete_unclaimed(ctl, pod)
            continue
        by_pool.setdefault(pool, []).append(pod)
    for (namespace, key), (language, decision, size) in wanted.items():
        pods = sorted(by_pool.get((namespace, key), ()), key=lambda p: p["metadata"].get("creationTimestamp") or "")
        metrics.POOL_READY.labels(namespace, decision.policy.name, language).set(sum(1 for p in pods if is_ready(p)))
        for extra in pods[size:]:
            _delete_unclaimed(ctl, extra)
        starting = sum(1 for p in pods if not is_ready(p))
        missing = min(size - len(pods), MAX_STARTING - starting)
        if missing > 0:
            _create_pool_pods(ctl, namespace, key, language, decision, missing)


def _delete_unclaimed(ctl: core.Controller, pod: Mapping[str, Any]) -> None:
    """Delete a pool pod only as we saw it: if a run claimed it meanwhile, its resourceVersion moved and the
    API server refuses the deletion."""
    meta = pod["metadata"]
    ctl.api.delete_pod(meta["namespace"], meta["name"], resource_version=meta.get("resourceVersion"))


def _create_pool_pods(ctl: core.Controller, namespace: str, key: str, language: str, decision: Decision,
                      count: int) -> None:
    from .admission import _ensure_namespace_default_deny
    if _refused_until.get((namespace, key), 0) > time.monotonic():
        return
    try:
        if _ensure_namespace_default_deny(ctl, namespace):
            log.warning("warm pool of %s/%s: the namespace's default-deny policy is not coderun's; no pool pods",
                        namespace, decision.policy.name)
            return
        labels = {LABEL_POOL: fit_name(decision.policy.name), LABEL_POOL_LANGUAGE: language, "key": key}
        for _ in range(count):
            created = ctl.api.create_pod(build_pool_pod(namespace, decision, labels, POOL_IDLE_SECONDS))
            ctl.store.put_pod(created)
    except ctl.api.Refused as e:  # a quota, an admission policy, a namespace going away: say so, try again later
        _refused_until[(namespace, key)] = time.monotonic() + REFUSED_RETRY_SECONDS
        log.warning("warm pool of %s/%s: %s; trying again in %d s", namespace, decision.policy.name, e,
                    REFUSED_RETRY_SECONDS)


def observe_ready(pod: Mapping[str, Any], seen: set[str]) -> None:
    """Refill time: a pool pod's creation to its runner running (once per pod)."""
    meta = pod["metadata"]
    if owner_uid(pod) is None and LABEL_POOL in (meta.get("labels") or {}) and is_ready(pod) \
            and meta.get("uid") not in seen:
        seen.add(meta["uid"])
        created = parse_time(meta.get("creationTimestamp"))
        started = ((pod.get("status") or {}).get("containerStatuses") or [{}])[0].get("state", {}).get("running", {})
        running = parse_time(started.get("startedAt"))
        if created and running:
            metrics.POOL_REFILL_SECONDS.observe(max((running - created).total_seconds(), 0))

