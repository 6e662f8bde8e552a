"""The node's own word on memory: did the kernel's OOM killer kill a process of a sandbox's pod?

gVisor's Sentry and gofer are the only host processes of a sandbox, and they live in the pod's memory cgroup. When
a program's allocations take the pod past its limit, the host's OOM killer kills the Sentry, the program dies with
it, and no frame is written. containerd usually reports the container `OOMKilled`, but when its TaskOOM event
arrives after the sandbox's exit (seen under load: two seconds later) the kubelet says `Error`, exit code 128, and
nothing the operator can read says memory. The kernel's count cannot be late: it is raised before the kill. The
agent reads it when the sandbox's trace connection closes (the Sentry has ended), before the kubelet notices the
pod ended and removes its cgroup.

Where the pod's cgroup is: the directory of one of the sandbox's containers (the pause container's or the run's,
named by the container id: cgroup v1's `kubepods/[qos/]pod<uid>/<id>`, v2's `.../cri-containerd-<id>.scope`) has
the pod's directory as its parent. The count: v1's `memory.oom_control` counts kills in that cgroup alone, so the
pod's directory and every directory below it are read; v2's `memory.events` is hierarchical, and reading below
changes nothing."""

from __future__ import annotations

import os
from pathlib import Path

from coderun.sandbox.runner.child import oom_kill_count

# The host's /sys/fs/cgroup, mounted read-only into the agent's container (the chart's DaemonSet).
DEFAULT_CGROUP_ROOT = "/host/sys/fs/cgroup"
# The kubelet's top cgroup under each hierarchy (cgroupfs driver, then systemd's).
KUBEPODS = ("kubepods", "kubepods.slice")
# Directories below kubepods where a pod's may be: QoS classes, then the pod, then its containers.
MAX_POD_DEPTH = 3
# A pod has a handful of containers; a tree larger than this is not a pod's and is not read further.
MAX_DIRECTORIES = 64
COUNT_FILES = ("memory.oom_control", "memory.events")


def hierarchies(root: Path) -> list[Path]:
    """kubepods under cgroup v1's memory controller and under v2's unified root, where they exist."""
    return [base / name for base in (root / "memory", root) for name in KUBEPODS if (base / name).is_dir()]


def pod_directory(root: Path, container_ids: list[str]) -> Path | None:
    """The memory cgroup directory of the pod one of container_ids belongs to, or None."""
    if not container_ids:
        return None
    for kubepods in hierarchies(root):
        level = [kubepods]
        for _ in range(MAX_POD_DEPTH):
            below = []
            for directory in level:
                try:
                    entries = [e for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
                except OSError:
                    continue
                for entry in entries:
                    if any(c in entry.name for c in container_ids):
                        return directory
                below += [Path(e.path) for e in entries]
            level = below
    return None


def oom_kills(pod: Path) -> int:
    """The largest OOM kill count in the pod's cgroup and the ones below it (at most MAX_DIRECTORIES read)."""
    most, seen = 0, 0
    for directory, subdirectories, _ in os.walk(pod):
        seen += 1
        if seen > MAX_DIRECTORIES:
            break
        subdirectories[:] = sorted(subdirectories)
        for name in COUNT_FILES:
            try:
                most = max(most, oom_kill_count(Path(directory, name).read_text(errors="replace")))
            except OSError:
                continue
    return most


def pod_oom_killed(root: str | Path, container_ids: list[str]) -> bool | None:
    """Whether the kernel killed a process of the sandbox's pod for memory; None when its cgroup is not found
    (no such mount, another layout, or the kubelet removed it already)."""
    pod = pod_directory(Path(root), container_ids)
    return None if pod is None else oom_kills(pod) > 0
