"""Untrusted text made safe to show: what a program printed or named, and what a caller wrote, can carry terminal
escape sequences (set the title, erase a line, move the cursor) and bidirectional overrides that make a
terminal, `kubectl describe` or a log viewer show something other than what is there.

Every field printed outside the explicit stdout/stderr passthrough goes through one of these two functions:
messages, Events, error types and messages, artifact names, identities.
"""
from __future__ import annotations

import unicodedata

_KEPT_IN_TEXT = frozenset("\n\t")


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _unsafe(char: str) -> bool:
    # Cc: C0 and C1 controls (ESC, CSI 0x9b, BEL, CR...); Cf: format characters such as the bidi overrides
    # U+202A-202E and U+2066-2069 and zero-width joiners; Zl/Zp: line and paragraph separators.
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp")


def printable(text: str) -> str:
    """Multi-line text with every control and format character shown as a visible escape (\\x1b), newlines and
    tabs kept."""
    if text.isprintable():
        return text
    return "".join(_escape(c) if c not in _KEPT_IN_TEXT and _unsafe(c) else c for c in text)


def one_line(text: str) -> str:
    """The same for a single line (a summary, a table cell, a message): newlines are escaped too."""
    if text.isprintable():
        return text
    return "".join(_escape(c) if _unsafe(c) else c for c in text)
