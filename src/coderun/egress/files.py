"""The files the proxy's helpers read while they run: the signing keys (a mounted Secret, one file per key id)
and the revocation list (a mounted ConfigMap). Both change under a running proxy (key rotation, runs ending),
so they are re-read when they change, looked at no more than once a second (the revocations, by the acl helper,
on every check: helpers.main); a file that cannot be read keeps
the last good contents (keys start empty: nothing verifies until they are there)."""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, Generic, TypeVar

from .credential import KEY_ID_PATTERN, MIN_KEY_BYTES, parse_revocations

T = TypeVar("T")
MAX_KEY_BYTES = 4096
MAX_REVOCATIONS_BYTES = 8 * 1024 * 1024


class Watched(Generic[T]):
    """A value read from the file system, read again when its fingerprint changes."""

    def __init__(self, fingerprint: Callable[[], object], read: Callable[[], T], initial: T, interval: float = 1.0):
        self._fingerprint, self._read, self._value, self._interval = fingerprint, read, initial, interval
        self._seen: object = None
        self._checked = float("-inf")
        self._lock = threading.Lock()

    def current(self) -> T:
        with self._lock:
            now = time.monotonic()
            if now - self._checked >= self._interval:
                self._checked = now
                try:
                    seen = self._fingerprint()
                    if seen != self._seen:
                        self._value, self._seen = self._read(), seen
                except OSError as e:
                    print(f"coderun-egress: keeping the last good copy: {e}", file=sys.stderr)
            return self._value


def keys_in(directory: str) -> Watched[dict[str, bytes]]:
    """`directory/<key id>` holds that key's bytes (a Secret's keys, mounted); dotfiles (the Secret volume's
    ..data links) and malformed entries are skipped."""
    def entries() -> list[os.DirEntry]:
        return [e for e in os.scandir(directory) if KEY_ID_PATTERN.match(e.name) and e.is_file()]

    def fingerprint() -> object:
        return sorted((e.name, e.stat().st_mtime_ns, e.stat().st_size, e.stat().st_ino) for e in entries())

    def read() -> dict[str, bytes]:
        keys = {}
        for entry in entries():
            with open(entry.path, "rb") as f:
                key = f.read(MAX_KEY_BYTES + 1)
            if MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
                keys[entry.name] = key
        return keys

    return Watched(fingerprint, read, {})


def revocations_in(path: str, interval: float = 1.0) -> Watched[frozenset[str]]:
    """The revocation list (credential.render_revocations' format); missing means none revoked yet. Looked at
    again (a stat) at most every `interval` seconds."""
    def fingerprint() -> object:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    def read() -> frozenset[str]:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return parse_revocations(f.read(MAX_REVOCATIONS_BYTES).splitlines(), time.time())
        except FileNotFoundError:
            return frozenset()

    return Watched(fingerprint, read, frozenset(), interval)


def write_atomically(path: str, text: str) -> None:
    """Readers in other processes (the helpers, the admin server) see the old file or the new one, never half."""
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(temporary, path)
