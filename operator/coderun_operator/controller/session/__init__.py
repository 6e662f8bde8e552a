"""CodeRunSessions (docs/sessions.md): `reconciler.py` keeps a session's own lifecycle, `runs.py` takes the runs
naming it through its sandbox, `book.py` holds what both read, and `placement.py` is the run side's seam the
controller sees."""
from .book import SessionBook, Sends
from .reconciler import KEY_ENTRY, KEY_SECRET, SessionReconciler, WarmPods
from .runs import HeldFrame, SessionReply, SessionRuns, frame_with, run_nonce, session_key

__all__ = ["KEY_ENTRY", "KEY_SECRET", "HeldFrame", "SessionBook", "SessionReconciler", "SessionReply",
           "SessionRuns", "Sends", "WarmPods", "frame_with", "run_nonce", "session_key"]
