"""`coderun` and `kubectl coderun`: run a script in the sandbox and exit with its exit code.

Thin over the SDK: argument parsing and printing here, decisions in small pure functions (exit_code_for,
summary_line, parse_file_arg) that the unit tests cover.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence, TextIO

import yaml
from pydantic import ValidationError

from . import __version__
from .api.models import Limits
from .api.reasons import Reason
from .api.text import one_line
from .client import CodeRunClient, CodeRunError, PolicyDenied, RunRequest, RunResult, RunTimeout, file_input
from .client.errors import describe_invalid
from .client.request import sandbox_path
from .client.sync import default_wait_seconds
from .tools import outcome_line, render_runtimes

# Exit codes. A program's own exit code passes through unchanged (0-255), so these can collide with it;
# -o json tells them apart when that matters.
EXIT_USAGE = 2             # bad arguments or unreadable local files
EXIT_REJECTED = 3          # the policy or the spec check refused the run (phase Rejected)
EXIT_PLATFORM = 4          # the platform failed (pod deleted, unschedulable, internal error) or the API did
EXIT_WAIT_TIMEOUT = 5      # --wait-timeout ran out before the run finished (the run is deleted unless --keep)
EXIT_OUTPUT_LIMIT = 6      # the program flooded its output and was stopped (OutputLimitExceeded)
EXIT_TIMEOUT = 124         # the program hit its own time limit (like coreutils timeout)
EXIT_OOM = 137             # the program ran out of memory (128 + SIGKILL, like a shell)
EXIT_INTERRUPTED = 130     # Ctrl-C

EXIT_CODES_HELP = f"""exit codes of `run`:
  0-255  the program's own exit code
  {EXIT_USAGE}      bad arguments or an unreadable local file
  {EXIT_REJECTED}      rejected by policy or spec check (PolicyDenied, InvalidSpec)
  {EXIT_PLATFORM}      platform or API failure (PodDeleted, Unschedulable, InternalError, API unreachable)
  {EXIT_WAIT_TIMEOUT}      --wait-timeout ran out before the run finished
  {EXIT_OUTPUT_LIMIT}      output flood stopped (OutputLimitExceeded)
  {EXIT_TIMEOUT}    the program's own time limit (--timeout) was hit
  {EXIT_OOM}    out of memory (--memory)
  128+N  killed by signal N
  A program's exit code can collide with these; `-o json` shows reason and exitCode."""

LANGUAGE_BY_SUFFIX = {".py": "python", ".js": "javascript", ".cjs": "javascript"}
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def exit_code_for(result: RunResult) -> int:
    """The process exit code that mirrors a finished run."""
    if result.rejected:
        return EXIT_REJECTED
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
    parts = [f"coderun: {result.name} {outcome_line(result)}"]
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
    if result.cached_from:
        parts.append(f"cached from {result.cached_from}")
    return one_line(" · ".join(parts))  # names, types and messages come from the program or other callers


def parse_file_arg(arg: str) -> tuple[str, Path]:
    """`data.csv` lands as data.csv; `in/data.csv=../local/x.csv` picks the sandbox path."""
    if "=" in arg:
        dest, local = arg.split("=", 1)
        return dest, Path(local)
    return sandbox_path(arg), Path(arg)


def parse_labels(pairs: Sequence[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"label {pair!r} must be key=value")
        labels[key] = value
    return labels


class UsageError(Exception):
    pass


def _read_local(path: Path | str, what: str) -> bytes:
    try:
        return sys.stdin.buffer.read() if str(path) == "-" else Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read {what} {path}: {e.strerror}") from e


def build_request(args: argparse.Namespace) -> RunRequest:
    if args.code is not None:
        code, language = args.code, args.language or "python"
    elif args.script:
        if args.script == "-" and args.stdin == "-":
            raise UsageError("the script and --stdin cannot both come from standard input")
        code = _read_local(args.script, "script").decode("utf-8", "replace")
        language = args.language or LANGUAGE_BY_SUFFIX.get(Path(args.script).suffix, "python")
    else:
        raise UsageError("give a script file (or - for standard input), or -c CODE")
    files = [file_input(dest, _read_local(local, "file")) for dest, local in map(parse_file_arg, args.file)]
    stdin = _read_local(args.stdin, "--stdin").decode("utf-8", "replace") if args.stdin else None
    return RunRequest(code=code, language=language, files=files or None, stdin=stdin, timeout=args.timeout)


def print_result(result: RunResult, output: str, out: TextIO, err: TextIO) -> None:
    if output == "text":
        out.write(result.stdout or "")
        out.flush()
        err.write(result.stderr or "")
        if result.stderr and not result.stderr.endswith("\n"):
            err.write("\n")
        err.write(summary_line(result) + "\n")
    else:
        document = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        out.write(json.dumps(document, indent=2) + "\n" if output == "json"
                  else yaml.safe_dump(document, sort_keys=False, allow_unicode=True))


class Progress:
    """A spinner with the run's phase and elapsed time on stderr, only when stderr is a terminal."""

    def __init__(self, stream: TextIO, label: str):
        self.stream, self.label, self.phase = stream, label, "Pending"
        self.enabled = stream.isatty()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def update(self, result: RunResult) -> None:
        self.phase = result.phase or "Pending"

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
    request = build_request(args)
    limits = Limits(memory=args.memory, cpu=args.cpu)
    try:
        created = client.create(request.to_spec(limits), labels=parse_labels(args.label))
    except PolicyDenied as e:  # the namespace's policy refused it at creation (admission: Enforce)
        print(one_line(f"coderun: rejected (PolicyDenied, policy rule {e.rule}): {e.message}"), file=sys.stderr)
        return EXIT_REJECTED
    try:
        with Progress(sys.stderr, created.name) as progress:
            wait_timeout = args.wait_timeout or default_wait_seconds(request.timeout)
            result = client.wait(created.name, timeout=wait_timeout, on_update=progress.update)
        print_result(result, args.output, sys.stdout, sys.stderr)
        return exit_code_for(result)
    except RunTimeout as e:
        print(one_line(f"coderun: {e}"), file=sys.stderr)
        return EXIT_WAIT_TIMEOUT
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
        print_result(result, args.output, sys.stdout, sys.stderr)
    return 0


def cmd_logs(client: CodeRunClient, args: argparse.Namespace) -> int:
    result = client.get(args.name)
    sys.stdout.write(result.stdout or "")
    sys.stderr.write(result.stderr or "")
    return 0


def cmd_list(client: CodeRunClient, args: argparse.Namespace) -> int:
    results = client.list(labels=parse_labels(args.label), mine=args.mine, all_namespaces=args.all_namespaces)
    rows = [("NAMESPACE", "NAME", "PHASE", "REASON", "EXIT", "CREATED")] + [
        tuple(one_line(cell) for cell in (r.namespace, r.name, r.phase or "", r.reason or "",
                                          "" if r.exit_code is None else str(r.exit_code), r.created_at or ""))
        for r in results]
    if not args.all_namespaces:
        rows = [row[1:] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def cmd_delete(client: CodeRunClient, args: argparse.Namespace) -> int:
    missing = [name for name in args.names if not client.delete(name)]
    for name in missing:
        print(f"coderun: {name} not found", file=sys.stderr)
    return 1 if missing else 0


def cmd_runtimes(client: CodeRunClient, args: argparse.Namespace) -> int:
    print(render_runtimes(client.runtimes(policy=args.policy)))
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        from .mcp_server import serve
    except ImportError as e:
        print(f"coderun: the MCP server needs the mcp extra: pip install 'coderun[mcp]' ({e})", file=sys.stderr)
        return EXIT_USAGE
    serve(transport=args.transport, host=args.host, port=args.port, namespace=args.namespace,
          kubeconfig=args.kubeconfig, context=args.context)
    return 0


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Run code in coderun's gVisor sandbox on Kubernetes.",
                                     epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's, or in-cluster)")
    common.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)")
    common.add_argument("--context", help="kubeconfig context")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", parents=[common], help="run a script and exit with its exit code",
                              epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                              description="Prints the program's stdout, then its stderr (to stderr), then a "
                                          "one-line summary (to stderr). The CodeRun is deleted afterwards "
                                          "unless --keep.")
    run.add_argument("script", nargs="?", help="the program file, or - to read it from standard input")
    run.add_argument("-c", "--code", help="the program as a string instead of a file")
    run.add_argument("--language", help="runtime (default: from the file suffix, else python)")
    run.add_argument("--file", action="append", default=[], metavar="[DEST=]PATH",
                     help="input file for the program (repeatable); lands as its base name unless DEST= is given")
    run.add_argument("--stdin", metavar="FILE", help="file passed on the program's standard input (- for ours)")
    run.add_argument("--timeout", type=int, help="seconds the program may run (its own limit, exit 124)")
    run.add_argument("--memory", help="memory limit, e.g. 512Mi (exit 137 when exceeded)")
    run.add_argument("--cpu", help="CPU limit, e.g. 500m or 1")
    run.add_argument("--wait-timeout", type=float, help="seconds to wait for the result (default: timeout + 120)")
    run.add_argument("-l", "--label", action="append", default=[], metavar="KEY=VALUE", help="label the run")
    run.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    run.add_argument("--keep", action="store_true", help="keep the CodeRun instead of deleting it afterwards")

    get = commands.add_parser("get", parents=[common], help="show a run's result")
    get.add_argument("name")
    get.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    logs = commands.add_parser("logs", parents=[common], help="print a run's stdout and stderr")
    logs.add_argument("name")
    listing = commands.add_parser("list", parents=[common], help="list runs")
    listing.add_argument("-l", "--label", action="append", default=[], metavar="KEY=VALUE")
    listing.add_argument("--mine", action="store_true", help="only runs created by this CLI (coderun.io/client=cli)")
    listing.add_argument("-A", "--all-namespaces", action="store_true")
    delete = commands.add_parser("delete", parents=[common], help="delete runs")
    delete.add_argument("names", nargs="+", metavar="NAME")
    runtimes = commands.add_parser("runtimes", parents=[common],
                                   help="list the languages and limits the namespace's policy offers")
    runtimes.add_argument("--policy", help="a CodeRunPolicy by name (default: the namespace's `default`, "
                                           "else the built-in baseline)")

    mcp = commands.add_parser("mcp", parents=[common], help="serve the run_code and list_runtimes MCP tools")
    mcp.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="streamable-http: address to listen on")
    mcp.add_argument("--port", type=int, default=8000, help="streamable-http: port to listen on")
    return parser


COMMANDS = {"run": cmd_run, "get": cmd_get, "logs": cmd_logs, "list": cmd_list, "delete": cmd_delete,
            "runtimes": cmd_runtimes}


def main(argv: Sequence[str] | None = None) -> int:
    prog = "kubectl coderun" if Path(sys.argv[0]).name.startswith("kubectl-") else "coderun"
    args = build_parser(prog).parse_args(argv)
    if args.command == "mcp":
        return cmd_mcp(args)
    try:
        client = CodeRunClient(args.namespace, kubeconfig=args.kubeconfig, context=args.context, client_name="cli")
        return COMMANDS[args.command](client, args)
    except UsageError as e:
        print(one_line(f"{prog}: {e}"), file=sys.stderr)
        return EXIT_USAGE
    except CodeRunError as e:
        print(one_line(f"{prog}: {e}"), file=sys.stderr)
        # 422: the API server's schema or CEL rules refused the spec, a rejection like the policy's.
        return EXIT_REJECTED if e.status == 422 else EXIT_PLATFORM
    except ValidationError as e:  # a bad --memory, --timeout or file path, named by field
        print(f"{prog}: invalid input: {describe_invalid(e)}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
