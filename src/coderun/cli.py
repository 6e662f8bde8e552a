"""`coderun` and `kubectl coderun`: run a script in the sandbox and exit with its exit code; get, list, read and
delete runs the way kubectl does.

Thin over the SDK: argument parsing and printing here, decisions in small pure functions (exit_code_for,
summary_line, parse_duration, run_name, runs_table, terminal_text) that the unit tests cover. Everything that
can be refused without the cluster is refused before the kubeconfig is read (check_args), so a usage error
exits 2 with the usage wherever the CLI runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import textwrap
import threading
import time
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Sequence, TextIO

import shtab
import yaml
from pydantic import ValidationError

from . import __version__
from .api.coderunsession import SESSION_KIND
from .api.identity import APPROVED_BY, REJECTED_BY
from .api.models import GROUP, KIND, PLURAL, SHORT_NAME, InputRef, Limits
from .api.reasons import Reason, SessionReason
from .api.text import one_line, printable
from .client import (CodeRunClient, CodeRunError, PolicyDenied, RunNotFound, RunRejected, RunRequest, RunResult,
                     RunTimeout)
from .client.errors import describe_invalid, upload_failed_for
from .client.inputs import Upload, split_files, with_inputs
from .client.sessions import SESSION_READY_WAIT_SECONDS, SessionEnded, SessionInfo, SessionNotReady, session_spec
from .client.request import sandbox_path
from .client.sync import default_wait_seconds
from .tools import outcome_line, render_runtimes, touched_line

# Exit codes. A program's own exit code passes through unchanged (0-255), so these can collide with it;
# `run -o json` and `get -o json` tell them apart when that matters.
EXIT_NOT_FOUND = 1         # get, logs, delete, runtimes --policy: no such object (kubectl's code for NotFound)
EXIT_USAGE = 2             # bad arguments or unreadable local files, refused before the kubeconfig is read
EXIT_REJECTED = 3          # the policy or the spec check refused the run (phase Rejected)
EXIT_PLATFORM = 4          # the platform failed (pod deleted, unschedulable, internal error) or the API did
EXIT_NOT_FINISHED = 5      # the run had not finished: --wait-timeout ran out (logs: or no --wait was given)
EXIT_OUTPUT_LIMIT = 6      # the program flooded its output and was stopped (OutputLimitExceeded)
EXIT_TIMEOUT = 124         # the program hit its own time limit (like coreutils timeout)
EXIT_OOM = 137             # the program ran out of memory (128 + SIGKILL, like a shell)
EXIT_INTERRUPTED = 130     # Ctrl-C
EXIT_BROKEN_PIPE = 141     # stdout's reader went away (`coderun list | head`), like a shell's SIGPIPE

RESULT_COMMANDS = ("run", "logs")    # exit with the run's outcome
ALL_COMMANDS = ("run", "logs", "get", "list", "delete", "approve", "reject", "artifacts", "runtimes", "session",
                "completion", "mcp")
# `mcp` serves: its failures are its own
API_COMMANDS = ("run", "logs", "get", "list", "delete", "approve", "reject", "artifacts", "runtimes", "session")
# (code, meaning, the commands that exit with it): the one source of every --help epilog and of docs/agents.md.
EXIT_CODES: list[tuple[str, str, tuple[str, ...]]] = [
    ("0-255", "the program's own exit code (0: it succeeded)", RESULT_COMMANDS),
    ("0", "done", ("get", "list", "delete", "approve", "reject", "artifacts", "runtimes", "session", "completion",
                   "mcp")),
    (str(EXIT_NOT_FOUND), "no such run (artifacts: or no such artifact; runtimes: no such policy; session: no such "
                          "session), as kubectl's NotFound", ("get", "logs", "delete", "approve", "reject",
                                                              "artifacts", "runtimes", "session")),
    (str(EXIT_USAGE), "bad arguments or an unreadable local file, said before any configuration is read",
     ALL_COMMANDS),
    (str(EXIT_REJECTED), "rejected by policy or spec check (PolicyDenied, InvalidSpec; run --session: the session "
                         "ended; session create: its policy refused it)", (*RESULT_COMMANDS, "session")),
    (str(EXIT_PLATFORM), "platform or API failure (PodDeleted, Unschedulable, InternalError; no usable "
                         "kubeconfig, API or data service unreachable or refusing; an upload or an artifact "
                         "refused; approve/reject: refused by the API server, which says why)", API_COMMANDS),
    (str(EXIT_NOT_FINISHED), "the run had not finished: --wait-timeout ran out (logs: or no --wait; session create: "
                             "the session was not ready)", (*RESULT_COMMANDS, "session")),
    (str(EXIT_OUTPUT_LIMIT), "output flood stopped (OutputLimitExceeded)", RESULT_COMMANDS),
    (str(EXIT_TIMEOUT), "the program's own time limit (--timeout) was hit", RESULT_COMMANDS),
    ("128+N", "killed by signal N", RESULT_COMMANDS),
    (str(EXIT_INTERRUPTED), "interrupted (Ctrl-C)", API_COMMANDS),
    (str(EXIT_OOM), "out of memory (--memory)", RESULT_COMMANDS),
    (str(EXIT_BROKEN_PIPE), "the reader of our output went away (a closed pipe, as SIGPIPE)", ALL_COMMANDS),
]
COLLISION_NOTE = ("A program's exit code can collide with these; `run -o json` or `get NAME -o json` shows "
                  "reason and exitCode.")


def exit_codes_help(command: str | None = None) -> str:
    """The epilog of `command`'s --help (of the top level when None: every code, with its commands)."""
    rows = [(code, meaning if command else f"{meaning} [{', '.join(commands)}]")
            for code, meaning, commands in EXIT_CODES if command is None or command in commands]
    text = f"exit codes{f' of `{command}`' if command else ''}:\n" + "\n".join(
        f"  {code:<6} {meaning}" for code, meaning in rows)
    return text + ("\n" + COLLISION_NOTE if command in (None, *RESULT_COMMANDS) else "")


def exit_codes_markdown() -> str:
    """The table docs/agents.md carries (a unit test keeps the two equal)."""
    return "\n".join(["| code | meaning | commands |", "| --- | --- | --- |"] + [
        f"| {code} | {meaning} | {', '.join(commands)} |" for code, meaning, commands in EXIT_CODES])


OUTPUTS = {"run": ("text", "json", "yaml"), "get": ("text", "json", "yaml"),
           "list": ("text", "json", "yaml", "wide", "name")}
LANGUAGE_BY_SUFFIX = {".py": "python", ".js": "javascript", ".cjs": "javascript"}
RESOURCE = f"{KIND.lower()}.{GROUP}"   # kubectl's -o name prefix: coderun.coderun.io/NAME
SESSION_RESOURCE = f"{SESSION_KIND.lower()}.{GROUP}"
_RESOURCE_ALIASES = {KIND.lower(), PLURAL, SHORT_NAME, RESOURCE, f"{PLURAL}.{GROUP}"}
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class UsageError(Exception):
    pass


# ---- pure decisions
def exit_code_for(result: RunResult) -> int:
    """The process exit code that mirrors a run (EXIT_NOT_FINISHED while it has not ended)."""
    if result.rejected:
        return EXIT_REJECTED
    if not result.finished:
        return EXIT_NOT_FINISHED
    special = {Reason.TIMEOUT: EXIT_TIMEOUT, Reason.OOM_KILLED: EXIT_OOM,
               Reason.OUTPUT_LIMIT_EXCEEDED: EXIT_OUTPUT_LIMIT}
    if result.reason in special:
        return special[result.reason]
    if result.exit_code is not None:
        return result.exit_code
    if result.reason == Reason.SIGNALED and result.signal:
        return 128 + result.signal
    return 0 if result.succeeded else EXIT_PLATFORM


def summary_line(result: RunResult) -> str:
    """`coderun: run-x7k2p exit code 0 (Completed) · wall 96ms · total 2.2s`, one line for stderr."""
    parts = [f"coderun: {result.name + ' ' if result.name else ''}{outcome_line(result)}"]
    if result.error:
        parts.append(f"{result.error.type}" + (f" at line {result.error.line}" if result.error.line else ""))
    metrics = result.metrics
    if metrics and metrics.wall_millis is not None:
        parts.append(f"wall {metrics.wall_millis}ms")
    if metrics and metrics.total_millis is not None:
        parts.append(f"total {metrics.total_millis / 1000:.1f}s")
    for stream in ("stdout", "stderr"):
        if getattr(result, f"{stream}_truncated"):
            parts.append(f"{stream} truncated ({len((getattr(result, stream) or '').encode())} of "
                         f"{getattr(result, f'{stream}_bytes')} bytes shown)")
    if result.artifacts:
        parts.append(f"{len(result.artifacts)} artifact(s): " + ", ".join(a.name for a in result.artifacts))
    if result.skipped_line:
        parts.append(result.skipped_line)
    if result.cached_from:
        parts.append(f"cached from {result.cached_from}")
    return one_line(" · ".join(parts))  # names, types and messages come from the program or other callers


_DURATION = re.compile(r"(?:\d+(?:\.\d+)?(?:h|ms|m|s))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str) -> float:
    """Seconds from a duration as kubectl takes them (90s, 5m, 1h, 1h30m, 1.5h, 500ms) or a plain number of
    seconds (90, 2.5)."""
    text = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    if not _DURATION.fullmatch(text):
        raise ValueError(f"invalid duration {text!r}: use seconds (90) or a number with a unit: 90s, 5m, 1h, 1h30m")
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in _DURATION_PART.findall(text))


def _argparse_type(convert):
    """An argparse `type` whose ValueError message is the one argparse prints (after `argument --x:`)."""
    def checked(text: str):
        try:
            return convert(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    checked.__name__ = convert.__name__
    return checked


@_argparse_type
def program_seconds(text: str) -> int:
    """--timeout: the program's own limit, whole seconds (the spec's timeoutSeconds)."""
    seconds = parse_duration(text)
    if seconds < 1 or seconds != int(seconds):
        raise ValueError(f"{text!r} is not a whole number of seconds of at least 1 (e.g. 30, 90s, 5m)")
    return int(seconds)


@_argparse_type
def wait_seconds(text: str) -> float:
    """--wait-timeout: how long this CLI waits, any positive duration."""
    seconds = parse_duration(text)
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a positive duration (e.g. 90s, 5m)")
    return seconds


@_argparse_type
def run_name(text: str) -> str:
    """A run as kubectl names it: NAME, crun/NAME, coderun/NAME or coderun.coderun.io/NAME (what -o name prints)."""
    resource, slash, name = text.rpartition("/")
    if slash and resource.lower() not in _RESOURCE_ALIASES:
        raise ValueError(f"{text!r} is not a CodeRun: give NAME, {SHORT_NAME}/NAME or {RESOURCE}/NAME")
    if not name:
        raise ValueError(f"{text!r} names no run")
    return name


def parse_file_arg(arg: str) -> tuple[str, Path]:
    """`data.csv` lands as data.csv; `in/data.csv=../local/x.csv` or `../local/x.csv:in/data.csv` picks the
    sandbox path (a local file whose own name has a colon is taken whole)."""
    if "=" in arg:
        dest, local = arg.split("=", 1)
        return dest, Path(local)
    if ":" in arg and not Path(arg).exists():
        local, _, dest = arg.rpartition(":")
        return dest, Path(local)
    return sandbox_path(arg), Path(arg)


def parse_input_arg(arg: str) -> dict[str, Any]:
    """`--input [DEST=]SOURCE`, SOURCE as status.inputs names it: s3://BUCKET/KEY or run/RUN/ARTIFACT; it lands
    as DEST, else as the base name of the key or artifact."""
    dest, equals, source = arg.partition("=")
    if not equals or "://" in dest or dest.startswith("run/"):
        dest, source = "", arg
    if source.startswith("s3://"):
        bucket, _, key = source[len("s3://"):].partition("/")
        ref: dict[str, Any] = {"s3": {"bucket": bucket, "key": key}}
    elif source.startswith("run/"):
        run, _, key = source[len("run/"):].partition("/")
        ref = {"artifact": {"run": run, "name": key}}
    else:
        key = ""
    if not key:
        raise UsageError(f"--input {arg!r}: give [DEST=]s3://BUCKET/KEY or [DEST=]run/RUN/ARTIFACT")
    return {"path": dest or sandbox_path(key), **ref}


def parse_labels(pairs: Sequence[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"label {pair!r} must be key=value")
        labels[key] = value
    return labels


def human_age(seconds: float) -> str:
    """kubectl's AGE column (HumanDuration): 42s, 5m3s, 17m, 3h12m, 20h, 2d4h, 45d, 3y20d."""
    s = max(0, int(seconds))
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m" + (f"{s % 60}s" if s % 60 else "")
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h" + (f"{minutes % 60}m" if minutes % 60 else "")
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{days}d" + (f"{hours % 24}h" if hours % 24 else "")
    if days < 365 * 2:
        return f"{days}d"
    if days < 365 * 8:
        return f"{days // 365}y" + (f"{days % 365}d" if days % 365 else "")
    return f"{days // 365}y"


def runs_table(results: Sequence[RunResult], *, now: datetime, wide: bool = False,
               all_namespaces: bool = False) -> str:
    """`coderun list`: the columns of `kubectl get crun` (NAMESPACE with -A; POD, START, POLICY with -o wide)."""
    def age(result: RunResult) -> str:
        if not result.created_at:
            return "<unknown>"
        created = datetime.fromisoformat(result.created_at.replace("Z", "+00:00"))
        return human_age((now - created).total_seconds())

    header = ["NAME", "PHASE", "REASON", "EXIT", "DURATION-MS", "AGE"] + (["POD", "START", "POLICY"] if wide else [])
    rows = [header]
    for r in results:
        total = r.metrics.total_millis if r.metrics else None
        row = [r.name, r.phase or "", r.reason or "", "" if r.exit_code is None else str(r.exit_code),
               "" if total is None else str(total), age(r)]
        if wide:
            row += [r.pod_name or "", r.start_mode or "", r.policy or ""]
        rows.append(row)
    if all_namespaces:
        rows = [["NAMESPACE"] + rows[0]] + [[r.namespace] + row for r, row in zip(results, rows[1:])]
    rows = [[one_line(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) + all_namespaces)]
    return "\n".join("   ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def result_document(result: RunResult) -> dict[str, Any]:
    """The camelCase result as `-o json|yaml` prints it; a run refused at creation has no name (none exists)."""
    document = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    if not result.name:
        document.pop("name", None)
        document.pop("labels", None)
    return document


def refused_at_creation(namespace: str, reason: str, message: str, rule: str | None = None) -> RunResult:
    """The result of a run the API server refused to create (the policy's webhook, or the schema): Rejected,
    like a run the operator refused, so `-o json` and the exit code read the same either way."""
    return RunResult(name="", namespace=namespace, phase="Rejected", reason=reason, message=message,
                     policy_rule=rule)


# ---- terminal safety
def terminal_text(text: str, stream: TextIO, raw: bool) -> str:
    """What a program printed, made safe for `stream`: on a terminal every control and format character but
    newline and tab is shown as a visible escape (ESC as \\x1b, CSI 0x9b, OSC 52 and 8, bidi overrides, CR,
    BEL), so the program cannot drive the terminal; into a pipe or a file, or with --raw, unchanged."""
    return text if raw or not stream.isatty() else printable(text)


def _printable_document(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {k: _printable_document(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable_document(v) for v in value]
    return value


def write_document(document: Any, output: str, out: TextIO, raw: bool = False) -> None:
    """JSON escapes every control character itself (and everything outside ASCII); YAML writes bidi overrides
    and NEL as they are, so on a terminal its strings are shown with visible escapes like the text output."""
    if output == "json":
        out.write(json.dumps(document, indent=2) + "\n")
        return
    if not raw and out.isatty():
        document = _printable_document(document)
    out.write(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))


def write_streams(result: RunResult, out: TextIO, err: TextIO, raw: bool = False) -> None:
    """The program's stdout, then its stderr, each made safe for where it goes."""
    out.write(terminal_text(result.stdout or "", out, raw))
    out.flush()
    err.write(terminal_text(result.stderr or "", err, raw))
    if result.stderr and not result.stderr.endswith("\n"):
        err.write("\n")


def print_result(result: RunResult, output: str, out: TextIO, err: TextIO, raw: bool = False) -> None:
    if output == "text":
        write_streams(result, out, err, raw)
        for line in filter(None, [*input_lines(result), touched_line(result.audit)]):
            # before the verdict: the last line stays what a script reads for how the run ended
            err.write(f"coderun: {line}\n")
        err.write(summary_line(result) + "\n")
    else:
        write_document(result_document(result), output, out, raw)


def input_lines(result: RunResult) -> list[str]:
    """One line per input by reference as the run got it: where the program found it, size, sha256, source."""
    return [one_line(f"input {i.path}: {i.size} bytes, sha256 {i.sha256}, from {i.source}")
            for i in result.inputs or ()]


# ---- reading the inputs
def _read_local(path: Path | str, what: str) -> bytes:
    try:
        return sys.stdin.buffer.read() if str(path) == "-" else Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror}") from e


def build_request(args: argparse.Namespace) -> tuple[RunRequest, list[Upload]]:
    """The request (with the files small enough to go in the spec) and the files to upload (the others: read
    again, streamed, when the run asks for them)."""
    if args.code is not None:
        code, language = args.code, args.language or "python"
    elif args.script:
        if args.script == "-" and args.stdin == "-":
            raise UsageError("the script and --stdin cannot both come from standard input")
        code = _read_local(args.script, "script").decode("utf-8", "replace")
        language = args.language or LANGUAGE_BY_SUFFIX.get(Path(args.script).suffix, "python")
    else:
        raise UsageError("give a script file (or - for standard input), or -c CODE")
    stdin = _read_local(args.stdin, "--stdin").decode("utf-8", "replace") if args.stdin else None
    local_files: list[tuple[str, bytes | Path]] = []
    for dest, local in map(parse_file_arg, args.file):
        if str(local) != "-":
            try:
                with local.open("rb"):
                    pass  # readable now; a large one is read when it is uploaded, streamed
            except OSError as e:
                raise UsageError(f"cannot read file {local}: {e.strerror}") from e
        local_files.append((dest, _read_local(local, "file") if str(local) == "-" else local))
    try:
        inline, uploads = split_files(local_files, code=code, stdin=stdin)
    except CodeRunError as e:  # a file that vanished or is too large for any policy
        raise UsageError(str(e)) from e
    return RunRequest(code=code, language=language, files=inline or None, stdin=stdin,
                      timeout=args.timeout), uploads


def input_refs_of(args: argparse.Namespace) -> list[InputRef]:
    return [InputRef.model_validate(parse_input_arg(arg)) for arg in args.input]


def check_args(args: argparse.Namespace) -> None:
    """Everything that can be refused without the cluster, refused before connecting to it (UsageError), and
    the inputs read and typed on `args`: -o for this command, labels, and for `run` the request and limits."""
    output = getattr(args, "output", None)
    if output is not None and output not in OUTPUTS.get(args.command, ()):
        allowed = OUTPUTS.get(args.command)
        raise UsageError(f"-o {output} does not apply to {args.command}" +
                         (f" (choose from {', '.join(allowed)})" if allowed else ""))
    args.output = output or "text"
    if hasattr(args, "label"):
        args.labels = parse_labels(args.label)
    if args.command == "run":
        if args.session and (args.memory or args.cpu):
            raise UsageError("--memory and --cpu are the session's, not a run's: give them to `coderun session "
                             "create`")
        try:
            args.request, args.uploads = build_request(args)
            args.limits = Limits(memory=args.memory, cpu=args.cpu)
            # a path named twice, too many inputs: said before the cluster is asked
            args.spec = with_inputs(args.request.to_spec(args.limits), input_refs_of(args), args.uploads)
        except ValidationError as e:  # a bad --memory, --timeout or file path, named by field
            raise UsageError(f"invalid input: {describe_invalid(e)}") from e
        except CodeRunError as e:  # an input path named twice
            raise UsageError(str(e)) from e
    if args.command == "artifacts" and args.artifacts_command == "get":
        args.dest = artifact_destination(args.artifact, args.dest)
        if args.dest != "-" and not Path(args.dest).resolve().parent.is_dir():
            raise UsageError(f"cannot write {args.dest}: its directory does not exist")
    if args.command == "session" and args.session_command == "create":
        try:
            args.session_spec = session_spec(args.language, policy=args.policy, keep_state=args.keep_state,
                                             limits=Limits(memory=args.memory, cpu=args.cpu, disk=args.disk),
                                             idle_timeout=args.idle_timeout, max_lifetime=args.max_lifetime)
        except ValidationError as e:
            raise UsageError(f"invalid input: {describe_invalid(e)}") from e


# ---- the commands
class Progress:
    """A spinner with the run's phase and elapsed time on stderr, only when stderr is a terminal."""

    def __init__(self, stream: TextIO, label: str):
        self.stream, self.label, self.phase = stream, label, "Pending"
        self.enabled = stream.isatty()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def update(self, result: RunResult) -> None:
        self.phase = (result.phase or "Pending") + (", uploading inputs" if result.upload else "")

    def _spin(self) -> None:
        started, frame = time.monotonic(), 0
        while not self._done.wait(0.1):
            self.stream.write(f"\r{SPINNER[frame % len(SPINNER)]} {self.label} {self.phase} "
                              f"{time.monotonic() - started:.1f}s\033[K")
            self.stream.flush()
            frame += 1

    def __enter__(self) -> "Progress":
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self._done.set()
            self._thread.join()
            self.stream.write("\r\033[K")
            self.stream.flush()


def cmd_run(client: CodeRunClient, args: argparse.Namespace) -> int:
    spec = args.spec
    if args.session:
        spec = spec.model_copy(update={"session": args.session})
    try:
        created = client.create(spec, labels=args.labels)
    except PolicyDenied as e:  # the namespace's policy refused it at creation (admission: Enforce)
        refused = refused_at_creation(client.namespace, "PolicyDenied", e.message, e.rule)
    except CodeRunError as e:
        over = client.open_session(args.session).why_over() if args.session else None
        if over is not None:  # the API server refuses a run naming an ended session: say how it ended
            refused = refused_at_creation(client.namespace, "SessionEnded", str(over))
        elif e.status == 422:
            refused = refused_at_creation(client.namespace, "InvalidSpec", e.message)  # the CRD's schema or CEL rules
        else:
            raise
    else:
        refused = None
    if refused is not None:
        print_result(refused, args.output, sys.stdout, sys.stderr)
        return exit_code_for(refused)
    try:
        with Progress(sys.stderr, created.name) as progress:
            wait_timeout = args.wait_timeout or default_wait_seconds(args.request.timeout)
            try:
                client.send_uploads(created, args.uploads, timeout=wait_timeout, on_update=progress.update)
            except RunRejected:
                pass  # the wait below returns the refused run, printed as any refusal
            except (RunTimeout, RunNotFound):
                raise
            except CodeRunError as e:  # the upload's failure (the run is deleted below unless --keep)
                raise upload_failed_for(e, created.name) if not args.keep else e
            result = client.wait(created.name, timeout=wait_timeout, on_update=progress.update)
        print_result(result, args.output, sys.stdout, sys.stderr, raw=args.raw)
        return exit_code_for(result)
    except RunTimeout as e:
        kept = (f"it is kept: `coderun logs -f {created.name}` waits for it" if args.keep else
                "it is deleted (--keep keeps it)")
        print(one_line(f"coderun: {e.advised(f'--wait-timeout to wait longer; {kept}')}"), file=sys.stderr)
        return EXIT_NOT_FINISHED
    except KeyboardInterrupt:
        print(f"coderun: interrupted; {created.name} " + ("kept" if args.keep else "deleted"), file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if not args.keep:
            client.delete(created.name)


def cmd_get(client: CodeRunClient, args: argparse.Namespace) -> int:
    result = client.get(args.name)
    if args.output == "text":
        print(summary_line(result))
    else:
        write_document(result_document(result), args.output, sys.stdout)
    return 0


def cmd_logs(client: CodeRunClient, args: argparse.Namespace) -> int:
    if args.wait:
        try:
            with Progress(sys.stderr, args.name) as progress:
                result = client.wait(args.name, timeout=args.wait_timeout or math.inf, on_update=progress.update)
        except RunTimeout as e:
            print(one_line(f"coderun: {e.advised('it may still finish: wait again, with a longer --wait-timeout')}"),
                  file=sys.stderr)
            return EXIT_NOT_FINISHED
    else:
        result = client.get(args.name)
    if not result.finished:
        print(one_line(f"coderun: {result.name} has not finished (phase {result.phase or 'Pending'}); its output "
                       f"is in the status when it ends: wait for it with --wait"), file=sys.stderr)
        return EXIT_NOT_FINISHED
    write_streams(result, sys.stdout, sys.stderr, raw=args.raw)
    if result.exit_code is None:  # the program did not exit by itself: say why (rejected, timeout, platform)
        print(summary_line(result), file=sys.stderr)
    return exit_code_for(result)


def cmd_list(client: CodeRunClient, args: argparse.Namespace) -> int:
    results = client.list(labels=args.labels, mine=args.mine, all_namespaces=args.all_namespaces)
    if args.output in ("json", "yaml"):
        write_document({"items": [result_document(r) for r in results]}, args.output, sys.stdout)
    elif args.output == "name":
        for result in results:
            print(f"{RESOURCE}/{one_line(result.name)}")
    elif not results:
        where = "any namespace" if args.all_namespaces else f"{client.namespace} namespace"
        print(one_line(f"No resources found in {where}."), file=sys.stderr)  # kubectl's words
    else:
        print(runs_table(results, now=datetime.now(timezone.utc), wide=args.output == "wide",
                         all_namespaces=args.all_namespaces))
    return 0


def cmd_delete(client: CodeRunClient, args: argparse.Namespace) -> int:
    missing = False
    for name in args.names:
        if client.delete(name):
            print(f'{RESOURCE} "{name}" deleted')
        elif not args.ignore_not_found:
            print(f'coderun: {RESOURCE} "{name}" not found in namespace {one_line(client.namespace)}',
                  file=sys.stderr)
            missing = True
    return EXIT_NOT_FOUND if missing else 0


def cmd_decide(client: CodeRunClient, args: argparse.Namespace) -> int:
    """approve / reject: the verdict recorded under this identity's own username (the API server checks it)."""
    verdict = "approved" if args.command == "approve" else "rejected"
    for name in args.names:
        client.decide(name, args.command == "approve")
        print(f'{RESOURCE} "{name}" {verdict}')
    return 0


def artifacts_table(result: RunResult) -> str:
    """`coderun artifacts list`: each artifact's name, size, sha256 and where it is kept."""
    rows = [["NAME", "SIZE", "SHA256", "WHERE"]] + [
        [one_line(a.name), str(a.size), one_line(a.sha256), "stored" if a.stored else "inline"]
        for a in result.artifacts or ()]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("   ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def artifact_destination(name: str, dest: str | None) -> str:
    """Where `artifacts get` writes: -o's path (- for stdout), else the artifact's base name in the current dir."""
    chosen = dest or PurePosixPath(name).name
    if chosen in ("", ".", ".."):
        raise UsageError(f"artifact {name!r} has no file name to write to: give -o PATH")
    return chosen


def cmd_artifacts(client: CodeRunClient, args: argparse.Namespace) -> int:
    """list: the run's artifacts (and what it did not keep, on stderr); get: one artifact's bytes, checked against
    the run's record, into a file or to stdout."""
    result = client.get(args.name)
    skipped = result.skipped_line
    if args.artifacts_command == "list":
        if result.artifacts:
            print(artifacts_table(result))
        else:
            print(one_line(f"coderun: run {result.name} has no artifacts"), file=sys.stderr)
        if skipped:
            print(one_line(f"coderun: {skipped}"), file=sys.stderr)
        return 0
    if not any(a.name == args.artifact for a in result.artifacts or ()):
        offered = ", ".join(a.name for a in result.artifacts or ()) or "none"
        print(one_line(f"coderun: run {result.name} has no artifact {args.artifact!r} (artifacts: {offered})"
                       + (f"; {skipped}" if skipped else "")), file=sys.stderr)
        return EXIT_NOT_FOUND
    dest = args.dest  # check_args chose it and saw its directory
    if dest == "-" and sys.stdout.isatty():  # the program's bytes could drive the terminal (see terminal_text)
        return usage_error(args.command_parser, "standard output is a terminal: pipe it, or give -o PATH")
    if dest == "-":  # checked whole before a byte is written: a reader never gets bytes the run did not make
        sys.stdout.buffer.write(client.artifact(result, args.artifact))
        sys.stdout.flush()
        return 0
    written = client.artifact(result, args.artifact, path=dest)
    print(one_line(f"coderun: wrote {written} ({written.stat().st_size} bytes, sha256 checked)"), file=sys.stderr)
    return 0


def cmd_runtimes(client: CodeRunClient, args: argparse.Namespace) -> int:
    print(render_runtimes(client.runtimes(policy=args.policy)))
    return 0


def cmd_session(client: CodeRunClient, args: argparse.Namespace) -> int:
    """create: print the new session's name as kubectl does; get: its summary; delete: as `delete` for runs."""
    if args.session_command == "create":
        session = client.create_session(args.session_spec, name=args.name)
        if not args.no_wait:
            try:
                session.wait_ready(args.wait_timeout or SESSION_READY_WAIT_SECONDS)
            except SessionEnded as e:  # refused by its policy, or its sandbox could not start: it takes no runs
                session.delete()
                refused = e.info.reason in (SessionReason.POLICY_DENIED, SessionReason.INVALID_SPEC)
                print(one_line(f"coderun: {SESSION_RESOURCE}/{session.name} "
                               + ("refused" if refused else "could not start")
                               + f" ({e.info.reason}): {e.info.message}; it is deleted"), file=sys.stderr)
                return EXIT_REJECTED if refused else EXIT_PLATFORM
            except SessionNotReady as e:
                print(one_line(f"coderun: {e}; it is kept (it may still start): `coderun session get "
                               f"{session.name}`, or delete it"), file=sys.stderr)
                return EXIT_NOT_FINISHED
        print(f"{SESSION_RESOURCE}/{one_line(session.name)} created")
        return 0
    if args.session_command == "get":
        print(session_line(client.open_session(args.name).info()))
        return 0
    missing = False
    for name in args.names:
        if client.open_session(name).delete():
            print(f'{SESSION_RESOURCE} "{name}" deleted')
        else:
            print(f'coderun: {SESSION_RESOURCE} "{name}" not found in namespace {one_line(client.namespace)}',
                  file=sys.stderr)
            missing = True
    return EXIT_NOT_FOUND if missing else 0


def session_line(info: SessionInfo) -> str:
    """One line for `coderun session get`: where the session stands and until when."""
    parts = [f"{info.name}: {info.phase or 'Pending'}" + (f" ({info.reason})" if info.reason else ""),
             f"{info.runs_done or 0} runs done"]
    if info.pod_name:
        parts.append(f"pod {info.pod_name}")
    if info.phase == "Ended":
        parts.append(info.message or "")
    elif info.idle_expires_at or info.expires_at:
        parts.append(f"ends at {min(t for t in (info.idle_expires_at, info.expires_at) if t)} unless a run comes")
    return one_line("; ".join(p for p in parts if p))


def cmd_completion(args: argparse.Namespace) -> int:
    print(shtab.complete(build_parser("coderun"), shell=args.shell))
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        from .mcp_server import serve
    except ImportError as e:
        print(f"coderun: the MCP server needs the mcp extra: pip install 'coderun[mcp]' ({e})", file=sys.stderr)
        return EXIT_USAGE
    serve(transport=args.transport, host=args.host, port=args.port, namespace=args.namespace,
          kubeconfig=args.kubeconfig, context=args.context, progress_seconds=args.progress_interval)
    return 0


# ---- the parser
# Run names for completion come from the cluster: the shell runs `coderun list -o name` in the current context.
RUN_NAMES = shtab.cmd("coderun list -o name 2>/dev/null | cut -d/ -f2-")


def _add_global_flags(parser: argparse.ArgumentParser, default: Any, outputs: Sequence[str] | None) -> None:
    """-n, --kubeconfig, --context (and -o where it applies) on the top level and on every command, as kubectl
    takes them before or after the command. A command's copies default to SUPPRESS, so a value given before
    the command is not overwritten by the command's default."""
    group = parser.add_argument_group("global options (before or after the command)")
    group.add_argument("-n", "--namespace", default=default,
                       help="namespace (default: the kubeconfig context's, or in-cluster)")
    group.add_argument("--kubeconfig", default=default,
                       help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)").complete = shtab.FILE
    group.add_argument("--context", default=default, help="kubeconfig context")
    if outputs:
        group.add_argument("-o", "--output", choices=outputs, default=argparse.SUPPRESS,
                           help=f"output format: {', '.join(outputs)} (default text)")


def _add_run_names(parser: argparse.ArgumentParser, dest: str = "name", **kwargs: Any) -> None:
    """The positional run name(s) of get, logs and delete: kubectl's forms, completed from the cluster."""
    parser.add_argument(dest, type=run_name, help="NAME, crun/NAME or coderun.coderun.io/NAME",
                        **kwargs).complete = RUN_NAMES


def _command(commands: Any, name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
    description = textwrap.fill(description or help[:1].upper() + help[1:] + ".", 100)  # the formatter is raw
    sub = commands.add_parser(name, help=help, description=description,
                              epilog=exit_codes_help(name), formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_global_flags(sub, argparse.SUPPRESS, OUTPUTS.get(name))
    sub.set_defaults(command_parser=sub)
    return sub


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Run code in coderun's gVisor sandbox on Kubernetes.",
                                     epilog=exit_codes_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_global_flags(parser, None, sorted({o for outputs in OUTPUTS.values() for o in outputs}))
    parser.set_defaults(command_parser=parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    raw_help = ("write the program's output as it is to a terminal too (by default control characters are shown "
                "as escapes there, so the program cannot drive the terminal; pipes and files always get it as is)")

    run = _command(commands, "run", "run a script and exit with its exit code",
                   "Prints the program's stdout, then its stderr (to stderr), then a one-line summary (to stderr). "
                   "The CodeRun is deleted afterwards unless --keep. Durations take seconds or a unit: 90, 90s, "
                   "5m, 1h30m.")
    run.add_argument("script", nargs="?",
                     help="the program file, or - to read it from standard input").complete = shtab.FILE
    run.add_argument("-c", "--code", help="the program as a string instead of a file")
    run.add_argument("--language", help="runtime (default: from the file suffix, else python)")
    run.add_argument("--file", action="append", default=[], metavar="[DEST=]PATH",
                     help="input file for the program (repeatable); lands as its base name unless DEST= (or "
                          "PATH:DEST) is given. Any size the policy allows: small files go in the run, larger ones are uploaded "
                          "to the data service (streamed) once the run asks for them").complete = shtab.FILE
    run.add_argument("--input", action="append", default=[], metavar="[DEST=]SOURCE",
                     help="an input by reference (repeatable): s3://BUCKET/KEY (a bucket the policy allows) or "
                          "run/RUN/ARTIFACT (an earlier run's artifact); lands as DEST, else its base name")
    run.add_argument("--stdin", metavar="FILE",
                     help="file passed on the program's standard input (- for ours)").complete = shtab.FILE
    run.add_argument("--timeout", type=program_seconds, metavar="DURATION",
                     help="how long the program may run, whole seconds: 30, 90s, 5m (its own limit, exit 124)")
    run.add_argument("--memory", help="memory limit, e.g. 512Mi (exit 137 when exceeded)")
    run.add_argument("--cpu", help="CPU limit, e.g. 500m or 1")
    run.add_argument("--wait-timeout", type=wait_seconds, metavar="DURATION",
                     help="how long to wait for the result (default: --timeout + 6m, past the operator's own 5m "
                          "bound on a sandbox that cannot start; exit 5 when it runs out)")
    run.add_argument("-l", "--label", action="append", default=[], metavar="KEY=VALUE", help="label the run")
    run.add_argument("--keep", action="store_true", help="keep the CodeRun instead of deleting it afterwards")
    run.add_argument("--raw", action="store_true", help=raw_help)
    run.add_argument("--session", metavar="NAME",
                     help="run in this CodeRunSession's sandbox (see `coderun session create`): files the "
                          "session's earlier runs wrote are there; its limits apply")

    get = _command(commands, "get", "show a run's result (text: the summary line)")
    _add_run_names(get)

    logs = _command(commands, "logs", "print a run's stdout and stderr and exit with its exit code",
                    "Prints the program's stdout, then its stderr (to stderr), and exits like `run` would have "
                    "for this run. The output is in the run's status once it has ended: a run still going exits "
                    "5 unless -f/--wait waits for it.")
    _add_run_names(logs)
    logs.add_argument("-f", "--follow", "-w", "--wait", dest="wait", action="store_true",
                      help="wait until the run ends, then print its output")
    logs.add_argument("--wait-timeout", type=wait_seconds, metavar="DURATION",
                      help="with --wait, give up after this long (exit 5; default: wait until the run ends)")
    logs.add_argument("--raw", action="store_true", help=raw_help)

    listing = _command(commands, "list", "list runs",
                       "Lists runs with the columns of `kubectl get crun`; -o wide adds POD, START and POLICY, -o "
                       "name prints coderun.coderun.io/NAME lines, -o json|yaml an object whose items are what "
                       "`get -o json|yaml` prints.")
    listing.add_argument("-l", "--label", action="append", default=[], metavar="KEY=VALUE")
    listing.add_argument("--mine", action="store_true", help="only runs created by this CLI (coderun.io/client=cli)")
    listing.add_argument("-A", "--all-namespaces", action="store_true")

    delete = _command(commands, "delete", "delete runs")
    _add_run_names(delete, "names", nargs="+", metavar="NAME")
    delete.add_argument("--ignore-not-found", action="store_true",
                        help="a run that does not exist is not an error (exit 0)")

    for verb, annotation, effect in (
            ("approve", APPROVED_BY, "it starts (a creator's own approval counts only where the policy allows it)"),
            ("reject", REJECTED_BY, "it ends Rejected, naming you")):
        decide = _command(commands, verb, f"{verb} runs waiting for approval",
                          f"Records your own username (as the API server knows it) in {annotation} "
                          f"and {effect}. Needs the RBAC verb approve on coderuns (the chart's approver "
                          "ClusterRole); a verdict, once given, is final.")
        _add_run_names(decide, "names", nargs="+", metavar="NAME")

    artifacts = _command(commands, "artifacts", "list a run's artifacts or get one",
                         "Lists the files the program wrote to $CODERUN_OUTPUT_DIR (name, size, sha256, and whether "
                         "it is kept inline or in the store) and the ones it did not keep, or writes one to a file. "
                         "Every byte is checked against the size and sha256 the run recorded; a file whose bytes "
                         "differ is not written.")
    artifact_commands = artifacts.add_subparsers(dest="artifacts_command", required=True, metavar="SUBCOMMAND")
    listed = artifact_commands.add_parser("list", help="list a run's artifacts")
    _add_run_names(listed)
    fetched = artifact_commands.add_parser("get", help="write one artifact to a file (or stdout)")
    _add_run_names(fetched)
    fetched.add_argument("artifact", help="the artifact's name, as `artifacts list` shows it")
    fetched.add_argument("-o", "--output-file", dest="dest", metavar="PATH",
                         help="where to write it, - for stdout (default: its base name in the current directory)")
    for sub in (listed, fetched):
        _add_global_flags(sub, argparse.SUPPRESS, None)
        sub.set_defaults(command_parser=sub)

    runtimes = _command(commands, "runtimes", "list the languages and limits the namespace's policy offers")
    runtimes.add_argument("--policy", help="a CodeRunPolicy by name (default: the namespace's `default`, "
                                           "else the built-in baseline)")

    session = _command(commands, "session", "create, show and delete CodeRunSessions: many runs, one sandbox",
                       "A session keeps one sandbox for your runs: `coderun session create` prints its name, "
                       "`coderun run --session NAME ...` runs in it (one at a time, in the order given; files "
                       "persist between runs), `coderun session delete NAME` ends it. It also ends by itself "
                       "after --idle-timeout without a run, or --max-lifetime.")
    session_commands = session.add_subparsers(dest="session_command", required=True, metavar="SUBCOMMAND")
    create = session_commands.add_parser("create", help="create a session and print its name")
    create.add_argument("--language", default="python", help="the session's runtime (default python)")
    create.add_argument("--policy", help="the CodeRunPolicy (default: the namespace's `default`); it must allow "
                                         "sessions")
    create.add_argument("--keep-state", action="store_true",
                        help="one interpreter for all runs, so variables persist (default: files only)")
    create.add_argument("--memory", help="the sandbox's memory for the whole session, e.g. 1Gi")
    create.add_argument("--cpu", help="the sandbox's CPU, e.g. 500m or 1")
    create.add_argument("--disk", help="the size of the sandbox's /tmp, e.g. 256Mi")
    create.add_argument("--idle-timeout", type=program_seconds, metavar="DURATION",
                        help="end the session after this long without a run (default 10m)")
    create.add_argument("--max-lifetime", type=program_seconds, metavar="DURATION",
                        help="end the session this long after it started, busy or not (default 1h)")
    create.add_argument("--name", help="the session's name (default: session- and a random suffix)")
    create.add_argument("--wait-timeout", type=wait_seconds, metavar="DURATION",
                        help="how long to wait for the session to take runs (default 6m, past the operator's own "
                             "bound on a sandbox that cannot start; exit 5 when it runs out)")
    create.add_argument("--no-wait", action="store_true",
                        help="print the name at once, without waiting for the session to be ready (or refused)")
    show = session_commands.add_parser("get", help="show where a session stands")
    show.add_argument("name")
    remove = session_commands.add_parser("delete", help="end sessions now (their pods go with them)")
    remove.add_argument("names", nargs="+", metavar="NAME")
    for sub in (create, show, remove):
        _add_global_flags(sub, argparse.SUPPRESS, None)
        sub.set_defaults(command_parser=sub)

    completion = _command(commands, "completion", "print a shell completion script",
                          "Prints the completion script for the shell. Load it in the current shell with "
                          "`source <(coderun completion bash)` (zsh: `source <(coderun completion zsh)` after "
                          "compinit), or write it where your shell loads completions from. Run names are "
                          "completed from `coderun list` in the kubeconfig's current context.")
    completion.add_argument("shell", choices=shtab.SUPPORTED_SHELLS)

    mcp = _command(commands, "mcp", "serve the run_code and list_runtimes MCP tools")
    mcp.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="streamable-http: address to listen on")
    mcp.add_argument("--port", type=int, default=8000, help="streamable-http: port to listen on")
    mcp.add_argument("--progress-interval", type=wait_seconds, default=10, metavar="DURATION",
                     help="while a run goes, send progress this often when the client asked for it (default 10s; "
                          "hosts that time out after 60 s wait as long as progress comes)")
    return parser


COMMANDS = {"run": cmd_run, "get": cmd_get, "logs": cmd_logs, "list": cmd_list, "delete": cmd_delete,
            "artifacts": cmd_artifacts, "runtimes": cmd_runtimes, "session": cmd_session, "approve": cmd_decide,
            "reject": cmd_decide}
# Commands that name an object: a 404 there is the user's answer (exit 1, like kubectl), not a platform failure.
NAMING_COMMANDS = {"get", "logs", "delete", "artifacts", "runtimes", "session", "approve", "reject"}


def usage_error(parser: argparse.ArgumentParser, message: str) -> int:
    """argparse's own form: the usage, then `PROG COMMAND: error: message`, exit 2."""
    parser.print_usage(sys.stderr)
    print(one_line(f"{parser.prog}: error: {message}"), file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # Python would print a traceback at exit while flushing: point stdout at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    prog = "kubectl coderun" if Path(sys.argv[0]).name.startswith("kubectl-") else "coderun"
    args = build_parser(prog).parse_args(argv)  # exits 2 itself on what argparse refuses
    try:
        check_args(args)
    except UsageError as e:
        return usage_error(args.command_parser, str(e))
    if args.command == "completion":
        return cmd_completion(args)
    if args.command == "mcp":
        return cmd_mcp(args)
    try:
        client = CodeRunClient(args.namespace, kubeconfig=args.kubeconfig, context=args.context, client_name="cli")
        return COMMANDS[args.command](client, args)
    except RunNotFound as e:
        print(one_line(f"{prog}: {e}"), file=sys.stderr)
        return EXIT_NOT_FOUND if args.command in NAMING_COMMANDS else EXIT_PLATFORM
    except CodeRunError as e:
        print(one_line(f"{prog}: {e}"), file=sys.stderr)
        return EXIT_PLATFORM
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
