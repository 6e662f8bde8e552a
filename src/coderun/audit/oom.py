"""The node's own word on memory: did the kernel's OOM killer kill a process of a sandbox's pod?

A sandbox's host processes (gVisor's Sentry and gofer, and under the systrap platform a stub process holding each
program process's address space) live in its pod's memory cgroup. When a program's allocations take the pod past
its limit, the host's OOM killer kills the largest: a stub (the program process dies, the runner reports a SIGKILL
it did not send) or the Sentry (everything dies, and no frame is written). containerd usually reports the container
`OOMKilled`, but when its TaskOOM event arrives after the container's exit (seen under load: two seconds later) the
kubelet says `Error` (exit code 128 when the Sentry died), and nothing the operator can read says memory. The
kernel's count cannot be late: it is raised before the kill. The agent reads it when runsc closes the sandbox's
trace connection (the sandbox has ended), before the kubelet notices the pod ended and removes its cgroup. The
count is the pod's, over the sandbox's life: the operator takes it only for an end that needs explaining (no frame,
or a SIGKILL the runner did not send).

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
# The kubelet's top cgroup, under the root or the kubelet's --cgroup-root (kind's /kubelet): kubepods
# (cgroupfs driver) or kubepods.slice, kubelet-kubepods.slice (systemd's).
KUBEPODS_NAMES = ("kubepods", "kubepods.slice")
KUBEPODS_SUFFIX = "-kubepods.slice"
# Directories below kubepods where a pod's may be: QoS classes, then the pod, then its containers.
MAX_POD_DEPTH = 3
# A pod has a handful of containers; a tree larger than this is not a pod's and is not read further.
MAX_DIRECTORIES = 64
COUNT_FILES = ("memory.oom_control", "memory.events")


def _is_kubepods(name: str) -> bool:
    return name in KUBEPODS_NAMES or name.endswith(KUBEPODS_SUFFIX)


def _directories(path: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def hierarchies(root: Path) -> list[Path]:
    """The kubelet's kubepods in the memory hierarchy (cgroup v1's memory controller, else v2's unified root), at
    the top or one level down (a kubelet --cgroup-root such as kind's /kubelet)."""
    base = root / "memory" if (root / "memory").is_dir() else root
    found = []
    for top in _directories(base):
        if _is_kubepods(top.name):
            found.append(top)
        else:
            found += [below for below in _directories(top) if _is_kubepods(below.name)]
    return found


def pod_directory(root: Path, container_ids: list[str]) -> Path | None:
    """The memory cgroup directory of the pod one of container_ids belongs to, or None."""
    if not container_ids:
        return None
    for kubepods in hierarchies(root):
        level = [kubepods]
        for _ in range(MAX_POD_DEPTH):
            below = []
            for directory in level:
                entries = _directories(directory)
                if any(c in entry.name for entry in entries for c in container_ids):
                    return directory
                below += entries
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
