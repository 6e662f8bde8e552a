"""The one attach transport to a sandbox's runner: send a document on its stdin, read its stdout until the frame.

A warm pod's run uses a `Channel` once (attach while the claim is recorded, send when `ready` says so, close); a
session keeps its `Channel` open from run to run. A fresh attach costs its handshake (~14 ms on the local
cluster) and, under gVisor, the sandbox's first read on a new attach another ~12 ms; on an attach already open a
document and its frame go back and forth in ~2 ms (docs/sessions.md, "How fast"). Each exchange reads only what
came after its own document, and only `until` ends the read.

An attach idle longer than IDLE_SECONDS, or one the other side closed, is replaced before a document goes on
it: a document must never be written into a stream nobody reads. Attaching and closing happen outside the
channel's lock (an attach can take the API server's whole timeout). It knows nothing of runs or statuses.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from ..builders.names import CONTAINER_NAME
from ..builders.objects import POD_DEADLINE_MARGIN_SECONDS

log = logging.getLogger("coderun")

# The attach handshake and the input of a warm pod; past this the pod is given up and the run starts cold.
ATTACH_SECONDS = 10
# The most result a stream or a pod's log may carry: the runner's caps (2 streams + artifacts) bound a frame, and
# anything beyond this is not a real frame.
STREAM_LIMIT_BYTES = 8 * 1024 * 1024
# Past this without a run the attach is closed (tick) or replaced (the next run). Short: a connection that died
# without a word (a load balancer's or NAT's idle timeout, an API server gone) looks open until a read fails,
# and a document sent into it would cost its run and the session; an agent's next step seconds later still
# finds the attach open, a harness's back-to-back runs always do.
IDLE_SECONDS = 15.0


def attach_or_none(api: Any, ns: str, pod_name: str) -> Any:
    """The run container's attach, or None (logged) when it cannot be had."""
    try:
        return api.attach(ns, pod_name, CONTAINER_NAME)
    except api.Transient as e:
        log.warning("pod %s/%s: %s", ns, pod_name, e)
    except Exception as e:  # noqa: BLE001 - an attach must never take the operator down
        log.error("pod %s/%s: attach failed: %s: %s", ns, pod_name, type(e).__name__, str(e)[:300])
    return None


class Channel:
    """The attach of one sandbox pod. One exchange at a time uses it (a second while one is on is refused,
    unsent); `close` from another thread (the session ended) takes effect at once when it is idle, else as its
    exchange ends."""

    def __init__(self, api: Any, namespace: str, pod_name: str, clock: Callable[[], float] = time.monotonic):
        self.api, self.namespace, self.pod_name, self._clock = api, namespace, pod_name, clock
        self._attached: Any = None
        self._used_at = 0.0
        self._busy = False
        self._closed = False
        self._lock = threading.Lock()

    def exchange(self, document: bytes, until: Callable[[bytes], bool], timeout_seconds: int,
                 ready: Callable[[], bool] | None = None,
                 on_sent: Callable[[], None] = lambda: None) -> tuple[bool, bytes]:
        """Attach (or reuse the attach held), wait until `ready` says the document may go (None: at once), send
        it, read until `until` holds (or the timeout and the pod margin pass): (whether it was sent, what came
        after it). `on_sent`: what to do while the program starts (off the document's path). Never raises: a
        broken stream is closed, and the next exchange attaches again."""
        with self._lock:
            if self._closed or self._busy:
                return False, b""
            self._busy = True
            held, self._attached = self._attached, None
            recent = held is not None and self._clock() - self._used_at <= IDLE_SECONDS
        sent, received = False, b""
        attached: Any = None
        try:
            if held is not None and recent and self._still_open(held):
                attached = held
            else:
                if held is not None:
                    held.close()
                attached = attach_or_none(self.api, self.namespace, self.pod_name)
            if ready is not None and not ready():
                return False, b""  # e.g. a warm claim not recorded in its run's status: nothing may be sent
            if attached is None:
                return False, b""
            attached.send(document)
            sent = True
            on_sent()
            received = attached.read_until(until, STREAM_LIMIT_BYTES, timeout_seconds + POD_DEADLINE_MARGIN_SECONDS)
            if not until(received):  # the stream broke or the run outlived its deadline: never reuse it
                attached = self._let_go(attached)
        except self.api.Transient as e:
            log.warning("pod %s/%s: %s", self.namespace, self.pod_name, e)
            attached = self._let_go(attached)
        except Exception as e:  # noqa: BLE001 - an attach must never take the operator down
            log.error("pod %s/%s: attach failed: %s: %s", self.namespace, self.pod_name, type(e).__name__,
                      str(e)[:300])
            attached = self._let_go(attached)
        finally:
            with self._lock:
                self._busy, self._used_at = False, self._clock()
                closing = self._closed
                if not closing:
                    self._attached = attached
                    attached = None
            if attached is not None:
                attached.close()
        return sent, received

    def close_if_idle(self) -> None:
        """The tick's: an attach unused for IDLE_SECONDS is let go (the next exchange attaches again)."""
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
            held, self._attached = self._attached, None  # an exchange's own attach is closed as it ends
        if held is not None:
            held.close()

    def _still_open(self, attached: Any) -> bool:
        """Whether the attach held may take a document: open, once a close from the other side already sent
        is read."""
        try:
            return bool(attached.still_open())
        except self.api.Transient:
            return False

    @staticmethod
    def _let_go(attached: Any) -> None:
        if attached is not None:
            attached.close()
        return None
