"""`python -m coderun.agent "task" --file data.csv`: the reference loop from the command line.

The chat endpoint comes from CODERUN_AGENT_BASE_URL / CODERUN_AGENT_MODEL / CODERUN_AGENT_API_KEY."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..client import CodeRunClient, CodeRunError
from . import ANSWERED, Agent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coderun.agent", description=__doc__)
    parser.add_argument("task")
    parser.add_argument("--file", action="append", default=[], help="input file (repeatable)")
    parser.add_argument("-n", "--namespace")
    args = parser.parse_args(argv)
    files = {Path(p).name: Path(p).read_bytes() for p in args.file}
    try:
        agent = Agent.from_env(CodeRunClient(args.namespace, client_name="agent"))
    except (CodeRunError, ValueError) as e:
        print(f"coderun.agent: {e}", file=sys.stderr)
        return 2
    outcome = agent.solve(args.task, files=files)
    for number, attempt in enumerate(outcome.attempts, 1):
        print(f"attempt {number}: {attempt.problem or 'ok'} ({attempt.seconds:.1f}s)", file=sys.stderr)
    print(f"{outcome.status}: {outcome.tokens_used} tokens, {outcome.execution_seconds:.1f}s in the sandbox"
          + (f"; {outcome.detail}" if outcome.detail else ""), file=sys.stderr)
    if outcome.answer:
        print(outcome.answer)
    return 0 if outcome.status == ANSWERED else 1


if __name__ == "__main__":
    sys.exit(main())
