"""build.sh's cache on a tiny synthetic recipe: a recipe's base rootfs is built once and reused when only
RECIPE_INPUTS change, so a runner change does not redo the packages.

No cluster needed: `python3 -m pytest e2e/images -q`.
"""

from __future__ import annotations

import os
import re
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


RECORDING_RECIPE = """
IMAGE_REF=coderun.local/recorded:v1
RECIPE_INPUTS=(top.txt)
MKIMAGE_ARGS=(--cmd '["sh"]')

make_base_rootfs() {  # as debian_finish records what dpkg installed
    mkdir -p "$1/$(dirname "$PACKAGES_RECORD")"
    cat "$REPO/installed.txt" >"$1/$PACKAGES_RECORD"
}

make_rootfs() {
    cp "$REPO/top.txt" "$1/top"
}
"""


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_package_record_goes_into_the_image_and_the_cache_and_the_checkout_is_left_as_it_was(repo, tmp_path):
    """Debian's versions are a record of what a build got, not a pin: the image carries it and the cache keeps it
    beside the archive; the checkout (every file of it) is unchanged by the build."""
    (repo / "e2e/images/recipes/recorded.sh").write_text(RECORDING_RECIPE)
    (repo / "installed.txt").write_text("squid=5.7-2+deb12u2\n")
    before, out = tree(repo), tmp_path / "out"
    proc = subprocess.run(["bash", str(repo / "e2e/images/build.sh"), "recorded", str(out)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    archive = Path(proc.stdout.strip().splitlines()[-1])
    assert tree(repo) == before
    record = archive.with_name(archive.name.removesuffix(".tar") + ".packages.txt")
    assert record.read_text() == "squid=5.7-2+deb12u2\n"
    assert layer_files(archive)["usr/share/coderun/packages.txt"] == b"squid=5.7-2+deb12u2\n"

    (repo / "top.txt").write_text("two\n")  # a new key: the stale archive and its record both go
    proc = subprocess.run(["bash", str(repo / "e2e/images/build.sh"), "recorded", str(out)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not record.exists() and not archive.exists()
    assert len(list(out.glob("recorded-*.packages.txt"))) == 1


# A shell write whose target is under the checkout: a redirect into "$REPO/...", or cp/mv/install/tee whose
# last argument (the target) is there.
REDIRECT_INTO_CHECKOUT = re.compile(r'>>?\s*"?\$\{?REPO\b')
COPY_COMMAND = re.compile(r'\b(?:cp|mv|install|tee)\s([^;|&]*)')


def writes_into_checkout(line: str) -> bool:
    copies = (command.split()[-1] for command in COPY_COMMAND.findall(line.split("#")[0]) if command.split())
    return bool(REDIRECT_INTO_CHECKOUT.search(line)) or any(target.lstrip('"').startswith(("$REPO", "${REPO"))
                                                            for target in copies)


def test_no_build_script_writes_into_the_checkout():
    """The image scripts read the checkout and write only under the cache: a write into "$REPO/..." (as the old
    `dpkg-query ... >"$REPO/$lock"` did, the positive control) would change a tracked file on a new machine."""
    assert writes_into_checkout("""chroot "$rootfs" dpkg-query -W | LC_ALL=C sort >"$REPO/$lock\"""")
    assert writes_into_checkout('cp -u "$rootfs"/x "$REPO/sandbox-images/x"')
    assert not writes_into_checkout('cp "$REPO/top.txt" "$1/top"')  # reading from it is fine
    scripts = [HERE / "build.sh", HERE / "debian.sh", *sorted((HERE / "recipes").glob("*.sh"))]
    assert len(scripts) >= 8
    writes = [f"{script.name}: {line.strip()}" for script in scripts for line in script.read_text().splitlines()
              if writes_into_checkout(line)]
    assert writes == []
