"""The light install (`pip install coderun`, no extra): its dependencies stay the client's, and every server
command it installs anyway (a console script cannot belong to an extra) names its extra in one line and exits 2
when that extra's packages cannot be imported, instead of a traceback. The servers run in subprocesses whose
imports of the extra's packages fail as on a light install (a sys.meta_path blocker), through the installed
console scripts' own entry points."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# What `pip install coderun` brings: the SDK's (the API models on pydantic, the Kubernetes client, YAML) and the
# CLI's shell completion. A new base dependency is a decision for every SDK user, to be made here on purpose.
CLIENT_DEPENDENCIES = {"kubernetes", "pydantic", "pyyaml", "shtab"}
# The server commands, the extra each needs, and packages of that extra its import reaches first.
SERVERS = {
    "coderun-operator": ("operator", ["kopf", "prometheus_client", "re2", "boto3"]),
    "coderun-audit-agent": ("audit", ["google.protobuf"]),
}
CLIENT_COMMANDS = {"coderun", "kubectl-coderun"}


def test_the_base_install_depends_on_the_client_set_alone():
    base = {Requirement(r).name.lower() for r in PYPROJECT["project"]["dependencies"]}
    assert base == CLIENT_DEPENDENCIES
    # The servers' packages are each in an extra, none in the base.
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {"kopf", "prometheus-client", "google-re2"} <= {Requirement(r).name for r in extras["operator"]}
    assert {Requirement(r).name for r in extras["audit"]} == {"protobuf"}


def test_every_console_script_is_the_client_or_a_server_that_names_its_extra():
    scripts = PYPROJECT["project"]["scripts"]
    assert set(scripts) == CLIENT_COMMANDS | set(SERVERS)
    assert {scripts[c] for c in CLIENT_COMMANDS} == {"coderun.cli:main"}


def _run_without(script: str, blocked: list[str], *args: str) -> subprocess.CompletedProcess:
    """The installed console script `script`, run as its wrapper runs it, with `blocked` unimportable."""
    program = textwrap.dedent(f"""
        import importlib.abc, sys
        from importlib.metadata import entry_points
        BLOCKED = {blocked!r}

        class LightInstall(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, LightInstall())
        entry, = [e for e in entry_points(group="console_scripts") if e.name == {script!r}]
        sys.argv = [{script!r}, *{list(args)!r}]
        sys.exit(entry.load()())
    """)
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=REPO)


@pytest.mark.parametrize("script", sorted(SERVERS))
def test_a_server_command_without_its_extra_says_which_to_install_in_one_line(script):
    extra, blocked = SERVERS[script]
    result = _run_without(script, blocked, "--help")
    assert result.returncode == 2 and result.stdout == "", result.stderr
    line, = result.stderr.splitlines()  # one line, no traceback
    assert line.startswith(f"{script}: the {extra} extra is not installed (")
    assert line.endswith(f" missing): pip install 'coderun[{extra}]'")
    # The control: with its extra importable the same command runs (its usage, exit 0).
    usage = _run_without(script, [], "--help")
    assert usage.returncode == 0 and usage.stdout.startswith("usage:"), usage.stderr[-2000:]


def test_a_module_of_coderuns_own_that_fails_to_import_keeps_its_traceback():
    """A missing extra is named; a broken coderun is not disguised as one."""
    result = _run_without("coderun-audit-agent", ["coderun.audit.wire"], "--help")
    assert result.returncode == 1 and "Traceback" in result.stderr and "'wire'" in result.stderr
    assert "pip install" not in result.stderr
