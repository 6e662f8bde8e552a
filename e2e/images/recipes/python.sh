# coderun.local/sandbox-python:v2 — Debian bookworm minbase with Python 3.11,
# numpy, pandas, matplotlib and pip from Debian, and the coderun runner as entrypoint.
# The versions Debian gave are recorded in the image and beside it in the cache (PACKAGES_RECORD, ../debian.sh).
IMAGE_REF=coderun.local/sandbox-python:v2
mapfile -t RECIPE_INPUTS < <(runner_files)
MKIMAGE_ARGS=(--entrypoint "$RUNNER_ENTRYPOINT" --user 65532:65532 --workdir /tmp
    --env PATH=/usr/local/bin:/usr/bin:/bin --env LANG=C.UTF-8)
# fonttools (via matplotlib) depends on "python3-scipy | python3-munkres":
# installing munkres first keeps scipy and the compiler toolchain it drags in
# (pythran, g++, python3-dev) out of the image.
PYTHON_PACKAGES_FIRST=(python3-munkres)
# pip: a policy with egress by name can let a program fetch packages from an index (docs/egress.md).
PYTHON_PACKAGES=(python3-numpy python3-pandas python3-matplotlib python3-pip)

# The packages: slow (debootstrap, ~2 min), so build.sh caches them apart from the runner.
make_base_rootfs() {
    local rootfs=$1
    debian_rootfs "$rootfs" sandbox /tmp/home "${PYTHON_PACKAGES_FIRST[*]}" "${PYTHON_PACKAGES[*]}"
    slim_rootfs "$rootfs"
    precompile_python "$rootfs" /usr/lib/python3.11 /usr/lib/python3/dist-packages
    debian_finish "$rootfs"
}

# The runner on top of the cached packages (its files are the RECIPE_INPUTS), checked by a real run.
make_rootfs() {
    local rootfs=$1
    install_runner "$rootfs"
    verify_python_rootfs "$rootfs"  # needs the base's /dev/null, so before /dev is emptied
    rm -rf "${rootfs:?}"/dev/*  # the runtime provides these
}

# The libraries import (after slimming), and the runner runs a plotting
# program as uid 65532, as it will in the pod.
verify_python_rootfs() {
    local rootfs=$1 check=$1/tmp/verify
    chroot "$rootfs" python3 -c 'import numpy, pandas, matplotlib; matplotlib.use("Agg")'
    mkdir -p "$check/in"
    cat >"$check/in/run.json" <<'JSON'
{"version": 1, "language": "python", "command": ["python3", "-u", "main.py"], "codeFile": "main.py",
 "timeoutSeconds": 60, "files": [], "stdinKey": null, "env": {}}
JSON
    cat >"$check/in/code" <<'PY'
import os, numpy as np, pandas as pd, matplotlib.pyplot as plt
frame = pd.DataFrame({"x": np.arange(5), "y": np.arange(5) ** 2})
frame.plot(x="x", y="y").figure.savefig(os.path.join(os.environ["CODERUN_OUTPUT_DIR"], "plot.png"))
print(int(frame.y.sum()))
PY
    chmod -R a+rX "$check" && chown 65532:65532 "$check"
    local frame
    frame=$(chroot --userspec=65532:65532 "$rootfs" python3 -I /opt/coderun --input /tmp/verify/in \
        --work /tmp/verify/work --outputs /tmp/verify/outputs --termination-log /tmp/verify/termination-log | tail -n 1)
    python3 - "$frame" <<'PY'
import json, sys
frame = json.loads(sys.argv[1].split(" ", 1)[1])
assert frame["reason"] == "Completed" and frame["stdout"] == "30\n", frame
assert [a["name"] for a in frame["artifacts"]] == ["plot.png"], frame["artifactsSkipped"]
print("verified: runner ran a pandas/matplotlib program in", frame["metrics"]["wallMillis"], "ms", file=sys.stderr)
PY
    rm -rf "$check"
}
