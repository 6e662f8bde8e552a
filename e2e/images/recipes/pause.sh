# coderun.local/pause:3.10 — the pod sandbox image: one static binary.
IMAGE_REF=coderun.local/pause:3.10
RECIPE_INPUTS=(e2e/images/recipes/pause.c)
MKIMAGE_ARGS=(--entrypoint '["/pause"]' --user 65535:65535)

make_rootfs() {
    local rootfs=$1
    mkdir -p "$rootfs"
    gcc -static -Os -s -Wall -Werror -o "$rootfs/pause" "$RECIPES/pause.c"
}
