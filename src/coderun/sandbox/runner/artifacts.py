"""The files the program left in its outputs dir, read without following a link and within the caps."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from typing import Callable

from .protocol import MAX_NAME_CHARS, REDACTION_MARGIN_CHARS, cap

# A program can create thousands of unwanted files; listing every one would
# bloat the frame, so only this many skipped entries are reported.
MAX_SKIPPED_LISTED = 64


def _display_name(relative: bytes) -> str:
    """File names may be any bytes; the frame must stay valid UTF-8 and bounded."""
    return cap(relative.decode("utf-8", errors="replace"), MAX_NAME_CHARS + REDACTION_MARGIN_CHARS)


def walk_outputs(root: bytes):
    """Yield (relative name, lstat) for every entry below root, sorted, no symlinks followed."""
    pending = [b""]
    while pending:
        prefix = pending.pop()
        try:
            names = sorted(os.listdir(os.path.join(root, prefix) if prefix else root))
        except OSError:
            continue
        subdirs = []
        for name in names:
            relative = os.path.join(prefix, name) if prefix else name
            try:
                info = os.lstat(os.path.join(root, relative))
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                subdirs.append(relative)
            else:
                yield relative, info
        pending.extend(reversed(subdirs))


def open_regular_file(path: bytes, expected: os.stat_result) -> int | None:
    """An fd of the file only if it is still the regular file we lstat'ed (no symlink swap)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != (expected.st_dev, expected.st_ino):
        os.close(fd)
        return None
    return fd


def read_regular_file(path: bytes, expected: os.stat_result, limit: int) -> bytes | None:
    """The file's bytes, if it is still the regular file we lstat'ed and no longer than limit."""
    fd = open_regular_file(path, expected)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    return data if len(data) <= limit else None


# store(name, fd, size) -> the frame entry of an artifact stored by the data plane, or the `why` it was skipped.
Store = Callable[[str, int, int], "dict | str"]


def store_file(path: bytes, expected: os.stat_result, name: bytes, store: Store) -> dict | str:
    """Hand the file (opened as read_regular_file opens it) to the data plane's store, by its name as UTF-8 (a
    name that is not cannot be an object's)."""
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError:
        return "bad-artifact-name"
    if len(text) > MAX_NAME_CHARS:  # what the data service refuses too
        return "bad-artifact-name"
    fd = open_regular_file(path, expected)
    if fd is None:
        return "not-a-regular-file"
    try:
        return store(text, fd, expected.st_size)
    finally:
        os.close(fd)


def collect_artifacts(outputs_dir: str, caps: dict, store: Store | None = None) -> tuple[list, list, int]:
    """Return (artifacts, skipped entries listed, skipped entries not listed).

    Runs after every other process in the sandbox is dead, so lstat-then-open
    (with O_NOFOLLOW and an inode check) cannot be raced from inside. A file with another link is skipped: its
    bytes may be anyone's. Files within the inline caps (in walk order) are in the frame; with `store` (the data
    plane's artifactsToStore) the others within the caps go to the store, and the frame names them only.
    """
    artifacts: list[dict] = []
    skipped: list[dict] = []
    unlisted = 0
    total_bytes = inline_bytes = 0
    root = os.fsencode(outputs_dir)
    try:
        root_info = os.lstat(root)
    except FileNotFoundError:
        return artifacts, skipped, unlisted
    if not stat.S_ISDIR(root_info.st_mode):  # the program replaced the dir, e.g. by a symlink
        why = "symlink" if stat.S_ISLNK(root_info.st_mode) else "not-a-regular-file"
        return artifacts, [{"name": ".", "why": why}], unlisted
    # Without a store, all that the caps allow is inline, as before the data plane.
    inline_file = caps.get("inlineFileBytes", caps["maxFileBytes"]) if store else caps["maxFileBytes"]
    inline_total = caps.get("inlineTotalBytes", caps["maxTotalBytes"]) if store else caps["maxTotalBytes"]
    for relative, info in walk_outputs(root):
        name = _display_name(relative)
        why = None
        entry: dict | str | None = None
        if stat.S_ISLNK(info.st_mode):
            why = "symlink"
        elif not stat.S_ISREG(info.st_mode):
            why = "not-a-regular-file"
        elif info.st_nlink > 1:
            why = "hard-link"
        elif len(artifacts) >= caps["maxFiles"]:
            why = "too-many"
        elif info.st_size > caps["maxFileBytes"]:
            why = "too-large"
        elif total_bytes + info.st_size > caps["maxTotalBytes"]:
            why = "total-too-large"
        elif info.st_size <= inline_file and inline_bytes + info.st_size <= inline_total:
            data = read_regular_file(os.path.join(root, relative), info, inline_file)
            if data is None:
                why = "not-a-regular-file"
            elif total_bytes + len(data) > caps["maxTotalBytes"] or inline_bytes + len(data) > inline_total:
                why = "total-too-large"
            else:
                inline_bytes += len(data)
                entry = {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                         "contentBase64": base64.b64encode(data).decode("ascii")}
        elif store is not None:
            entry = store_file(os.path.join(root, relative), info, relative, store)
        else:
            why = "too-large" if info.st_size > inline_file else "total-too-large"
        if isinstance(entry, str):
            why, entry = entry, None
        if why is not None or entry is None:
            if len(skipped) < MAX_SKIPPED_LISTED:
                skipped.append({"name": name, "why": why})
            else:
                unlisted += 1
            continue
        total_bytes += entry["size"]
        artifacts.append(entry)
    return artifacts, skipped, unlisted
