"""The tool result text: how a model reads a run. Outcome first, then the error and its line, then the
streams with byte counts when they were cut."""
from __future__ import annotations

from typing import Any

from ..api.models import AuditStatus
from ..api.text import one_line, printable
from ..client.result import RunResult
from ..client.runtimes import RuntimeInfo


def _stream_section(label: str, text: str | None, total: int | None, truncated: bool | None) -> str | None:
    if not text and not truncated:
        return None
    shown = len((text or "").encode("utf-8"))
    size = f"{shown} of {total} bytes, truncated" if truncated else f"{total if total is not None else shown} bytes"
    return f"{label} ({size}):\n{(text or '').rstrip(chr(10))}"


def outcome_line(result: RunResult) -> str:
    """One line: how the run ended, in words a model (or a person) acts on (control characters escaped: the
    message can quote what the program printed)."""
    return one_line(_outcome(result))


def _outcome(result: RunResult) -> str:
    if result.rejected:
        rule = f", policy rule {result.policy_rule}" if result.policy_rule else ""
        return f"rejected ({result.reason}{rule}): {result.message}"
    if result.timed_out:
        limit = result.effective_limits.timeout_seconds if result.effective_limits else None
        return f"timed out{f' after {limit}s' if limit else ''}: the program was stopped (reason Timeout)"
    if result.reason == "OOMKilled":
        memory = result.effective_limits.memory if result.effective_limits else None
        return f"killed: out of memory{f' (limit {memory})' if memory else ''} (reason OOMKilled)"
    if result.infrastructure_failure:
        return f"platform failure ({result.reason}), not the program's fault; retrying may help: {result.message}"
    if not result.finished:
        return f"not finished yet (phase {result.phase or 'Pending'})"
    exit_part = f"exit code {result.exit_code}" if result.exit_code is not None else f"phase {result.phase}"
    return f"{exit_part} ({result.reason})" + (f": {result.message}" if not result.succeeded and result.message
                                               and result.reason != "NonZeroExit" else "")


def error_line(result: RunResult, code: str | None = None) -> str | None:
    """'error: KeyError at line 3: 'valeu'' plus the failing source line when the code is at hand."""
    if not result.error:
        return None
    where = f" at line {result.error.line}" if result.error.line else ""
    text = f"error: {result.error.type}{where}: {result.error.message}"
    if code and result.error.line:
        lines = code.splitlines()
        if 0 < result.error.line <= len(lines):
            text += f"\nfailing line {result.error.line}: {lines[result.error.line - 1].strip()}"
    return printable(text)


MAX_TOUCHED_CHARS = 400
MAX_TOUCHED_NAMES = 3


def touched_line(audit: AuditStatus | None) -> str | None:
    """One line of what the program touched (status.audit): `touched: 3 files read (data/visits.csv, ...), 1
    written (...), 1 connect attempt (10.96.0.1:443 timedOut), 2 processes`; or why that is unknown. None when
    the operator recorded no audit (the run never had a sandbox, or an operator without the audit)."""
    if audit is None:
        return None
    if audit.source != "gvisor-trace":
        return one_line(f"audit unavailable: {audit.message or 'no reason given'}")[:MAX_TOUCHED_CHARS]
    omitted = audit.omitted

    def files(rows, left_out: int | None, one: str, many: str) -> str | None:
        total = len(rows or ()) + (left_out or 0)
        if not total:
            return None
        return f"{_plural(total, one, many)} ({_names([f.path for f in rows or ()], total)})"

    parts = [files(audit.files_read, omitted and omitted.files_read, "file read", "files read"),
             files(audit.files_written, omitted and omitted.files_written, "file written", "files written")]
    counts = audit.counts
    connects = audit.connect_attempts or []
    if counts and counts.connect_attempts:
        shown = [f"{c.address}{f':{c.port}' if c.port is not None else ''} {c.result}" for c in connects]
        parts.append(f"{_plural(counts.connect_attempts, 'connect attempt', 'connect attempts')} "
                     f"({_names(shown, len(shown) + ((omitted and omitted.connect_attempts) or 0))})")
    if counts and counts.processes:
        parts.append(_plural(counts.processes, "process", "processes"))
    if counts and counts.failed_execs:
        parts.append(_plural(counts.failed_execs, "failed exec", "failed execs"))
    if audit.outside_workdir and audit.outside_workdir.denied:
        parts.append(f"{audit.outside_workdir.denied} denied outside the work dir")
    text = ", ".join(p for p in parts if p) or "nothing outside the runner"
    if not audit.complete:
        text += " (incomplete: the record missed the run's end)"
    line = one_line(f"touched: {text}")
    return line if len(line) <= MAX_TOUCHED_CHARS else line[:MAX_TOUCHED_CHARS - 1] + "…"


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _names(names: list[str], total: int) -> str:
    shown = names[:MAX_TOUCHED_NAMES]
    more = total > len(shown)
    return ", ".join(shown) + (", ..." if more and shown else "..." if more else "")


def render_result(result: RunResult, code: str | None = None) -> str:
    """The tool result text for a model: compact, outcome first, nothing the model cannot act on."""
    parts = [outcome_line(result), error_line(result, code),
             _stream_section("stdout", result.stdout, result.stdout_bytes, result.stdout_truncated),
             _stream_section("stderr", result.stderr, result.stderr_bytes, result.stderr_truncated)]
    if result.artifacts:
        parts.append(one_line("artifacts: " + ", ".join(f"{a.name} ({a.size} bytes)" for a in result.artifacts)))
    if result.skipped_line:  # the run may say Succeeded while output was dropped: a model must hear it
        parts.append(one_line(result.skipped_line))
    if result.validation and not result.validation.valid:
        parts.append(printable("output validation failed: " + "; ".join(result.validation.errors)))
    parts.append(touched_line(result.audit))
    if result.finished and not (result.stdout or result.stderr or result.rejected):
        parts.append("(no output)")
    return "\n".join(p for p in parts if p)


def render_runtimes(runtimes: list[RuntimeInfo]) -> str:
    """One line per language, then what the policy says beyond limits (the same for every language)."""
    lines = [f"{r.language}: image {r.image} ({r.runtime_class}); default limits {_limits(r.default_limits)}; "
             f"maximum {_limits(r.maximum_limits)}" for r in runtimes]
    if runtimes:
        first = runtimes[0]
        network = "egress to " + ", ".join(first.egress) if first.egress else "no network"
        extra = [f"policy {first.policy}", network, f"approval {first.approval}"]
        if first.max_concurrent_runs:
            extra.append(f"at most {first.max_concurrent_runs} concurrent runs")
        lines.append("; ".join(extra))
    return "\n".join(lines)


def _limits(limits: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in limits.items())
