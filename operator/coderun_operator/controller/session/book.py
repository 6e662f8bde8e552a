"""What the session's reconciler and its runs' side both read: the sessions as last seen, their pods, their kept
attaches, the run whose document is on its way to each, and the lock over them. Each side keeps the rest to
itself; they meet here and in the store, never by calling back into each other."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ..attach import Channel


@dataclass
class Sends:
    """A session's documents as this operator sent them (gone with the session)."""
    # the next document's sequence number, below the session's status's documentsReserved (None: none used since
    # this operator started, so the next is the reserved number itself)
    next_sequence: int | None = None
    # the first document (sequence 0, the session's key) was never sent: the attach failed first. The runner has
    # no key, so the next run's document is sent as the first again, not with a MAC.
    unkeyed: bool = False
    attach_failures: int = 0  # attaches in a row that sent nothing


class SessionBook:
    def __init__(self) -> None:
        self.sessions: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> the session as last seen
        self.pods: dict[str, dict[str, Any]] = {}  # session uid -> its sandbox pod
        self.channels: dict[str, Channel] = {}  # session uid -> the attach to its pod, kept between runs
        self.sending: dict[str, str] = {}  # session uid -> uid of the run whose document is on its way (Busy)
        self.sends: dict[str, Sends] = {}  # session uid -> its documents' numbering
        self.lock = threading.RLock()
        self.marks = threading.Lock()  # for `sending` alone: not the session lock, a write under it would hold a run

    def forget(self, namespace: str, name: str, uid: str) -> None:
        """The session was deleted."""
        self.sessions.pop((namespace, name), None)
        self.pods.pop(uid, None)
        self.sends.pop(uid, None)
        self.close_channel(uid)

    def close_channel(self, session_uid: str) -> None:
        channel = self.channels.pop(session_uid, None)
        if channel is not None:
            channel.close()

    def done_sending(self, session_uid: str, run_uid: str) -> None:
        """The run's document is no longer on its way (the next run's may be by now: that mark stays)."""
        with self.marks:
            if self.sending.get(session_uid) == run_uid:
                del self.sending[session_uid]
