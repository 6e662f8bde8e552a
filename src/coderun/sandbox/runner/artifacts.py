"""The files the program left in its outputs dir, read without following a link and within the caps."""

from __future__ import annotations

import base64
import hashlib
import os
import stat

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


def read_regular_file(path: bytes, expected: os.stat_result, limit: int) -> bytes | None:
    """Read a file only if it is still the regular file we lstat'ed (no symlink swap)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != (expected.st_dev, expected.st_ino):
            return None
        data = handle.read(limit + 1)
    return data if len(data) <= limit else None


def collect_artifacts(outputs_dir: str, caps: dict) -> tuple[list, list, int]:
    """Return (artifacts, skipped entries listed, skipped entries not listed).

    Runs after every other process in the sandbox is dead, so lstat-then-open
    (with O_NOFOLLOW and an inode check) cannot be raced from inside.
    """
    artifacts: list[dict] = []
    skipped: list[dict] = []
    unlisted = 0
    total_bytes = 0
    root = os.fsencode(outputs_dir)
    try:
        root_info = os.lstat(root)
    except FileNotFoundError:
        return artifacts, skipped, unlisted
    if not stat.S_ISDIR(root_info.st_mode):  # the program replaced the dir, e.g. by a symlink
        why = "symlink" if stat.S_ISLNK(root_info.st_mode) else "not-a-regular-file"
        return artifacts, [{"name": ".", "why": why}], unlisted
    for relative, info in walk_outputs(root):
        name = _display_name(relative)
        why = None
        data = None
        if stat.S_ISLNK(info.st_mode):
            why = "symlink"
        elif not stat.S_ISREG(info.st_mode):
            why = "not-a-regular-file"
        elif len(artifacts) >= caps["maxFiles"]:
            why = "too-many"
        elif info.st_size > caps["maxFileBytes"]:
            why = "too-large"
        elif total_bytes + info.st_size > caps["maxTotalBytes"]:
            why = "total-too-large"
        else:
            data = read_regular_file(os.path.join(root, relative), info, caps["maxFileBytes"])
            if data is None:
                why = "not-a-regular-file"
            elif total_bytes + len(data) > caps["maxTotalBytes"]:
                why = "total-too-large"
        if why is not None:
            if len(skipped) < MAX_SKIPPED_LISTED:
                skipped.append({"name": name, "why": why})
            else:
                unlisted += 1
            continue
        total_bytes += len(data)
        artifacts.append({
            "name": name,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "contentBase64": base64.b64encode(data).decode("ascii"),
        })
    return artifacts, skipped, unlisted
