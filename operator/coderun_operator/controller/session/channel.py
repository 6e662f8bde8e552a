"""One attach to a session's sandbox, kept open from run to run. A fresh attach costs its handshake (~14 ms on
the local cluster) and, under gVisor, the sandbox's first read on a new attach another ~12 ms; on an attach
already open a document and its frame go back and forth in ~2 ms (docs/sessions.md, "How fast"). Each run
still reads only what came after its own document, and only its own nonce's frame ends the read.

An attach idle longer than IDLE_SECONDS, or one the other side closed, is replaced before a document goes on
it: a document must never be written into a stream nobody reads. Attaching and closing happen outside the
channel's lock (an attach can take the API server's whole timeout)."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from ...builders.objects import POD_DEADLINE_MARGIN_SECONDS
from ..warm.session import STREAM_LIMIT_BYTES, attach_or_none

log = logging.getLogger("coderun")

# Past this without a run the attach is closed (tick) or replaced (the next run). Short: a connection that died
# without a word (a load balancer's or NAT's idle timeout, an API server gone) looks open until a read fails,
# and a document sent into it would cost its run and the session; an agent's next step seconds later still
# finds the attach open, a harness's back-to-back runs always do.
IDLE_SECONDS = 15.0


class Channel:
    """The attach of one session pod. One run at a time uses it (a second exchange while one is on is refused,
    unsent); `close` from another thread (the session ended) takes effect at once when it is idle, else as its
    run's exchange ends."""

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
            if self._closed or self._busy:
                return False, b""
            self._busy = True
            held, self._attached = self._attached, None
            recent = held is not None and self._clock() - self._used_at <= IDLE_SECONDS
        sent, received, attached = False, b"", None
        try:
            if held is not None and recent and self._still_open(held):
                attached = held
            else:
                if held is not None:
                    held.close()
                attached = attach_or_none(self.api, self.namespace, self.pod_name)
            if attached is None:
                return False, b""
            attached.send(document)
            sent = True
            received = attached.read_until(until, STREAM_LIMIT_BYTES, timeout_seconds + POD_DEADLINE_MARGIN_SECONDS)
            if not until(received):  # the stream broke or the run outlived its deadline: never reuse it
                attached.close()
                attached = None
        except self.api.Transient as e:
            log.warning("pod %s/%s: %s", self.namespace, self.pod_name, e)
            attached = self._let_go(attached)
        except Exception as e:  # noqa: BLE001 - a session must never take the operator down
            log.error("pod %s/%s: session failed: %s: %s", self.namespace, self.pod_name, type(e).__name__,
                      str(e)[:300])
            attached = self._let_go(attached)
        finally:
            with self._lock:
                self._busy, self._used_at = False, self._clock()
                closing = self._closed
                if not closing:
                    self._attached = attached
            if closing and attached is not None:
                attached.close()
        return sent, received

    def close_if_idle(self) -> None:
        """The tick's: an attach unused for IDLE_SECONDS is let go (the next run attaches again)."""
        with self._lock:
            idle = not self._busy and self._clock() - self._used_at > IDLE_SECONDS
            held = self._attached if idle else None
            if held is not None:
                self._attached = None
        if held is not None:
            held.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            held, self._attached = self._attached, None  # a run's own attach is closed as its exchange ends
        if held is not None:
            held.close()

    def _still_open(self, attached) -> bool:
        """Whether the attach held may take a document: open, once a close from the other side already sent
        is read."""
        try:
            return attached.still_open()
        except self.api.Transient:
            return False

    @staticmethod
    def _let_go(attached) -> None:
        if attached is not None:
            attached.close()
        return None
