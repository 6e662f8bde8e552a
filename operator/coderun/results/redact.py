"""Secret redaction: key-like strings never reach the status, whatever the program printed."""
from __future__ import annotations

import re
from typing import Iterable

# (kind, pattern); a match is replaced by [REDACTED:kind]. Specific formats first, the generic one last.
BUILTIN_PATTERNS: tuple[tuple[str, str], ...] = (
    ("private-key", r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)"),
    ("aws-access-key", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA)[0-9A-Z]{16}\b"),
    ("github-token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b"),
    ("gitlab-token", r"\bglpat-[A-Za-z0-9_-]{20,}\b"),
    ("slack-token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b"),
    ("google-api-key", r"\bAIza[0-9A-Za-z_-]{35}\b"),
    ("anthropic-key", r"\bsk-ant-[A-Za-z0-9_-]{20,}"),
    ("openai-key", r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}"),
    ("stripe-key", r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}\b"),
    ("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    ("aws-secret-key", r"(?i)(?<=aws_secret_access_key)(\s*[:=]\s*[\"']?)[A-Za-z0-9/+=]{40}"),
    ("credential", r"(?i)\b(?:password|passwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token)"
                   r"(?=\s*[:=]\s*[\"']?[^\s\"']{8,})\s*[:=]\s*[\"']?[^\s\"']{8,}"),
)


class Redactor:
    """Compiled once per policy; `redact` returns the cleaned text and how many secrets it removed."""

    def __init__(self, extra_patterns: Iterable[str] = ()):
        self._patterns = [(kind, re.compile(p)) for kind, p in BUILTIN_PATTERNS]
        self._patterns += [("policy", re.compile(p)) for p in extra_patterns]

    def redact(self, text: str) -> tuple[str, int]:
        total = 0
        for kind, pattern in self._patterns:
            text, n = pattern.subn(f"[REDACTED:{kind}]", text)
            total += n
        return text, total
