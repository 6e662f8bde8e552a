# coderun.local/busybox:1.36 — Debian's static busybox with its applets linked
# (nc, wget, sh, sleep, cat, dmesg, ip, ...), for network and isolation tests.
# The tag is the interface e2e uses; the binary is bookworm's busybox-static.
IMAGE_REF=coderun.local/busybox:1.36
RECIPE_INPUTS=()
MKIMAGE_ARGS=(--cmd '["sh"]' --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)

make_rootfs() {
    local rootfs=$1 debs
    debs=$(dirname "$rootfs")/debs
    mkdir -p "$rootfs" "$debs"
    (cd "$debs" && { apt-get download busybox-static || { apt-get update && apt-get download busybox-static; }; }) >&2
    dpkg-deb -x "$debs"/busybox-static_*.deb "$rootfs"
    rm -rf "$rootfs/usr/share"
    local applet
    for applet in $("$rootfs/bin/busybox" --list-full); do
        [ -e "$rootfs/$applet" ] && continue
        mkdir -p "$rootfs/$(dirname "$applet")"
        ln -s /bin/busybox "$rootfs/$applet"
    done
    mkdir -p "$rootfs/etc" && mkdir -m 1777 "$rootfs/tmp"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
}
