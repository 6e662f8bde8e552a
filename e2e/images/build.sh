#!/usr/bin/env bash
# Build one registry-free image archive from a recipe under recipes/, cached by
# the hash of everything the recipe reads, so it is rebuilt only on change.
#
# A recipe may split its root filesystem in two: make_base_rootfs (the slow
# part, e.g. Debian packages) is cached on its own as a tar under OUTDIR/base,
# keyed by the build scripts, the recipe and BASE_INPUTS, without RECIPE_INPUTS;
# make_rootfs then adds what RECIPE_INPUTS bring (e.g. the runner) to a fresh
# copy of it. So a change to the runner rebuilds the image in seconds, not minutes.
#
#   e2e/images/build.sh NAME [OUTDIR]
#
# NAME is a recipe under recipes/: pause, busybox, python, node, operator or
# egress-proxy. The archive lands in OUTDIR (default
# ${CODERUN_CACHE:-$HOME/.cache/coderun}/images) as NAME-<key>.tar; its path is
# the last line on stdout (build logs go to stderr). Import it with
#   ctr -n k8s.io images import "$(e2e/images/build.sh NAME | tail -n 1)"
# An image whose root filesystem records its packages (PACKAGES_RECORD, debian.sh) has that record beside the
# archive too, as NAME-<key>.packages.txt. A build writes only under OUTDIR, never into the checkout.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
RECIPES=$HERE/recipes
CACHE_DIR=${CODERUN_CACHE:-$HOME/.cache/coderun}

NAME=${1:?usage: build.sh NAME [OUTDIR]  (NAME: $(cd "$RECIPES" && ls -- *.sh | sed 's/\.sh$//' | tr '\n' ' '))}
OUTDIR=${2:-$CACHE_DIR/images}
RECIPE=$RECIPES/$NAME.sh
[ -f "$RECIPE" ] || { echo "build.sh: no recipe $RECIPE" >&2; exit 2; }
# Files (relative to the repository) that key the base in addition to the build
# scripts and the recipe, for a make_base_rootfs that reads them: e.g. the
# operator's base installs the dependencies pyproject.toml names. They key the
# image too, as it is built on the base. A recipe may set it; none by default.
BASE_INPUTS=()
# shellcheck source=debian.sh
source "$HERE/debian.sh"  # the Debian steps recipes share
# shellcheck source=/dev/null
source "$RECIPE"  # sets IMAGE_REF, RECIPE_INPUTS, MKIMAGE_ARGS and make_rootfs (maybe BASE_INPUTS, make_base_rootfs)

recipe_key() {
    (cd "$REPO" && sha256sum e2e/images/build.sh e2e/images/debian.sh e2e/images/mkimage.py "e2e/images/recipes/$NAME.sh" \
        ${BASE_INPUTS[@]+"${BASE_INPUTS[@]}"} ${RECIPE_INPUTS[@]+"${RECIPE_INPUTS[@]}"}) | sha256sum | cut -c1-16
}

base_key() {
    (cd "$REPO" && sha256sum e2e/images/build.sh e2e/images/debian.sh e2e/images/mkimage.py "e2e/images/recipes/$NAME.sh" \
        ${BASE_INPUTS[@]+"${BASE_INPUTS[@]}"}) | sha256sum | cut -c1-16
}

# Fill the empty dir $1 with the recipe's base rootfs: unpacked from its cache, or built and then cached.
base_rootfs() {
    local rootfs=$1 key base
    key=$(base_key)
    base=$OUTDIR/base/$NAME-$key.tar
    mkdir -p "$OUTDIR/base" "$rootfs"
    if [ -s "$base" ]; then
        echo "build.sh: base of $NAME from $base" >&2
        tar --numeric-owner -xpf "$base" -C "$rootfs"
        return
    fi
    echo "build.sh: building the base of $NAME" >&2
    make_base_rootfs "$rootfs"
    tar --numeric-owner -cf "$WORK/base.tar" -C "$rootfs" .
    if [ "$(base_key)" != "$key" ]; then
        echo "build.sh: recipe changed during the build; not caching it, run again" >&2
        exit 1
    fi
    mv "$WORK/base.tar" "$base"
    find "$OUTDIR/base" -maxdepth 1 -name "$NAME-*.tar" ! -path "$base" -delete  # stale keys
}

mkdir -p "$OUTDIR"
KEY=$(recipe_key)
ARCHIVE=$OUTDIR/$NAME-$KEY.tar
RECORD=$OUTDIR/$NAME-$KEY.packages.txt
exec 9>"$OUTDIR/.$NAME.lock"
flock 9  # one build per recipe at a time; the loser finds the winner's archive
if [ ! -s "$ARCHIVE" ]; then
    started=$SECONDS
    WORK=$(mktemp -d "$OUTDIR/.build-$NAME.XXXXXX")
    trap 'rm -rf "$WORK"' EXIT
    echo "build.sh: building $IMAGE_REF from recipes/$NAME.sh" >&2
    if declare -F make_base_rootfs >/dev/null; then
        base_rootfs "$WORK/rootfs"
    fi
    make_rootfs "$WORK/rootfs"
    digest=$(python3 "$HERE/mkimage.py" --rootfs "$WORK/rootfs" --ref "$IMAGE_REF" --out "$WORK/image.tar" \
        "${MKIMAGE_ARGS[@]}")
    if [ "$(recipe_key)" != "$KEY" ]; then  # an input was edited mid-build: the key would lie
        echo "build.sh: recipe inputs changed during the build; not caching it, run again" >&2
        exit 1
    fi
    if [ -f "$WORK/rootfs/$PACKAGES_RECORD" ]; then
        cp "$WORK/rootfs/$PACKAGES_RECORD" "$RECORD"
    fi
    mv "$WORK/image.tar" "$ARCHIVE"
    find "$OUTDIR" -maxdepth 1 \( -name "$NAME-*.tar" -o -name "$NAME-*.packages.txt" \) \
        ! -path "$ARCHIVE" ! -path "$RECORD" -delete  # stale keys
    echo "build.sh: $IMAGE_REF $digest ($(du -h "$ARCHIVE" | cut -f1), $((SECONDS - started)) s)" >&2
fi
echo "$ARCHIVE"
