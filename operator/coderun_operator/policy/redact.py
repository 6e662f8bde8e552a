r"""Secret redaction: key-like strings never reach the status, whatever the program printed.

Patterns run on RE2 (google-re2), which matches in time linear in the input: a program's output is hostile,
and a backtracking engine on a crafted string could stall the operator for minutes. RE2 has no look-around,
so a pattern that must keep a prefix captures it as group 1 and the replacement puts it back.

A policy's author is as hostile as a program's output: twelve characters (`\pL{300}`) compile to a third of a
million instructions and tens of MiB. Every pattern is compiled with a memory budget (RE2's max_mem, which
bounds the program and the DFA caches matching later fills) and a program-size cap; the policy loader adds a
budget for all of a policy's patterns together.
"""
from __future__ import annotations

import copy
from typing import Iterable

import re2

from coderun.egress.credential import TOKEN_PATTERN

# (kind, pattern); a match is replaced by [REDACTED:kind]. Specific formats first, the generic ones last.
BUILTIN_PATTERNS: tuple[tuple[str, str], ...] = (
    # A run's egress proxy credential (in HTTP_PROXY): still valid while the run's status is being written.
    ("coderun-egress-token", TOKEN_PATTERN),
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


# RE2's memory budget per pattern: its compiled program and the DFA states matching caches (beyond it RE2 falls
# back to its slower, still linear, NFA). The built-in patterns need a few KiB of program.
PATTERN_MAX_MEM = 128 * 1024
# Instructions one pattern may compile to (the program's share of max_mem allows ~5,000): \pL{4} is 4,788,
# the built-in patterns stay under 400.
PATTERN_MAX_PROGRAM = 5000
_OPTIONS = re2.Options()
_OPTIONS.max_mem = PATTERN_MAX_MEM
_OPTIONS.log_errors = False  # a refused pattern is reported to its author, not logged by RE2 on stderr


class InvalidPattern(ValueError):
    """A pattern RE2 cannot compile (look-around, back-references) or that is over the size budget."""


def compile_pattern(pattern: str) -> re2._Regexp:
    """The pattern compiled within the budget, or InvalidPattern saying what to change."""
    try:
        compiled = re2.compile(pattern, _OPTIONS)
    except re2.error as e:
        if "too large" in str(e):
            raise InvalidPattern(f"pattern {pattern[:64]!r} is too large (it compiles to more than RE2's "
                                 f"{PATTERN_MAX_MEM // 1024} KiB budget); use smaller repeat counts and "
                                 "narrower classes (\\pL{300} is 300 copies of every letter)") from None
        raise InvalidPattern(f"pattern {pattern[:64]!r} is not RE2 syntax: {e}; use RE2 syntax (no look-around, "
                             "no back-references)") from None
    if compiled.programsize > PATTERN_MAX_PROGRAM:
        raise InvalidPattern(f"pattern {pattern[:64]!r} is too large ({compiled.programsize} RE2 instructions, "
                             f"at most {PATTERN_MAX_PROGRAM}); use smaller repeat counts and narrower classes")
    return compiled


# Compiled once per process: the same twelve patterns for every policy.
_BUILTIN = tuple((kind, compile_pattern(p)) for kind, p in BUILTIN_PATTERNS)


# The set that says whether any of a redactor's patterns matches: its own budget, as a pattern's is.
ANY_OF_MAX_MEM = 2 * PATTERN_MAX_MEM
_ANY_OPTIONS = re2.Options()
_ANY_OPTIONS.max_mem = ANY_OF_MAX_MEM
_ANY_OPTIONS.log_errors = False


def _any_of(patterns: Iterable[re2._Regexp]) -> re2.Set | None:
    """Every pattern in one RE2 set, each compiled on its own (an alternation would not keep them apart: a
    policy's unterminated `\\Q` quotes every pattern after it): a text none of them matches, redaction leaves
    unchanged. None past the budget: each pattern is then tried in turn, as without it."""
    any_of = re2.Set.SearchSet(_ANY_OPTIONS)
    try:
        for pattern in patterns:
            any_of.Add(pattern.pattern)
        any_of.Compile()
    except re2.error:  # a pattern it refuses, or past the budget
        return None
    return any_of


_BUILTIN_ANY = _any_of(pattern for _, pattern in _BUILTIN)


class Redactor:
    """The built-in patterns and a policy's own; `redact` returns the cleaned text and how many secrets it removed.
    Built once per loaded policy (policy/load.py), so its patterns go when the policy goes."""

    def __init__(self, extra_patterns: Iterable[str | re2._Regexp] = ()):
        self._patterns = list(_BUILTIN) + [
            ("policy", p if isinstance(p, re2._Regexp) else compile_pattern(p)) for p in extra_patterns]
        self._any = _any_of(pattern for _, pattern in self._patterns) if len(self._patterns) > len(_BUILTIN) \
            else _BUILTIN_ANY
        self._again = False

    def again(self) -> Redactor:
        """The same patterns for text redacted once already (a reused result's): only what they newly remove
        counts, since the built-in patterns match their own [REDACTED:...] marks again, leaving the text as it was."""
        twin = copy.copy(self)
        twin._again = True
        return twin

    def redact(self, text: str) -> tuple[str, int]:
        clean, n = self._redact(text)
        return clean, (0 if self._again and clean == text else n)

    def _redact(self, text: str) -> tuple[str, int]:
        if self._any is not None and not self._any.Match(text):
            return text, 0  # most strings hold no secret: one pass, not one per pattern
        total = 0
        for kind, pattern in self._patterns:
            keep = r"\1" if pattern.groups else ""
            text, n = pattern.subn(f"{keep}[REDACTED:{kind}]", text)
            total += n
        return text, total
