"""The `coderun-operator` command. Every install of coderun has it (one distribution: the operator image installs
the `operator` extra of the same package), so without that extra it says in one line what to install instead of
dying with kopf's ImportError (coderun.extras)."""
from __future__ import annotations

from coderun.extras import run_server


def main() -> None:
    run_server("coderun-operator", "operator", "coderun_operator.main")
