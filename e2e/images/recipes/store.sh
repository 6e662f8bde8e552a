# coderun.local/store:v1 — the chart's embedded S3 store (store.embedded): Versity's S3 gateway, versitygw, one static
# binary (CGO_ENABLED=0) built from its Go module by e2e/cluster/build-binaries.sh, serving a directory (its posix
# backend: a bucket is a directory, an object a file, its metadata extended attributes). Nothing else: no shell,
# no libc. It runs as uid 65532 with a read-only root; the bytes go to /data, the chart's volume.
#
# The binary comes from the cache, not the checkout: the key (build.sh) hashes versions.sh, which pins
# VERSITYGW_VERSION, and build-binaries.sh, which says how it is built, so a new version makes a new image.
IMAGE_REF=coderun.local/store:v1
RECIPE_INPUTS=(e2e/cluster/versions.sh e2e/cluster/build-binaries.sh)
MKIMAGE_ARGS=(--entrypoint '["/usr/local/bin/versitygw"]' --user 65532:65532 --workdir /data)

make_rootfs() {
    local rootfs=$1 bin
    # shellcheck source=../../cluster/versions.sh
    source "$REPO/e2e/cluster/versions.sh"
    bash "$REPO/e2e/cluster/build-binaries.sh" versitygw >&2  # a no-op once the cache holds it
    bin=$CODERUN_CACHE/bin/versitygw-$VERSITYGW_VERSION/versitygw
    mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/data"
    install -m 0755 "$bin" "$rootfs/usr/local/bin/versitygw"
    chown 65532:65532 "$rootfs/data"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/data:/sbin/nologin\n' >"$rootfs/etc/passwd"
    printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
    # Static, or it would not start in an image without a libc.
    if ! file "$rootfs/usr/local/bin/versitygw" | grep -q 'statically linked'; then
        echo "store.sh: $bin is not statically linked" >&2
        return 1
    fi
    "$rootfs/usr/local/bin/versitygw" --version >&2
}
