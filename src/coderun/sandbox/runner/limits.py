"""The sandbox's own limits, which the runner enforces while the program runs: scratch bytes (deleted but open files
too) and inodes, the process count, the termination log; and the kernel's limits set in the child before exec."""

from __future__ import annotations

import os
import resource
import stat
import time

from .confinement import enter_program_namespaces
from .processes import program_processes
from .protocol import DISK_LIMIT_EXCEEDED, PROCESS_LIMIT_EXCEEDED, SANDBOX_VIOLATION
from .seccomp import install_syscall_filter

# How often the sandbox's limits are checked while the program runs; a big /tmp tree is walked less often so
# the walk costs at most 1/GUARD_COST_RATIO of the time.
GUARD_INTERVAL_SECONDS = 0.2
PROGRAM_NICENESS = 10
NPROC_HEADROOM = 64
GUARD_COST_RATIO = 20
GUARD_NEAR_LIMIT_SECONDS = 1.0
DELETED_MARK = " (deleted)"


# The walk of the scratch dir holds one open directory per level down to this depth; deeper directories are
# opened by their path below the deepest one held, in pieces well under PATH_MAX (a path the program made
# longer than PATH_MAX cannot hide what is below it).
WALK_HELD_DIRS = 64
PATH_PIECE_CHARS = 1000
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_program_dir(path: str, dir_fd: int) -> int | None:
    """Open a directory of the program's below dir_fd, never through a symlink at its end.

    The runner has the program's uid, not root's override: a directory the program made unreadable or
    unsearchable to hide what is in it gets its owner's rwx bits back (only the program's own files can be
    changed so, and only their mode)."""
    try:
        fd = os.open(path, DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        return _reopen_with_owner_access(path, dir_fd)
    except OSError:
        return None
    try:
        mode = os.fstat(fd).st_mode
        if mode & 0o500 != 0o500:
            os.fchmod(fd, stat.S_IMODE(mode) | 0o700)
    except OSError:
        pass
    return fd


def _reopen_with_owner_access(path: str, dir_fd: int) -> int | None:
    try:
        handle = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(os.fstat(handle).st_mode) | 0o700)
        return os.open(f"/proc/self/fd/{handle}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        os.close(handle)


def open_dir_by_pieces(path: str, anchor_fd: int) -> int | None:
    """open_program_dir for a relative path of any length: PATH_PIECE_CHARS at a time."""
    fd: int | None = anchor_fd
    try:
        while fd is not None and len(path) > PATH_PIECE_CHARS:
            cut = path.rfind("/", 0, PATH_PIECE_CHARS)  # a name is at most 255 bytes: there is one
            parent, fd = fd, open_program_dir(path[:cut], fd) if cut > 0 else None
            path = path[cut + 1:]
            if parent != anchor_fd:
                os.close(parent)
        return None if fd is None else open_program_dir(path, fd)
    finally:
        if fd is not None and fd != anchor_fd:
            os.close(fd)


class ScratchWalk:
    """One bounded walk of a directory tree: bytes allocated (st_blocks, a hard-linked file once) and inodes
    (directory entries), never following a symlink, stopping once the count passes max_inodes or the bytes pass
    max_bytes. Without bytes it needs no stat() at all (the directory entry says what is a directory): about
    15x cheaper."""

    def __init__(self, max_inodes: int, with_bytes: bool, max_bytes: int | None = None):
        self.max_inodes, self.with_bytes = max_inodes, with_bytes
        self.max_bytes = max_bytes if with_bytes and max_bytes is not None else float("inf")
        self.used = self.inodes = 0
        self.linked: set[tuple[int, int]] = set()

    @property
    def done(self) -> bool:
        return self.inodes > self.max_inodes or self.used > self.max_bytes

    def subdirs(self, fd: int) -> list[str]:
        """Count the entries of the open directory fd; the names of its subdirectories."""
        names = []
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    self.inodes += 1
                    try:
                        if self.with_bytes:
                            info = entry.stat(follow_symlinks=False)
                            if info.st_nlink < 2 or stat.S_ISDIR(info.st_mode) or self._first_link(info):
                                self.used += info.st_blocks * 512
                        if entry.is_dir(follow_symlinks=False):
                            names.append(entry.name)
                    except OSError:
                        pass
                    if self.done:
                        break
        except OSError:
            pass
        return names

    def _first_link(self, info: os.stat_result) -> bool:
        key = (info.st_dev, info.st_ino)
        if key in self.linked:
            return False
        self.linked.add(key)
        return True

    def tree(self, root: str) -> None:
        try:
            root_fd = os.open(root, DIR_FLAGS)
        except OSError:
            return
        stack = [(root_fd, self.subdirs(root_fd))]  # (open directory, its subdirectories still to walk)
        try:
            while stack and not self.done:
                fd, names = stack[-1]
                if not names:
                    stack.pop()
                    os.close(fd)
                elif len(stack) < WALK_HELD_DIRS:
                    child = open_program_dir(names.pop(), fd)
                    if child is not None:
                        stack.append((child, self.subdirs(child)))
                else:
                    self._below(fd, names.pop())
        finally:
            for fd, _ in stack:
                os.close(fd)

    def _below(self, anchor_fd: int, top: str) -> None:
        """A subtree deeper than the held directories, walked by paths relative to anchor_fd."""
        pending = [top]
        while pending and not self.done:
            path = pending.pop()
            fd = open_dir_by_pieces(path, anchor_fd)
            if fd is None:
                continue
            try:
                pending.extend(f"{path}/{name}" for name in self.subdirs(fd))
            finally:
                os.close(fd)


def scratch_usage(root: str, max_inodes: int, with_bytes: bool = True,
                  max_bytes: int | None = None) -> tuple[int, int]:
    """(bytes allocated, inodes) under root, each counted only a little past its cap; see ScratchWalk."""
    walk = ScratchWalk(max_inodes, with_bytes, max_bytes)
    walk.tree(root)
    return walk.used, walk.inodes


def tmpfs_usage(info: os.statvfs_result) -> tuple[int, int]:
    """(bytes allocated, inodes) of the scratch's own tmpfs (confinement.mount_capped_scratch) from its statfs: its
    pages, those of deleted but open files too, and its inodes but its root, as the walk counts them."""
    return (info.f_blocks - info.f_bfree) * info.f_frsize, info.f_files - info.f_ffree - 1


def is_unlinked(target: str, info: os.stat_result) -> bool:
    """gVisor keeps st_nlink at 1 for a deleted file that is still open; the link's " (deleted)" mark, checked
    against the path itself (a file may be named so), tells it there."""
    if info.st_nlink == 0:
        return True
    return target.endswith(DELETED_MARK) and not _names(target, info) and not _names(target[:-len(DELETED_MARK)], info)


def _names(path: str, info: os.stat_result) -> bool:
    try:
        named = os.lstat(path)
    except OSError:
        return False
    return (named.st_dev, named.st_ino) == (info.st_dev, info.st_ino)


def unlinked_open_bytes(pids: list[int], root: str) -> int:
    """Bytes of files under root that the program deleted but still holds open: their blocks stay allocated
    and no walk sees them (open, unlink, write is the classic way to hide disk use). A process that made
    itself undumpable hides its fds from us; its files still count against the pod's own limit."""
    prefix = root.rstrip("/") + "/"
    used, seen = 0, set()
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
                if not target.startswith(prefix):
                    continue
                info = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            key = (info.st_dev, info.st_ino)
            if stat.S_ISREG(info.st_mode) and key not in seen and is_unlinked(target, info):
                seen.add(key)
                used += info.st_blocks * 512
    return used


def lower_rlimit(which: int, value: int) -> None:
    """Set soft and hard limit to value, or leave the hard limit where it is if it is lower already (raising it
    is not allowed: the run would fail on a policy's generous cap)."""
    hard = resource.getrlimit(which)[1]
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


class Guards:
    """The sandbox's own limits, checked while the program runs and once more when it is gone: /tmp bytes
    and inodes (the kubelet would evict only a minute later), the process count, and the termination log
    (a host file outside disk accounting that belongs to the runner).

    With scratch_capped (the scratch dir is the runner's capped tmpfs) its kernel refuses what passes the caps
    and a statfs reads the counts: no walk, and nothing a starved runner can miss. Else the tree is walked."""

    def __init__(self, scratch_dir: str, disk_bytes: int | None, max_inodes: int, max_processes: int,
                 termination_fd: int | None, is_pid1: bool, input_dir: str | None = None,
                 scratch_capped: bool = False, inputs_dir: str | None = None):
        self.scratch_dir, self.disk_bytes, self.max_inodes = scratch_dir, disk_bytes, max_inodes
        self.scratch_capped = scratch_capped
        self.input_dir = input_dir
        self.inputs_dir = inputs_dir  # the data plane's inputs: read-only to the program
        self.max_processes, self.termination_fd, self.is_pid1 = max_processes, termination_fd, is_pid1
        self.session: int | None = None
        self.forked = False  # the program is forked by the fork server (see child_limits), not started by us
        self.uncounted: frozenset[int] = frozenset()  # the fork server: ours, not the program's
        self.next_check = 0.0
        self.next_bytes_check = 0.0
        self.near_limit = False

    def child_limits(self) -> None:
        """In the child before exec: the kernel stops a single file at the disk limit (the termination log, a host
        file outside disk accounting, too) and forks at the cap (RLIMIT_NPROC counts the uid's processes: the
        runner is one of them); as PID 1, the program gets a PID namespace of its own (it cannot signal us) and a
        mount namespace in which the raw input is hidden and the data plane's inputs are read-only; and the syscall
        filter goes on last."""
        if self.disk_bytes is not None:
            lower_rlimit(resource.RLIMIT_FSIZE, self.disk_bytes)
        # The program yields the CPU to the runner when they compete (a fork bomb would starve it otherwise);
        # alone on its CPUs it runs as fast as ever.
        os.nice(PROGRAM_NICENESS)
        if self.is_pid1:
            # Tasks, threads included, the runner's among them: headroom above the cap the runner counts, so the
            # count meets the cap first (and says so), while a fork bomb stays far below the pod's PID limit.
            lower_rlimit(resource.RLIMIT_NPROC, self.max_processes + NPROC_HEADROOM)
            enter_program_namespaces(self.max_processes, self.input_dir, own_user=self.forked,
                                     read_only_dir=self.inputs_dir)
        install_syscall_filter()

    def due(self, now: float) -> bool:
        return now >= self.next_check

    def check(self, now: float, final: bool = False) -> tuple[str, dict] | None:
        """(reason, limit) when a limit is broken, else None; schedules the next check. Counting files is
        cheap and done every time; summing their bytes (a stat each) backs off on big trees."""
        # The cost is the runner's own CPU time, not wall time: a fork bomb that starves the runner must not
        # also stretch the pause before the next check.
        started = time.process_time()
        with_bytes = final or now >= self.next_bytes_check
        verdict = self._check(with_bytes)
        cost = time.process_time() - started
        # Every check waits GUARD_COST_RATIO times its own cost before the next one, so the checks together take
        # at most 1/(GUARD_COST_RATIO + 1) of a core; the costlier bytes walk comes every other such pause at most,
        # the cheap counts in between.
        pause = max(GUARD_INTERVAL_SECONDS, cost * GUARD_COST_RATIO)
        if self.near_limit:
            # Past half a limit, a costly walk (e.g. thousands of directories) must not put the next look beyond
            # the flood: at least every GUARD_NEAR_LIMIT_SECONDS then, at up to half a core.
            pause = min(pause, max(GUARD_NEAR_LIMIT_SECONDS, cost))
        self.next_check = now + pause
        if with_bytes:
            self.next_bytes_check = now + (pause if self.near_limit
                                           else max(GUARD_INTERVAL_SECONDS, 2 * cost * GUARD_COST_RATIO))
        return verdict

    def _check(self, with_bytes: bool) -> tuple[str, dict] | None:
        if self.termination_fd is not None:
            try:
                written = os.fstat(self.termination_fd).st_size
            except OSError:
                written = 0
            if written > 0:
                return SANDBOX_VIOLATION, {"kind": "termination-log", "limit": 0, "observed": written}
        pids = self.program_pids()
        verdict = self._at_process_cap(pids)
        if verdict:
            return verdict
        counted = self._tmpfs_usage()
        if counted is not None:
            (used, inodes), with_bytes = counted, True
        else:
            used, inodes = scratch_usage(self.scratch_dir, self.max_inodes, with_bytes, self.disk_bytes)
        self.near_limit = 2 * inodes > self.max_inodes or (
            with_bytes and self.disk_bytes is not None and 2 * used > self.disk_bytes)
        if inodes > self.max_inodes:
            return DISK_LIMIT_EXCEEDED, {"kind": "inodes", "limit": self.max_inodes, "observed": inodes}
        if with_bytes and self.disk_bytes is not None:
            if used <= self.disk_bytes and counted is None:  # else over already, or the tmpfs counted them
                used += unlinked_open_bytes(pids, self.scratch_dir)
            if used > self.disk_bytes:
                return DISK_LIMIT_EXCEEDED, {"kind": "disk", "limit": self.disk_bytes, "observed": used}
        return None

    def processes_at_cap(self) -> tuple[str, dict] | None:
        return self._at_process_cap(self.program_pids())

    def program_pids(self) -> list[int]:
        """The program's processes now (as PID 1: every process but ours; the namespace's init and mirror too)."""
        pids = program_processes(os.getpid(), None if self.is_pid1 else self.session, self.session)
        return [pid for pid in pids if pid not in self.uncounted] if self.uncounted else pids

    def _at_process_cap(self, pids: list[int]) -> tuple[str, dict] | None:
        if len(pids) < self.max_processes:
            return None
        return PROCESS_LIMIT_EXCEEDED, {"kind": "processes", "limit": self.max_processes, "observed": len(pids)}

    def _tmpfs_usage(self) -> tuple[int, int] | None:
        if not self.scratch_capped:
            return None
        try:
            return tmpfs_usage(os.statvfs(self.scratch_dir))
        except OSError:
            return None

    def disk_used(self) -> int:
        counted = self._tmpfs_usage()
        return counted[0] if counted is not None else scratch_usage(self.scratch_dir, self.max_inodes)[0]
