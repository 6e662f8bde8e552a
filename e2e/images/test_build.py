"""build.sh's cache on a tiny synthetic recipe: a recipe's base rootfs is built once and reused when only
RECIPE_INPUTS change, so a runner change does not redo the packages.

No cluster needed: `python3 -m pytest e2e/images -q`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

RECIPE = """
IMAGE_REF=coderun.local/layered:v1
RECIPE_INPUTS=(top.txt)
MKIMAGE_ARGS=(--cmd '["sh"]')

make_base_rootfs() {
    mkdir -p "$1/etc"
    echo base >"$1/etc/base"
    echo built >>"$BASE_BUILDS"
}

make_rootfs() {
    cp "$REPO/top.txt" "$1/top"
}
"""


@pytest.fixture
def repo(tmp_path):
    """A copy of the image scripts in the repository layout build.sh expects, with the synthetic recipe."""
    if not shutil.which("flock") or not shutil.which("sha256sum"):
        pytest.skip("build.sh needs flock and sha256sum")
    images = tmp_path / "repo" / "e2e" / "images"
    (images / "recipes").mkdir(parents=True)
    for name in ("build.sh", "debian.sh", "mkimage.py"):
        shutil.copy2(HERE / name, images / name)
    (images / "recipes" / "layered.sh").write_text(RECIPE)
    (tmp_path / "repo" / "top.txt").write_text("one\n")
    return tmp_path / "repo"


def build(repo: Path, out: Path, base_builds: Path) -> Path:
    proc = subprocess.run(["bash", str(repo / "e2e/images/build.sh"), "layered", str(out)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "BASE_BUILDS": str(base_builds)})
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip().splitlines()[-1])


def layer_files(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as image:
        layer_name = next(m.name for m in image.getmembers() if m.size > 4096)  # the only big blob
        with tarfile.open(fileobj=image.extractfile(layer_name)) as layer:
            return {m.name: layer.extractfile(m).read() for m in layer.getmembers() if m.isfile()}


def test_the_base_is_built_once_and_reused_for_a_new_input(repo, tmp_path):
    out, base_builds = tmp_path / "out", tmp_path / "base-builds"
    first = build(repo, out, base_builds)
    assert layer_files(first) == {"etc/base": b"base\n", "top": b"one\n"}
    assert build(repo, out, base_builds) == first  # nothing changed: the cached archive

    (repo / "top.txt").write_text("two\n")
    second = build(repo, out, base_builds)
    assert second != first and not first.exists()  # a new key; the stale archive is gone
    assert layer_files(second) == {"etc/base": b"base\n", "top": b"two\n"}
    assert base_builds.read_text() == "built\n"  # the base was built once, then unpacked from its cache
    assert len(list((out / "base").glob("layered-*.tar"))) == 1


def test_a_change_to_the_recipe_rebuilds_the_base(repo, tmp_path):
    out, base_builds = tmp_path / "out", tmp_path / "base-builds"
    build(repo, out, base_builds)
    recipe = repo / "e2e/images/recipes/layered.sh"
    recipe.write_text(recipe.read_text().replace("echo base >", "echo base2 >"))
    archive = build(repo, out, base_builds)
    assert layer_files(archive)["etc/base"] == b"base2\n"
    assert base_builds.read_text() == "built\nbuilt\n"
    assert len(list((out / "base").glob("layered-*.tar"))) == 1  # the stale base is gone
