"""The `coderun-operator` command. Every install of coderun has it (one distribution: the operator image installs
the `operator` extra of the same package), so without that extra it says in one line what to install instead of
dying with kopf's ImportError."""
from __future__ import annotations

import re
import sys
from importlib import metadata

INSTALL_OPERATOR = "pip install 'coderun[operator]'"


def missing_operator_extra() -> list[str]:
    """The requirements of the `operator` extra that are not installed, named as the package's metadata names
    them (so the list is pyproject.toml's, not a copy); none when coderun itself is not installed."""
    try:
        requirements = metadata.requires("coderun") or []
    except metadata.PackageNotFoundError:
        return []
    missing = []
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        if not re.search(r"""extra\s*==\s*["']operator["']""", marker):
            continue
        named = re.match(r"[A-Za-z0-9._-]+", spec.strip())
        if named is None:  # not a requirement (metadata always names one first)
            continue
        name = named.group()
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def main() -> None:
    try:
        from .main import main as run_operator
    except ModuleNotFoundError:
        missing = missing_operator_extra()
        if not missing:  # the extra is there: a real import error, with its traceback
            raise
        sys.exit(f"coderun-operator: the operator extra is not installed ({', '.join(missing)} missing): "
                 f"{INSTALL_OPERATOR}")
    run_operator()
