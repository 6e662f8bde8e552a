"""The layout the design card names, and the import contracts in .importlinter (run by import-linter)."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    # A subprocess, so the graph is of the source tree as a fresh interpreter imports it.
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                           "lint_imports_command()", "--no-cache"],
                          cwd=root, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": f"{root / 'src'}:{root / 'operator'}", "PATH": "/usr/bin:/bin"})


def test_the_import_contracts_hold():
    linted = lint_imports(REPO)
    assert linted.returncode == 0, linted.stdout[-4000:] + linted.stderr[-2000:]
    assert "broken" in linted.stdout and " 0 broken" in linted.stdout
    # The controller's old circle (stages importing each other through function-level imports) stays out.
    assert "No import cycle between the siblings of any package" in linted.stdout
    # The operator's layers (kopf keeps its own so): the pure core below the API seam, the controller above both;
    # and its two placements beside a cold pod, warm and session, apart.
    kept = " ".join(linted.stdout.split())  # its lines are wrapped at 80 columns
    assert "The operator's layers: entry points, kopf handlers, controller" in kept
    assert "The warm pool and the sessions are independent parts of the controller: neither imports the other" in kept


@pytest.mark.parametrize("module, added, refused", [
    ("results/frame.py", "from .. import k8s", "coderun_operator.results.frame -> coderun_operator.k8s"),
    ("controller/session/__init__.py", "from ..warm import placement",
     "coderun_operator.controller.session is not allowed to import coderun_operator.controller.warm"),
])
def test_an_import_across_the_operators_contracts_breaks_one(tmp_path, module, added, refused):
    # The positive controls of the contracts above: the same tree with the pure core importing the API, or the
    # session part importing the warm part, is refused.
    for part in ("src", "operator"):
        shutil.copytree(REPO / part, tmp_path / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / ".importlinter", tmp_path)
    with open(tmp_path / "operator/coderun_operator" / module, "a") as source:
        source.write(f"\n{added}  # noqa\n")
    linted = lint_imports(tmp_path)
    assert linted.returncode != 0 and " 1 broken" in linted.stdout, linted.stdout[-4000:]
    assert refused in " ".join(linted.stdout.split()), linted.stdout[-4000:]


def test_operator_holds_the_operator_and_does_not_shadow_the_standard_library():
    top = REPO / "operator"
    # The images users build: the operator's, and beside it the egress proxy's (squid) and the embedded store's
    # (versitygw), which the chart runs.
    assert {p.name for p in top.iterdir() if p.name != "__pycache__"} == {
        "Dockerfile", "egress-proxy.Dockerfile", "store.Dockerfile", "requirements.txt", "coderun_operator"}
    assert not (top / "__init__.py").exists()
    # With the repository root first on the path (as `python -m pytest` puts it), `operator` is still the stdlib's.
    probe = subprocess.run([sys.executable, "-c", "import operator; print(operator.add(2, 3), operator.__file__)"],
                           cwd=REPO, capture_output=True, text=True, timeout=30)
    assert probe.stdout.startswith("5 ") and "/operator/" not in probe.stdout.split(" ", 1)[1], probe
