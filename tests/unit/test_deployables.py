"""Each deployable subpackage says where it ships from (issue 36, "names and homes"): a README.md beside its code
naming the image that carries it, the recipe and Dockerfile that build it, what runs it, and the import-linter
contracts that keep it small; and every file, module and contract it names exists."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
DEPLOYABLES = ["src/coderun/sandbox/runner", "src/coderun/egress", "src/coderun/audit", "operator/coderun_operator/data"]
SECTIONS = ["**Image.**", "**Built by.**", "**Run by.**", "**What keeps it small.**"]
REPO_ROOTS = ("src/", "e2e/", "operator/", "sandbox-images/", "charts/", "docs/")
CONTRACTS = set(re.findall(r"^\[importlinter:contract:([\w-]+)\]", (REPO / ".importlinter").read_text(), re.M))


def problems(package: Path) -> list[str]:
    """What the package's README.md lacks or names that does not exist."""
    readme = package / "README.md"
    if not readme.exists():
        return [f"{package}: no README.md"]
    text = readme.read_text()
    found = [f"no {section}" for section in SECTIONS if section not in text]
    for name in re.findall(r"`([^`\s]+)`", text):
        if name.startswith(REPO_ROOTS) and not list(REPO.glob(name)):
            found.append(f"no file {name}")
        elif re.fullmatch(r"\w+\.py", name) and not (package / name).exists():
            found.append(f"no module {name} in {package.name}")
    small = text.partition("**What keeps it small.**")[2]
    named = [name for name in re.findall(r"`([a-z0-9]+(?:-[a-z0-9]+)+)`", small)]
    if not named:
        found.append("names no import-linter contract")
    found += [f"no contract {name} in .importlinter" for name in named if name not in CONTRACTS]
    return found


@pytest.mark.parametrize("package", DEPLOYABLES)
def test_each_deployable_says_where_it_ships_from(package):
    assert problems(REPO / package) == []


def test_a_readme_naming_what_does_not_exist_is_caught(tmp_path):
    """The positive control: a missing README, file, module or contract is found."""
    assert problems(tmp_path) == [f"{tmp_path}: no README.md"]
    good = (REPO / "src/coderun/egress/README.md").read_text()
    (tmp_path / "README.md").write_text(good.replace("e2e/images/recipes/egress-proxy.sh", "e2e/images/recipes/gone.sh")
                                        .replace("`admin.py`", "`gone.py`").replace("`egress-stdlib`", "`no-such`"))
    assert set(problems(tmp_path)) >= {"no file e2e/images/recipes/gone.sh", f"no module gone.py in {tmp_path.name}",
                                       "no contract no-such in .importlinter"}


@pytest.mark.parametrize("package", DEPLOYABLES)
def test_the_development_layout_names_every_module_of_each_deployable(package):
    """docs/development.md's Layout names each module (a list that went stale at 14 of the runner's 20)."""
    layout = (REPO / "docs" / "development.md").read_text().partition("## Layout")[2]
    files = sorted(p.name for p in (REPO / package).iterdir()
                   if p.suffix in (".py", ".js") or (p.is_dir() and not p.name.startswith("__")))
    assert files and [name for name in files if name != "__init__.py"
                      and f"`{name}`" not in layout and f"`{name}/`" not in layout] == []
