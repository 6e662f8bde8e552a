"""Whose sandbox is it: the namespace of the pod a sandbox connection belongs to, so one tenant's floods take at
most its share of the agent (store.py). Told by the node, never by the sandbox: the pod's memory cgroup (found by
its pause container's id, oom.py) names the pod's uid, and the kubelet's pod log directory (`/var/log/pods`, one
directory `<namespace>_<pod>_<uid>` a pod, listed only: its files are root's) names the namespace of that uid."""

from __future__ import annotations

import os
import re
from pathlib import Path

from . import oom

# cgroupfs: pod<uid>; systemd: kubepods-<qos>-pod<uid, '-' as '_'>.slice
POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
DEFAULT_PODS_LOG_ROOT = "/host/var/log/pods"


def pod_uid(cgroup_root: str | Path, container_id: str) -> str | None:
    pod = oom.pod_directory(Path(cgroup_root), [container_id])
    match = POD_UID.search(pod.name) if pod is not None else None
    return match.group(1).replace("_", "-") if match else None


def namespace_of_uid(pods_log_root: str | Path, uid: str) -> str | None:
    try:
        names = os.listdir(pods_log_root)
    except OSError:
        return None
    for name in names:
        namespace, _, rest = name.partition("_")
        if rest.endswith("_" + uid) and namespace:
            return namespace
    return None


def resolver(cgroup_root: str | None, pods_log_root: str | None):
    """tenant_of(container_id) for the store: the pod's namespace, or None when either directory cannot tell."""
    if not cgroup_root or not pods_log_root:
        return None

    def tenant_of(container_id: str) -> str | None:
        uid = pod_uid(cgroup_root, container_id)
        namespace = namespace_of_uid(pods_log_root, uid) if uid else None
        return f"namespace {namespace}" if namespace else None

    return tenant_of
