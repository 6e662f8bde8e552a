"""One attach to a session's sandbox, kept open from run to run. A fresh attach costs its handshake (~14 ms on
the local cluster) and, under gVisor, the sandbox's first read on a new attach another ~12 ms; on an attach
already open a document and its frame go back and forth in ~2 ms (docs/sessions.md, "How fast"). Each run
still reads only what came after its own document, and only its own nonce's frame ends the read.

An attach idle longer than IDLE_SECONDS, or one the other side closed, is replaced before a document goes on
it: a document must never be written into a stream nobody reads."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from ...builders.names import CONTAINER_NAME
from ...builders.objects import POD_DEADLINE_MARGIN_SECONDS
from ..warm.session import STREAM_LIMIT_BYTES

log = logging.getLogger("coderun")

# Past this without a run the attach is closed (tick) or replaced (the next run): the API server and the kubelet
# may drop a stream that stays quiet, and a session waiting for its next run must not hold a connection for hours.
IDLE_SECONDS = 60.0


class Channel:
    """The attach of one session pod. One run at a time uses it (a session's runs go one by one); `close` from
    another thread (the session ended) takes effect at once when it is idle, else as its run's exchange ends."""

    def __init__(self, api, namespace: str, pod_name: str, clock: Callable[[], float] = time.monotonic):
        self.api, self.namespace, self.pod_name, self._clock = api, namespace, pod_name, clock
        self._attached = None
        self._used_at = 0.0
        self._busy = False
        self._closed = False
        self._lock = threading.Lock()

    def exchange(self, document: bytes, until: Callable[[bytes], bool], timeout_seconds: int) -> tuple[bool, bytes]:
        """Send the document, read until `until` holds (or the run's timeout and the pod margin pass): (whether it
        was sent, what came after it). Never raises: a broken stream is closed, and the next run attaches again."""
        with self._lock:
            if self._closed:
                return False, b""
            self._busy = True
            attached = self._attached if self._open_and_recent() else self._replace()
        sent, received = False, b""
        try:
            if attached is None:
                return False, b""
            attached.send(document)
            sent = True
            received = attached.read_until(until, STREAM_LIMIT_BYTES, timeout_seconds + POD_DEADLINE_MARGIN_SECONDS)
            if not until(received):  # the stream broke or the run outlived its deadline: never reuse it
                self._drop(attached)
        except self.api.Transient as e:
            log.warning("pod %s/%s: %s", self.namespace, self.pod_name, e)
            self._drop(attached)
        except Exception as e:  # noqa: BLE001 - a session must never take the operator down
            log.error("pod %s/%s: session failed: %s: %s", self.namespace, self.pod_name, type(e).__name__,
                      str(e)[:300])
            self._drop(attached)
        finally:
            with self._lock:
                self._busy, self._used_at = False, self._clock()
                if self._closed:
                    self._drop(self._attached)
        return sent, received

    def close_if_idle(self) -> None:
        """The tick's: an attach unused for IDLE_SECONDS is let go (the next run attaches again)."""
        with self._lock:
            if not self._busy and self._attached is not None and self._clock() - self._used_at > IDLE_SECONDS:
                self._drop(self._attached)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if not self._busy:
                self._drop(self._attached)

    def _open_and_recent(self) -> bool:
        """Whether the attach held may take a document: open (a close from the other side already read) and used
        within IDLE_SECONDS."""
        if self._attached is None or self._clock() - self._used_at > IDLE_SECONDS:
            return False
        try:
            return self._attached.still_open()
        except self.api.Transient:
            return False

    def _replace(self):
        self._drop(self._attached)
        try:
            self._attached = self.api.attach(self.namespace, self.pod_name, CONTAINER_NAME)
        except self.api.Transient as e:
            log.warning("pod %s/%s: %s", self.namespace, self.pod_name, e)
        except Exception as e:  # noqa: BLE001
            log.error("pod %s/%s: attach failed: %s: %s", self.namespace, self.pod_name, type(e).__name__,
                      str(e)[:300])
        return self._attached

    def _drop(self, attached) -> None:
        if attached is not None:
            attached.close()
        if attached is self._attached:
            self._attached = None
