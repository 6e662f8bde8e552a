"""The attach session of a claimed warm pod (a thread of its own): attach, wait until the claim is recorded,
send the input, read the frame off the stream, and hand what it got back through a callback. It knows nothing
of runs or statuses: `hand_back(None)` means the input was never sent (the run must go cold), `hand_back(text)`
that the stream holds a frame. A stream that ended without one hands nothing back: the pod's end brings the
result through the log."""
from __future__ import annotations

import logging
import queue
from typing import Callable

from coderun.sandbox.runner.protocol import FRAME_PREFIX
from ... import metrics
from ...builders.names import CONTAINER_NAME
from ...builders.objects import POD_DEADLINE_MARGIN_SECONDS
from .trust import has_frame

log = logging.getLogger("coderun")

# The attach handshake and the input; past this the pod is given up and the run starts cold.
ATTACH_SECONDS = 10
# The most result a stream may carry (the log's own cap).
STREAM_LIMIT_BYTES = 8 * 1024 * 1024


def run(api, ns: str, pod_name: str, document: bytes, timeout_seconds: int, recorded: queue.Queue,
        hand_back: Callable[[str | None], None], on_sent: Callable[[], None] = lambda: None) -> None:
    """A failure before the input was sent gives the pod up (the run goes cold); after it, the log is the
    fallback. `on_sent`: what to do while the program starts (off the input's path)."""
    sent, received = exchange(api, ns, pod_name, document, has_frame, timeout_seconds, recorded, on_sent)
    if not sent:
        metrics.POOL_ATTACH_FAILURES.inc()
        hand_back(None)
        return
    text = received.decode("ascii", "replace")
    if FRAME_PREFIX in text:
        hand_back(text)


def attach_or_none(api, ns: str, pod_name: str):
    """The run container's attach, or None (logged) when it cannot be had."""
    try:
        return api.attach(ns, pod_name, CONTAINER_NAME)
    except api.Transient as e:
        log.warning("pod %s/%s: %s", ns, pod_name, e)
    except Exception as e:  # noqa: BLE001 - a session must never take the operator down
        log.error("pod %s/%s: attach failed: %s: %s", ns, pod_name, type(e).__name__, str(e)[:300])
    return None


def exchange(api, ns: str, pod_name: str, document: bytes, until: Callable[[bytes], bool], timeout_seconds: int,
             recorded: queue.Queue | None = None, on_sent: Callable[[], None] = lambda: None) -> tuple[bool, bytes]:
    """Attach, wait until `recorded` says the document may go (None: at once), send it, read the stream until
    `until` holds (or the run's timeout and the pod margin pass), close: (whether it was sent, what was read).
    A warm pod's one input; a session keeps its attach instead (controller/session/channel.py)."""
    received, sent = b"", False
    attached = attach_or_none(api, ns, pod_name)
    try:
        if recorded is not None and not recorded.get(timeout=ATTACH_SECONDS * 3):
            return False, b""  # the claim is not in the status: nothing may be sent
        if attached is not None:
            attached.send(document)
            sent = True
            on_sent()
            received = attached.read_until(until, STREAM_LIMIT_BYTES, timeout_seconds + POD_DEADLINE_MARGIN_SECONDS)
    except queue.Empty:
        return False, b""
    except api.Transient as e:
        log.warning("pod %s/%s: %s", ns, pod_name, e)
    except Exception as e:  # noqa: BLE001
        log.error("pod %s/%s: session failed: %s: %s", ns, pod_name, type(e).__name__, str(e)[:300])
    finally:
        if attached is not None:
            attached.close()
    return sent, received
