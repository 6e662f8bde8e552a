"""A set-like work queue of keys (namespaces, run uids), drained outside every run lock.

The shape of client-go's workqueue (agent-sandbox serialises its reconciles the same way): a key added while it
is queued is queued once; a key being processed is never handed to a second drainer at the same time, and one
added meanwhile is handed out again once its processing is done, so no wake-up is lost and none runs twice at
once. Pure: no I/O, no clock.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued: dict[K, None] = {}  # insertion-ordered: keys are handed out oldest first
        self._processing: set[K] = set()
        self._again: set[K] = set()  # added while being processed: queued again once done

    def add(self, key: K) -> None:
        with self._lock:
            if key in self._processing:
                self._again.add(key)
            else:
                self._queued[key] = None

    def __len__(self) -> int:
        with self._lock:
            return len(self._queued)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._queued or key in self._again

    def pop(self) -> K | None:
        """The oldest queued key, now being processed (call `done` with it after); None when none is ready."""
        with self._lock:
            for key in self._queued:
                del self._queued[key]
                self._processing.add(key)
                return key
            return None

    def done(self, key: K) -> None:
        with self._lock:
            self._processing.discard(key)
            if key in self._again:
                self._again.discard(key)
                self._queued[key] = None

    def drain(self, process: Callable[[K], None]) -> None:
        """Process every queued key, each once at a time, including keys added while draining. Several threads may
        drain together: they share the keys out."""
        while True:
            key = self.pop()
            if key is None:
                return
            try:
                process(key)
            finally:
                self.done(key)
