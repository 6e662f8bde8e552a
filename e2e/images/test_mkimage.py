"""mkimage.py on a small synthetic rootfs: structure, fidelity, determinism.

No cluster needed: `python3 -m pytest e2e/images -q`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

MKIMAGE = Path(__file__).resolve().parent / "mkimage.py"
REF = "coderun.local/test:v1"
IS_ROOT = os.geteuid() == 0


@pytest.fixture
def rootfs(tmp_path):
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "tmp").mkdir()
    os.chmod(root / "tmp", 0o1777)
    tool = root / "bin" / "tool"
    tool.write_bytes(b"#!/bin/sh\necho hi\n")
    os.chmod(tool, 0o4755)
    os.link(tool, root / "bin" / "tool-hardlink")
    (root / "bin" / "sh").symlink_to("/bin/tool")
    (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    os.mkfifo(root / "etc" / "fifo")
    if IS_ROOT:
        os.chown(root / "etc" / "passwd", 65532, 65533)
    return root


def build(rootfs: Path, out: Path, *extra: str) -> str:
    proc = subprocess.run([sys.executable, str(MKIMAGE), "--rootfs", str(rootfs), "--ref", REF, "--out", str(out),
                           "--entrypoint", '["/bin/sh"]', "--user", "65532:65532", "--workdir", "/tmp",
                           "--env", "PATH=/bin", *extra], capture_output=True, text=True, check=True, timeout=120)
    return proc.stdout.strip()


def read_member(archive: tarfile.TarFile, name: str) -> bytes:
    return archive.extractfile(name).read()


def blob(archive: tarfile.TarFile, digest: str) -> bytes:
    data = read_member(archive, "blobs/sha256/" + digest.removeprefix("sha256:"))
    assert hashlib.sha256(data).hexdigest() == digest.removeprefix("sha256:"), "blob content != its digest"
    return data


def test_archive_is_an_oci_layout_with_a_docker_manifest(rootfs, tmp_path):
    out = tmp_path / "image.tar"
    digest = build(rootfs, out)
    with tarfile.open(out) as archive:
        names = archive.getnames()
        assert {"index.json", "oci-layout", "manifest.json"} <= set(names)
        assert names == sorted(names)
        index = json.loads(read_member(archive, "index.json"))
        [entry] = index["manifests"]
        assert entry["digest"] == digest
        assert entry["annotations"]["io.containerd.image.name"] == REF
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == REF
        manifest = json.loads(blob(archive, digest))
        config = json.loads(blob(archive, manifest["config"]["digest"]))
        [layer_desc] = manifest["layers"]
        layer = blob(archive, layer_desc["digest"])
        assert len(layer) == layer_desc["size"]
        assert config["rootfs"]["diff_ids"] == [layer_desc["digest"]]
        assert config["config"] == {"Entrypoint": ["/bin/sh"], "User": "65532:65532", "WorkingDir": "/tmp",
                                    "Env": ["PATH=/bin"]}
        [docker] = json.loads(read_member(archive, "manifest.json"))
        assert docker["RepoTags"] == [REF]
        assert docker["Layers"] == ["blobs/sha256/" + layer_desc["digest"].removeprefix("sha256:")]


def layer_members(out: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(out) as archive:
        manifest = json.loads(blob(archive, json.loads(read_member(archive, "index.json"))["manifests"][0]["digest"]))
        layer = blob(archive, manifest["layers"][0]["digest"])
    with tarfile.open(fileobj=io.BytesIO(layer)) as layer_tar:
        return {member.name: member for member in layer_tar.getmembers()}


def test_layer_keeps_modes_links_and_owners(rootfs, tmp_path):
    out = tmp_path / "image.tar"
    build(rootfs, out)
    members = layer_members(out)
    assert members["bin/tool"].isreg() and members["bin/tool"].mode == 0o4755
    assert members["bin/tool-hardlink"].islnk() and members["bin/tool-hardlink"].linkname == "bin/tool"
    assert members["bin/sh"].issym() and members["bin/sh"].linkname == "/bin/tool"
    assert members["tmp"].isdir() and members["tmp"].mode == 0o1777
    assert members["etc/fifo"].isfifo()
    assert all(member.mtime == 0 and member.uname == "" for member in members.values())
    if IS_ROOT:
        assert (members["etc/passwd"].uid, members["etc/passwd"].gid) == (65532, 65533)


def test_same_rootfs_gives_the_same_digest_and_bytes(rootfs, tmp_path):
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    digest = build(rootfs, first)
    assert build(rootfs, second) == digest
    assert first.read_bytes() == second.read_bytes()
    (rootfs / "etc" / "passwd").write_text("changed\n")
    assert build(rootfs, tmp_path / "c.tar") != digest


def test_device_nodes_are_kept(tmp_path):
    if not IS_ROOT:
        pytest.skip("mknod needs root")
    root = tmp_path / "rootfs"
    (root / "dev").mkdir(parents=True)
    os.mknod(root / "dev" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    out = tmp_path / "image.tar"
    build(root, out)
    null = layer_members(out)["dev/null"]
    assert null.ischr() and (null.devmajor, null.devminor) == (1, 3)
