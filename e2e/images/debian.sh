# The Debian steps the recipes share, sourced by build.sh (and so part of every image's key).

DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

# debian_rootfs ROOTFS USER HOME PACKAGE_GROUP...: bookworm minbase with Python 3 (the runner's, or the
# operator's), then each group of packages installed in its own apt call, in order (a group is one word of
# space-separated names). Downloads are cached in $CACHE_DIR/debs across builds. USER is uid/gid 65532.
debian_rootfs() {
    local rootfs=$1 user=$2 home=$3 debs=$CACHE_DIR/debs/bookworm group
    shift 3
    command -v debootstrap >/dev/null || apt-get install -y debootstrap >&2
    mkdir -p "$debs"
    debootstrap --variant=minbase --include=python3 --cache-dir="$debs" bookworm "$rootfs" "$DEBIAN_MIRROR" >&2
    cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
    find "$debs" -name '*.deb' -exec cp -t "$rootfs/var/cache/apt/archives/" {} +  # reuse earlier downloads
    local apt=(chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive apt-get -y -q --no-install-recommends)
    "${apt[@]}" update >&2
    for group in "$@"; do
        # shellcheck disable=SC2086 - a group is a list of names
        "${apt[@]}" install $group >&2
    done
    cp -u "$rootfs"/var/cache/apt/archives/*.deb "$debs/"
    echo "$user:x:65532:65532:$user:$home:/usr/sbin/nologin" >>"$rootfs/etc/passwd"
    echo "$user:x:65532:" >>"$rootfs/etc/group"
    chmod 1777 "$rootfs/tmp"
}

# Drop what an image never needs: package caches, docs, logs and the test
# suites of the Python libraries (about 110 MB in the python image).
slim_rootfs() {
    local rootfs=$1
    rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* \
        "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
        "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old "$rootfs"/root/.bash_history
    [ ! -d "$rootfs/usr/lib/python3/dist-packages" ] ||
        find "$rootfs/usr/lib/python3/dist-packages" -depth -type d -name tests -exec rm -rf {} +
    find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
    find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
}

# Where an image records the package versions Debian gave its build, inside its root filesystem; build.sh copies
# it beside the image's archive in the cache. A record, not a pin: the images take Debian's current packages (its
# security updates matter more here than a byte-identical rebuild), so each build may differ, and no build writes
# into the checkout. A run's status names the image digest it ran.
PACKAGES_RECORD=usr/share/coderun/packages.txt

# debian_finish ROOTFS: record the package versions (PACKAGES_RECORD) and drop the files the container runtime
# provides.
debian_finish() {
    local rootfs=$1
    mkdir -p "$rootfs/$(dirname "$PACKAGES_RECORD")"
    chroot "$rootfs" dpkg-query -W -f '${Package}=${Version}\n' | LC_ALL=C sort >"$rootfs/$PACKAGES_RECORD"
    rm -rf "$rootfs"/etc/resolv.conf "$rootfs"/etc/hostname
}

# precompile_python ROOTFS DIR...: byte-code for every module under DIRs (inside ROOTFS) as unchecked-hash
# .pyc. mkimage.py gives every file the same mtime, which makes the timestamp-checked .pyc files Debian and
# pip write stale, and the root filesystem is read-only at run time: without this, Python would compile
# numpy, pandas (or the operator's dependencies) in memory on every start.
precompile_python() {
    local rootfs=$1
    shift
    chroot "$rootfs" /usr/bin/env -i PATH=/usr/bin:/bin python3 -m compileall -q -f \
        --invalidation-mode unchecked-hash -x '/lib2to3/tests/' "$@" >&2
}

# verify_precompiled COMMAND... -- MODULE...: with COMMAND (the image's python, run in its root filesystem as its
# user), import the MODULEs and fail unless every module imported has its byte-code from the build: an
# unchecked-hash .pyc (precompile_python), used without its source being looked at, so nothing is compiled at
# run time.
verify_precompiled() {
    local command=()
    while [ "$1" != -- ]; do
        command+=("$1")
        shift
    done
    shift
    "${command[@]}" -c 'import importlib, sys
def compiled(cached):  # a .pyc from the build, valid without its source being checked
    try:
        with open(cached, "rb") as pyc:
            return int.from_bytes(pyc.read(8)[4:8], "little") == 0b01
    except OSError:
        return False
for name in sys.argv[1:]:
    importlib.import_module(name)
stale = sorted(m.__name__ for m in list(sys.modules.values()) if getattr(m, "__cached__", None) and not compiled(m.__cached__))
assert not stale, f"modules without build-time byte-code: {stale}"
print("verified:", len(sys.argv) - 1, "modules import with", len(sys.modules), "in all, all precompiled", file=sys.stderr)' "$@"
}

# The coderun runner, the entrypoint of every sandbox image: the package src/coderun/sandbox/runner with its
# parents' __init__.py, at the same paths under /opt/coderun, and the package's __main__.py beside them, so that
# `python3 -I /opt/coderun` runs it. -I: the path is /opt/coderun and the standard library, whatever the working
# directory, and no PYTHON* variable is read. The program's environment is the runner's own making (child.py),
# so nothing of this reaches it.
RUNNER_ENTRYPOINT='["python3","-I","/opt/coderun"]'

# The runner's files, relative to the repository, one a line: a sandbox recipe's RECIPE_INPUTS.
runner_files() {
    (cd "$REPO" && printf '%s\n' src/coderun/__init__.py src/coderun/sandbox/__init__.py &&
        find src/coderun/sandbox/runner -type f \( -name '*.py' -o -name '*.js' \) | LC_ALL=C sort)
}

# install_runner ROOTFS: the runner at /opt/coderun, compiled like the rest of the image, and every module of it
# checked, as the sandbox user, to import from that byte-code (and Node's preload beside them).
install_runner() {
    local rootfs=$1 file modules=()
    while read -r file; do
        install -D -m 0644 "$REPO/$file" "$rootfs/opt/coderun/${file#src/}"
        [[ $file == *.py ]] || continue  # Node's preload (prestarted.js): a file, not a module
        file=${file#src/}
        file=${file%.py}
        file=${file%/__init__}
        modules+=("${file//\//.}")
    done < <(runner_files)
    install -m 0644 "$REPO/src/coderun/sandbox/runner/__main__.py" "$rootfs/opt/coderun/__main__.py"
    precompile_python "$rootfs" /opt/coderun
    verify_precompiled chroot --userspec=65532:65532 "$rootfs" /usr/bin/env -i PATH=/usr/bin:/bin \
        PYTHONPATH=/opt/coderun python3 -- "${modules[@]}"
}
