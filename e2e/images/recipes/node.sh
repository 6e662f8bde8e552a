# coderun.local/sandbox-node:v2 — Debian bookworm minbase with Debian's Node.js, Python 3.11 for the coderun
# runner (the entrypoint, the same contract as the python image), and nothing else.
# The versions Debian gave are recorded in the image and beside it in the cache (PACKAGES_RECORD, ../debian.sh).
IMAGE_REF=coderun.local/sandbox-node:v2
mapfile -t RECIPE_INPUTS < <(runner_files)
MKIMAGE_ARGS=(--entrypoint "$RUNNER_ENTRYPOINT" --user 65532:65532 --workdir /tmp
    --env PATH=/usr/local/bin:/usr/bin:/bin --env LANG=C.UTF-8)
NODE_PACKAGES=(nodejs)

# The packages: slow (debootstrap), so build.sh caches them apart from the runner.
make_base_rootfs() {
    local rootfs=$1
    debian_rootfs "$rootfs" sandbox /tmp/home "${NODE_PACKAGES[*]}"
    slim_rootfs "$rootfs"
    precompile_python "$rootfs" /usr/lib/python3.11  # the runner's imports
    debian_finish "$rootfs"
}

# The runner on top of the cached packages (its files are the RECIPE_INPUTS), checked by a real run.
make_rootfs() {
    local rootfs=$1
    install_runner "$rootfs"
    verify_node_rootfs "$rootfs"
    rm -rf "${rootfs:?}"/dev/*  # the runtime provides these
}

# The runner runs a JavaScript program that throws, as uid 65532, as it will in the pod: the frame must carry
# the output and the error's type and line.
verify_node_rootfs() {
    local rootfs=$1 check=$1/tmp/verify
    mkdir -p "$check/in"
    cat >"$check/in/run.json" <<'JSON'
{"version": 1, "language": "javascript", "command": ["node", "main.js"], "codeFile": "main.js",
 "timeoutSeconds": 60, "files": [], "stdinKey": null, "env": {}}
JSON
    printf 'console.log([1, 2, 3].reduce((a, b) => a + b));\nthrow new TypeError("boom");\n' >"$check/in/code"
    chmod -R a+rX "$check" && chown 65532:65532 "$check"
    local frame
    frame=$(chroot --userspec=65532:65532 "$rootfs" python3 -I /opt/coderun --input /tmp/verify/in \
        --work /tmp/verify/work --outputs /tmp/verify/outputs --termination-log /tmp/verify/termination-log | tail -n 1)
    python3 - "$frame" <<'PY'
import json, sys
frame = json.loads(sys.argv[1].split(" ", 1)[1])
assert frame["reason"] == "NonZeroExit" and frame["stdout"] == "6\n", frame
assert frame["error"] == {"type": "TypeError", "message": "boom", "line": 2}, frame["error"]
print("verified: runner ran a JavaScript program in", frame["metrics"]["wallMillis"], "ms", file=sys.stderr)
PY
    rm -rf "$check"
}
