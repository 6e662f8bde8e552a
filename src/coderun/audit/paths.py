"""Paths as the record shows them: resolved the way the program named them, escaped so no reader is fooled, and
sorted into the run's own files and everything else."""

from __future__ import annotations

import posixpath

from coderun.api.text import one_line

AT_FDCWD = -100
# Longer paths are cut (the count of them is not affected).
MAX_SHOWN_CHARS = 512
# The fold keeps no more of a path than this (shown relative to the work dir, a kept path still fills a shown one).
MAX_KEPT_CHARS = 2 * MAX_SHOWN_CHARS
# Reads every interpreter makes: counted outside the work dir, never shown as examples. (Node reads /proc/meminfo
# as it starts, and looks for the package.json of its working dir up to /package.json.)
ROUTINE_PREFIXES = ("/usr/", "/lib/", "/lib64/", "/opt/", "/proc/self/", "/sys/devices/system/cpu/",
                    "/sys/fs/cgroup/")
ROUTINE_FILES = frozenset({"/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf", "/dev/null", "/dev/urandom",
                           "/dev/random", "/dev/tty", "/etc/mime.types", "/usr", "/lib", "/proc/self", "/proc/meminfo",
                           "/package.json"})


def escape(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """The project's one-line escaping (controls, format and reordering characters as \\xNN / \\uNNNN:
    coderun.api.text) with the backslash doubled first, so the escaped form is unambiguous; cut at limit
    characters with a trailing '…'."""
    shown = one_line(text.replace("\\", "\\\\"))
    return shown if len(shown) <= limit else shown[:limit - 1] + "…"


def capped(path: str) -> str:
    """A path as the fold keeps it: cut at MAX_KEPT_CHARS with a trailing '…' (more is never shown)."""
    return path if len(path) <= MAX_KEPT_CHARS else path[:MAX_KEPT_CHARS - 1] + "…"


def resolve(pathname: str, dir_path: str, dir_fd: int, cwd: str) -> str:
    """The absolute path an open* named, lexically: relative to its directory fd's path (openat's fd_path) or
    to the task's cwd. Symbolic links are not followed (gVisor records the name, not the file it reached).
    A base gVisor could not name ('[err: …]', or absent) leaves the path relative."""
    if pathname.startswith("/"):
        base = ""
    elif dir_fd != AT_FDCWD:
        base = dir_path if dir_path.startswith("/") else ""
    else:
        base = cwd if cwd.startswith("/") else ""
    if not pathname.startswith("/") and not base:
        return pathname
    joined = posixpath.normpath(posixpath.join(base, pathname))
    return "/" + joined.lstrip("/")  # normpath keeps a leading '//'


def is_under(path: str, directory: str) -> bool:
    directory = directory.rstrip("/") or "/"
    return path == directory or path.startswith(directory + "/") or directory == "/"


def is_routine(path: str) -> bool:
    return path in ROUTINE_FILES or path.startswith(ROUTINE_PREFIXES)


def shown(path: str, workdir: str) -> str:
    """Relative to the work dir inside it (data.csv), absolute elsewhere (/tmp/outputs/plot.png); escaped."""
    if path != workdir and is_under(path, workdir):
        path = path[len(workdir.rstrip("/")) + 1:]
    return escape(path)
