"""The server commands of a light install. `pip install coderun` installs every console script of the distribution
(pyproject.toml cannot tie a script to an extra), and the servers among them (`coderun-operator`,
`coderun-audit-agent`) need an extra's packages: without them each says in one line which extra to install, and
exits 2, instead of dying with an ImportError's traceback. Each is a thin entry point that imports its server only
when run."""
from __future__ import annotations

import importlib
import re
import sys
from importlib import metadata

USAGE_ERROR = 2


def install_line(extra: str) -> str:
    return f"pip install 'coderun[{extra}]'"


def missing_requirements(extra: str) -> list[str]:
    """The requirements of `extra` that are not installed, named as the package's metadata names them (so the list
    is pyproject.toml's, not a copy); none when coderun itself is not installed (a checkout on sys.path)."""
    try:
        requirements = metadata.requires("coderun") or []
    except metadata.PackageNotFoundError:
        return []
    missing = []
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        if not re.search(rf"""extra\s*==\s*["']{re.escape(extra)}["']""", marker):
            continue
        named = re.match(r"[A-Za-z0-9._-]+", spec.strip())
        if named is None:  # not a requirement (metadata always names one first)
            continue
        try:
            metadata.distribution(named.group())
        except metadata.PackageNotFoundError:
            missing.append(named.group())
    return missing


def _ours(module: str | None) -> bool:
    return (module or "").split(".")[0] in ("coderun", "coderun_operator")


def run_server(command: str, extra: str, module: str) -> None:
    """Import `module` and run its main(); a package of the extra missing ends the command with one line naming the
    extra. A module of coderun's own that does not import is a bug, never disguised: its traceback stays."""
    try:
        main = importlib.import_module(module).main
    except ModuleNotFoundError as e:
        if _ours(e.name):
            raise
        missing = ", ".join(missing_requirements(extra)) or f"the module {e.name}"
        print(f"{command}: the {extra} extra is not installed ({missing} missing): {install_line(extra)}",
              file=sys.stderr)
        sys.exit(USAGE_ERROR)
    main()
