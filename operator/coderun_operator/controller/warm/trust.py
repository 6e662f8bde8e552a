"""Pool identity and trust, pure: which pods are interchangeable, which pod is genuinely the pool's, and which
frame is genuinely this claim's."""
from __future__ import annotations

import hashlib
import hmac
import math
from datetime import datetime
from typing import Any, Mapping

from kubernetes.utils import parse_quantity

from coderun.api.models import ResourceLimits, Runtime
from coderun.sandbox.runner.protocol import FRAME_PREFIX, INPUT_INCOMPLETE, accepted_line as line_for_nonce_digest
from ...builders import (ANNOTATION_NONCE_SHA256, ANNOTATION_POOL_KEY, LABEL_POOL, LABEL_POOL_LANGUAGE,
                         build_pool_pod)
from ...builders.objects import POD_DEADLINE_MARGIN_SECONDS
from ...builders.scheduling import holds_scheduling, sandbox_scheduling, scheduling_digest
from ...policy import Decision, Policy
from ...results.frame import RunnerFrame
from ...results.pod_state import is_running, terminated
from ...results.status import parse_time

# An unclaimed pod is replaced after this long, so a pool never keeps a pod (or an image) for ever.
POOL_IDLE_SECONDS = 3600


def pool_key(namespace: str, policy: Policy, runtime: Runtime, limits: ResourceLimits) -> str:
    """What makes pods interchangeable: namespace, policy (name and exact spec), image, sandbox runtime, the
    resources fixed at pod creation, and where the pods run (the policy's scheduling over the chart's defaults,
    which change without the policy: a pod made under other defaults is another pool's). Timeout and output caps
    travel with the input, so they may differ."""
    parts = (namespace, policy.name, policy.digest, runtime.language, runtime.image, runtime.runtime_class_name,
             limits.cpu, limits.memory, limits.disk, scheduling_digest(sandbox_scheduling(policy.scheduling)))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def run_pool_key(namespace: str, decision: Decision) -> str:
    return pool_key(namespace, decision.policy, decision.runtime, decision.limits)


def wanted_pools(namespace: str, policy: Policy) -> dict[str, tuple[str, Decision]]:
    """The pools a policy asks for: pool key -> (language, the decision its pods are built from)."""
    if not isinstance(policy, Policy) or policy.warm_pool_size <= 0:
        return {}
    pools = {}
    for language in policy.warm_pool_languages or tuple(policy.runtimes):
        runtime = policy.runtimes.get(language)
        if runtime is not None:
            decision = Decision(policy=policy, runtime=runtime, limits=policy.defaults)
            pools[pool_key(namespace, policy, runtime, policy.defaults)] = (language, decision)
    return pools


def key_of(pod: Mapping[str, Any]) -> str | None:
    return (pod["metadata"].get("annotations") or {}).get(ANNOTATION_POOL_KEY)


def is_ready(pod: Mapping[str, Any]) -> bool:
    return is_running(pod) and not pod["metadata"].get("deletionTimestamp")


def is_spent(pod: Mapping[str, Any]) -> bool:
    """An unclaimed pool pod that can never serve: it ended (idle deadline, a crash) or is being deleted."""
    return bool(terminated(pod) or pod["metadata"].get("deletionTimestamp")
                or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"))


def outlived(pod: Mapping[str, Any], now: datetime) -> bool:
    """An unclaimed pool pod past its idle time: its deadline leaves room for a session claimed at the last
    moment (objects.pool_session_room), so the refill, not the kubelet, ends its wait."""
    started = parse_time((pod.get("status") or {}).get("startTime"))
    return started is not None and (now - started).total_seconds() >= POOL_IDLE_SECONDS


def _same(a: Mapping[str, Any], b: Mapping[str, Any], fields: tuple[str, ...]) -> bool:
    return all((a.get(f) or None) == (b.get(f) or None) for f in fields)


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
    if not _same(have, wanted, pod_fields) or len(have.get("containers") or ()) != 1:
        return False
    # where it runs too: a pool on dedicated nodes never hands a run a look-alike on any other node
    if not holds_scheduling(have, sandbox_scheduling(decision.policy.scheduling)):
        return False
    # Unset means true for these two: only an explicit false is the pool's.
    if have.get("automountServiceAccountToken") is not False or have.get("enableServiceLinks") is not False:
        return False
    container, expected = have["containers"][0], wanted["containers"][0]
    return (_same(container, expected, container_fields)
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


def deadline_seconds(pod: Mapping[str, Any], timeout_seconds: int, now: datetime) -> int | None:
    """The pod's new activeDeadlineSeconds (counted from its start): this run's timeout from now on, plus the
    cold pod's margin. None when it would exceed what the pod has left (the API server allows only shrinking)."""
    started = parse_time((pod.get("status") or {}).get("startTime"))
    current = (pod.get("spec") or {}).get("activeDeadlineSeconds") or POOL_IDLE_SECONDS
    if started is None:
        return None
    wanted = math.ceil(max((now - started).total_seconds(), 0)) + timeout_seconds + POD_DEADLINE_MARGIN_SECONDS
    return wanted if wanted <= current else None


def claimed_cpu_request(limit: str) -> str:
    """The CPU request a claimed pod of a pool that reserves less asks for: a millicore under its limit, since an
    in-place resize may not change the pod's QoS class (its request at the limit would make it Guaranteed)."""
    return f"{max(math.ceil(parse_quantity(limit) * 1000) - 1, 1)}m"


def nonce_digest(nonce: str) -> str:
    return hashlib.sha256(nonce.encode()).hexdigest()


def claimed_digest(pod: Mapping[str, Any]) -> str:
    return (pod["metadata"].get("annotations") or {}).get(ANNOTATION_NONCE_SHA256) or "-"


def accepted_line(pod: Mapping[str, Any]) -> str:
    """What the pod's runner prints once it holds this claim's input (runner.accept_stdin_input)."""
    return line_for_nonce_digest(claimed_digest(pod))


def ran_this_claim(frame: RunnerFrame, pod: Mapping[str, Any]) -> bool:
    """A warm pod's frame is this run's only if it carries the nonce whose digest the claim recorded: a pod
    someone else attached to first ran their input, not this run's."""
    return isinstance(frame.nonce, str) and hmac.compare_digest(nonce_digest(frame.nonce), claimed_digest(pod))


def incomplete_input(frame: RunnerFrame) -> bool:
    return bool(frame.reason == INPUT_INCOMPLETE)


def has_frame(received: bytes) -> bool:
    at = received.find(b"\n" + FRAME_PREFIX.encode())
    return at >= 0 and received.find(b"\n", at + 1) >= 0
