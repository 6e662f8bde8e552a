"""Secret redaction: key-like strings never reach the status, whatever the program printed.

Patterns run on RE2 (google-re2), which matches in time linear in the input: a program's output is hostile,
and a backtracking engine on a crafted string could stall the operator for minutes. RE2 has no look-around,
so a pattern that must keep a prefix captures it as group 1 and the replacement puts it back.
"""
from __future__ import annotations

from typing import Iterable

import re2

# (kind, pattern); a match is replaced by [REDACTED:kind]. Specific formats first, the generic ones last.
BUILTIN_PATTERNS: tuple[tuple[str, str], ...] = (
    ("private-key", r"(?s)-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]{0,40}PRIVATE KEY-----|\z)"),
    ("aws-access-key", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA)[0-9A-Z]{16}\b"),
    ("github-token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b"),
    ("gitlab-token", r"\bglpat-[A-Za-z0-9_-]{20,}"),
    ("slack-token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    ("google-api-key", r"\bAIza[0-9A-Za-z_-]{35}\b"),
    ("anthropic-key", r"\bsk-ant-[A-Za-z0-9_-]{20,}"),
    ("openai-key", r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}"),
    ("stripe-key", r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    ("aws-secret-key", r"(?i)(aws_secret_access_key\s{0,8}[:=]\s{0,8}[\"']?)[A-Za-z0-9/+=]{40}"),
    ("credential", r"(?i)(\b(?:password|passwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token)"
                   r"\s{0,8}[:=]\s{0,8}[\"']?)[^\s\"']{8,}"),
)


class InvalidPattern(ValueError):
    """A redaction pattern RE2 cannot compile (e.g. look-around or back-references)."""


def compile_pattern(pattern: str) -> re2._Regexp:
    try:
        return re2.compile(pattern)
    except re2.error as e:
        raise InvalidPattern(f"redaction pattern {pattern!r} is not RE2 syntax: {e}") from e


class Redactor:
    """Compiled once per policy; `redact` returns the cleaned text and how many secrets it removed."""

    def __init__(self, extra_patterns: Iterable[str] = ()):
        self._patterns = [(kind, compile_pattern(p)) for kind, p in BUILTIN_PATTERNS]
        self._patterns += [("policy", compile_pattern(p)) for p in extra_patterns]

    def redact(self, text: str) -> tuple[str, int]:
        total = 0
        for kind, pattern in self._patterns:
            keep = r"\1" if pattern.groups else ""
            text, n = pattern.subn(f"{keep}[REDACTED:{kind}]", text)
            total += n
        return text, total

    def redact_head(self, text: str, keep_chars: int) -> tuple[str, int]:
        """Redact first, then keep the head: a secret cut by the cap is still matched whole, never half-shown."""
        clean, n = self.redact(text)
        return clean[:keep_chars], n
