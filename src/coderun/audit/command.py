"""The `coderun-audit-agent` command (the chart's DaemonSet runs it). Every install of coderun has it, so without
the `audit` extra (protobuf, which the trace points are decoded with) it says in one line what to install instead
of dying with an ImportError (coderun.extras)."""
from __future__ import annotations

from coderun.extras import run_server


def main() -> None:
    run_server("coderun-audit-agent", "audit", "coderun.audit.agent")
