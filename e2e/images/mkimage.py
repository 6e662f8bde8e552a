#!/usr/bin/env python3
"""Turn a root filesystem directory into a single-layer image archive.

No registry and no Docker daemon are needed: the archive is imported with
`ctr -n k8s.io images import FILE.tar`. It is an OCI image layout (index.json,
oci-layout, blobs/) that also carries a docker-archive manifest.json, as
`docker save` does, so `docker load` accepts it too.

The output is deterministic: entries sorted, fixed mtimes, no user/group
names, so the same rootfs always gives the same manifest digest.
Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import io
import json
import os
import platform
import stat
import sys
import tarfile
import tempfile

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


class HashingWriter:
    """A write-only file object that hashes and counts what passes through."""

    def __init__(self, target):
        self.target = target
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.target.write(data)

    def tell(self) -> int:  # tarfile asks where the stream starts
        return self.size


def rootfs_entries(rootfs: str):
    """Yield (archive name, path) for everything under rootfs, sorted, depth first."""
    for current, dirs, files in os.walk(rootfs):
        dirs.sort()
        relative_dir = os.path.relpath(current, rootfs)
        for name in sorted(dirs + files):
            relative = name if relative_dir == "." else f"{relative_dir}/{name}"
            yield relative, os.path.join(current, name)


def tar_info_for(name: str, info: os.stat_result, path: str, mtime: int,
                 first_link: dict) -> tarfile.TarInfo | None:
    """A TarInfo that keeps mode, owner, symlink target and hardlinks; None for sockets."""
    entry = tarfile.TarInfo(name)
    entry.mode = stat.S_IMODE(info.st_mode)
    entry.uid, entry.gid = info.st_uid, info.st_gid
    entry.uname = entry.gname = ""
    entry.mtime = mtime
    if stat.S_ISDIR(info.st_mode):
        entry.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(info.st_mode):
        entry.type = tarfile.SYMTYPE
        entry.linkname = os.readlink(path)
    elif stat.S_ISREG(info.st_mode):
        inode = (info.st_dev, info.st_ino)
        if info.st_nlink > 1 and inode in first_link:
            entry.type = tarfile.LNKTYPE
            entry.linkname = first_link[inode]
        else:
            first_link.setdefault(inode, name)
            entry.type = tarfile.REGTYPE
            entry.size = info.st_size
    elif stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        entry.type = tarfile.CHRTYPE if stat.S_ISCHR(info.st_mode) else tarfile.BLKTYPE
        entry.devmajor, entry.devminor = os.major(info.st_rdev), os.minor(info.st_rdev)
    elif stat.S_ISFIFO(info.st_mode):
        entry.type = tarfile.FIFOTYPE
    else:
        return None
    return entry


def write_layer(rootfs: str, out, mtime: int) -> None:
    """Write rootfs as an uncompressed tar layer to the file object `out`."""
    first_link: dict = {}
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for name, path in rootfs_entries(rootfs):
            info = os.lstat(path)
            entry = tar_info_for(name, info, path, mtime, first_link)
            if entry is None:
                print(f"mkimage: skipping socket {name}", file=sys.stderr)
            elif entry.type == tarfile.REGTYPE:
                with open(path, "rb") as content:
                    layer.addfile(entry, content)
            else:
                layer.addfile(entry)


def canonical_json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def descriptor(media_type: str, blob: bytes) -> dict:
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(blob).hexdigest(), "size": len(blob)}


def image_config(layer_diff_id: str, arch: str, entrypoint, cmd, user, workdir, env, created) -> dict:
    config = {"Env": env}
    for key, value in (("Entrypoint", entrypoint), ("Cmd", cmd), ("User", user), ("WorkingDir", workdir)):
        if value:
            config[key] = value
    return {
        "architecture": arch,
        "os": "linux",
        "created": created,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer_diff_id]},
        "history": [{"created": created, "created_by": "coderun e2e/images/mkimage.py"}],
    }


def blob_name(digest: str) -> str:
    return "blobs/sha256/" + digest.split(":", 1)[1]


def add_bytes(archive: tarfile.TarFile, name: str, data: bytes, mtime: int) -> None:
    entry = tarfile.TarInfo(name)
    entry.size, entry.mode, entry.mtime = len(data), 0o644, mtime
    archive.addfile(entry, io.BytesIO(data))


def add_dir(archive: tarfile.TarFile, name: str, mtime: int) -> None:
    entry = tarfile.TarInfo(name)
    entry.type, entry.mode, entry.mtime = tarfile.DIRTYPE, 0o755, mtime
    archive.addfile(entry)


def build_archive(rootfs: str, ref: str, out_path: str, arch: str, mtime: int, **config) -> str:
    """Write the image archive and return the manifest digest."""
    out_dir = os.path.dirname(os.path.abspath(out_path))
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".mkimage-") as scratch:
        layer_path = os.path.join(scratch, "layer.tar")
        with open(layer_path, "wb") as raw:
            hashing = HashingWriter(raw)
            write_layer(rootfs, hashing, mtime)
        layer_digest = "sha256:" + hashing.digest.hexdigest()
        created = datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        config_blob = canonical_json(image_config(layer_digest, arch, created=created, **config))
        config_desc = descriptor(OCI_CONFIG, config_blob)
        layer_desc = {"mediaType": OCI_LAYER, "digest": layer_digest, "size": hashing.size}
        manifest_blob = canonical_json({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                                        "config": config_desc, "layers": [layer_desc]})
        manifest_desc = descriptor(OCI_MANIFEST, manifest_blob)
        # containerd reads io.containerd.image.name; other tools read ref.name.
        manifest_desc["annotations"] = {"io.containerd.image.name": ref,
                                        "org.opencontainers.image.ref.name": ref}
        manifest_desc["platform"] = {"architecture": arch, "os": "linux"}
        index_blob = canonical_json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [manifest_desc]})
        docker_manifest = canonical_json([{"Config": blob_name(config_desc["digest"]), "RepoTags": [ref],
                                           "Layers": [blob_name(layer_digest)]}])
        blobs = sorted([(blob_name(config_desc["digest"]), config_blob),
                        (blob_name(manifest_desc["digest"]), manifest_blob),
                        (blob_name(layer_digest), None)])
        tmp_out = os.path.join(scratch, "image.tar")
        with tarfile.open(tmp_out, "w", format=tarfile.PAX_FORMAT) as archive:
            add_dir(archive, "blobs", mtime)
            add_dir(archive, "blobs/sha256", mtime)
            for name, blob in blobs:
                if blob is None:
                    entry = archive.gettarinfo(layer_path, arcname=name)
                    entry.uid = entry.gid = 0
                    entry.uname = entry.gname = ""
                    entry.mode, entry.mtime = 0o644, mtime
                    with open(layer_path, "rb") as content:
                        archive.addfile(entry, content)
                else:
                    add_bytes(archive, name, blob, mtime)
            add_bytes(archive, "index.json", index_blob, mtime)
            add_bytes(archive, "manifest.json", docker_manifest, mtime)
            add_bytes(archive, "oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"}), mtime)
        os.replace(tmp_out, out_path)
    return manifest_desc["digest"]


def json_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SystemExit(f"mkimage: expected a JSON list of strings, got {text!r}")
    return value


def parse_env(pairs: list[str]) -> list[str]:
    for pair in pairs:
        if "=" not in pair or pair.startswith("="):
            raise SystemExit(f"mkimage: --env wants K=V, got {pair!r}")
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rootfs", required=True, help="root filesystem directory")
    parser.add_argument("--ref", required=True, help="image reference, e.g. coderun.local/pause:3.10")
    parser.add_argument("--out", required=True, help="archive to write (.tar)")
    parser.add_argument("--entrypoint", help="JSON list, e.g. '[\"/pause\"]'")
    parser.add_argument("--cmd", help="JSON list")
    parser.add_argument("--user", help="uid[:gid]")
    parser.add_argument("--workdir")
    parser.add_argument("--env", action="append", default=[], help="K=V, repeatable")
    parser.add_argument("--arch", default=GO_ARCH.get(platform.machine(), platform.machine()))
    parser.add_argument("--mtime", type=int, default=int(os.environ.get("SOURCE_DATE_EPOCH", "0")),
                        help="timestamp for every entry (default SOURCE_DATE_EPOCH or 0)")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.rootfs):
        parser.error(f"--rootfs {args.rootfs} is not a directory")
    digest = build_archive(args.rootfs, args.ref, args.out, args.arch, args.mtime,
                           entrypoint=json_list(args.entrypoint), cmd=json_list(args.cmd),
                           user=args.user, workdir=args.workdir, env=parse_env(args.env))
    print(digest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
