"""What `make dist` ships, as its users meet it: the wheel installs in a fresh venv and its commands run; the light
install has no server dependencies and its server commands (`coderun-operator`, `coderun-audit-agent`) name their
extra in one line; the wheel carries py.typed and the licence, the sdist the licence; the packaged chart lints; one
version throughout.

The wheel and sdist are built here as `make dist` builds them, but without build isolation (the test extra has
build and setuptools), so no index is needed."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

import coderun

REPO = Path(__file__).parents[2]
VERSION = coderun.__version__


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


def the_one(directory: Path, pattern: str) -> Path:
    found, = directory.glob(pattern)
    return found


def required_closure(requirements: list[str]) -> list[metadata.Distribution]:
    """The installed distributions these requirements need, transitively, extras left out (as pip resolves a plain
    `pip install coderun`), taken from the environment the tests run in."""
    found: dict[str, metadata.Distribution] = {}
    pending = list(requirements)
    while pending:
        requirement = Requirement(pending.pop())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        dist = metadata.distribution(requirement.name)
        if dist.metadata["Name"].lower() not in found:
            found[dist.metadata["Name"].lower()] = dist
            pending.extend(dist.requires or [])
    return list(found.values())


def copy_distribution(dist: metadata.Distribution, site_packages: Path) -> None:
    """Put an installed distribution into another venv's site-packages as pip had installed it: its files and
    dist-info as its RECORD lists them (scripts outside site-packages and byte-code left out)."""
    for file in dist.files or []:
        if file.parts[0] == ".." or "__pycache__" in file.parts:
            continue
        target = site_packages / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(dist.locate_file(file)), target)


@pytest.fixture(scope="module")
def light_venv(dists, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed by pip, with the dependencies a plain install resolves: copied from
    the tests' own venv rather than downloaded (no index), at the versions the tests run with. `pip check` proves
    they are exactly what the wheel's metadata requires."""
    venv = tmp_path_factory.mktemp("venv") / "light"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "--disable-pip-version-check"]
    installed = subprocess.run([*pip, "install", "--no-deps", "--no-index", str(the_one(dists, "coderun-*.whl"))],
                               capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    site_packages = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    wheel_metadata, = metadata.distributions(name="coderun", path=[str(site_packages)])
    for dist in required_closure(wheel_metadata.requires or []):
        copy_distribution(dist, site_packages)
    checked = subprocess.run([*pip, "check"], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return venv


def run(venv: Path, command: str, *args: str) -> subprocess.CompletedProcess:
    # A clean environment: nothing of this venv (PATH, PYTHONPATH from pytest's config) may leak into the fresh one.
    return subprocess.run([str(venv / "bin" / command), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(venv)}, cwd=venv)


def test_the_wheel_carries_the_version_the_licence_and_py_typed(dists):
    wheel = zipfile.ZipFile(the_one(dists, "coderun-*.whl"))
    info = f"coderun-{VERSION}.dist-info"
    names = set(wheel.namelist())
    assert {"coderun/py.typed", f"{info}/licenses/LICENSE", "coderun_operator/command.py"} <= names
    fields = wheel.read(f"{info}/METADATA").decode().splitlines()
    assert f"Version: {VERSION}" in fields and "License-Expression: Apache-2.0" in fields
    assert "License-File: LICENSE" in fields and "Classifier: Typing :: Typed" in fields
    assert wheel.read(f"{info}/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()


def test_the_sdist_carries_the_licence(dists):
    with tarfile.open(the_one(dists, "coderun-*.tar.gz")) as sdist:
        names = set(sdist.getnames())
        assert {f"coderun-{VERSION}/LICENSE", f"coderun-{VERSION}/src/coderun/py.typed"} <= names
        assert sdist.extractfile(f"coderun-{VERSION}/LICENSE").read() == (REPO / "LICENSE").read_bytes()


def test_the_installed_wheel_runs_its_cli(light_venv):
    version = run(light_venv, "coderun", "--version")
    assert (version.returncode, version.stdout) == (0, f"coderun {VERSION}\n"), version.stderr
    usage = run(light_venv, "coderun", "--help")
    assert usage.returncode == 0 and usage.stdout.startswith("usage: coderun "), usage.stderr
    assert "exit codes:" in usage.stdout and "137    out of memory" in usage.stdout
    plugin = run(light_venv, "kubectl-coderun", "--version")
    assert (plugin.returncode, plugin.stdout) == (0, f"kubectl coderun {VERSION}\n"), plugin.stderr


def test_the_light_install_has_no_server_dependencies_and_its_server_commands_say_what_to_install(light_venv):
    for module in ("kopf", "prometheus_client", "re2", "google.protobuf"):
        probe = run(light_venv, "python", "-c", f"import {module}")
        assert probe.returncode == 1 and "ModuleNotFoundError" in probe.stderr, module
    for command, extra, first in [("coderun-operator", "operator", "kopf"), ("coderun-audit-agent", "audit", "protobuf")]:
        server = run(light_venv, command, "--help")
        assert "Traceback" not in server.stderr, server.stderr
        assert server.returncode == 2 and server.stdout == ""
        line, = server.stderr.splitlines()  # one line, no traceback
        assert line.startswith(f"{command}: the {extra} extra is not installed ({first}")
        assert line.endswith(f" missing): pip install 'coderun[{extra}]'")
    sdk = run(light_venv, "python", "-c", "import coderun.client, coderun.api.models; print(coderun.client.__name__)")
    assert (sdk.returncode, sdk.stdout) == (0, "coderun.client\n"), sdk.stderr


def test_the_chart_and_the_docs_state_the_packages_version():
    chart = yaml.safe_load((REPO / "charts" / "coderun" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION)
    # The install lines name what `make dist` writes: coderun-VERSION-py3-none-any.whl, coderun-VERSION.tgz, ...
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        named = set(re.findall(r"coderun(?:-operator)?-(\d+\.\d+\.\d+)", page.read_text()))
        assert named <= {VERSION}, f"{page.name} names {named - {VERSION}}, the version is {VERSION}"


def test_the_packaged_chart_lints(helm, tmp_path):
    packaged = subprocess.run([helm, "package", str(REPO / "charts" / "coderun"), "--destination", str(tmp_path)],
                              capture_output=True, text=True, timeout=60)
    assert packaged.returncode == 0, packaged.stdout + packaged.stderr
    archive = tmp_path / f"coderun-{VERSION}.tgz"
    with tarfile.open(archive) as chart:
        assert {"coderun/Chart.yaml", "coderun/values.schema.json", "coderun/templates/crds.yaml"} <= set(
            chart.getnames())
    linted = subprocess.run([helm, "lint", "--strict", str(archive)], capture_output=True, text=True, timeout=60)
    assert linted.returncode == 0, linted.stdout + linted.stderr
