# coderun.local/operator:v1 — the operator (`coderun-operator`, i.e. kopf with coderun's handlers) in a
# venv at /opt/coderun/venv on Debian bookworm minbase with Debian's Python 3.11. The same content as the
# operator/Dockerfile, without Docker or a registry.
#
# Two layers of caching (see build.sh): the base (debootstrap, then the third-party dependencies that
# pyproject.toml names for the package and its `operator` extra, from PyPI at the versions
# operator/requirements.txt pins) is keyed by those two files through BASE_INPUTS; the image on top of it (the coderun package itself, built as a wheel from exactly
# the files in RECIPE_INPUTS) by pyproject.toml, README.md, LICENSE and every file under src/coderun and operator/coderun_operator. So an edit to
# the code rebuilds the image in seconds; a change to the dependencies rebuilds the base.
#
# Byte-code is compiled at build time as unchecked-hash .pyc (precompile_python in ../debian.sh says why).
IMAGE_REF=coderun.local/operator:v1
VENV=/opt/coderun/venv
BASE_INPUTS=(pyproject.toml operator/requirements.txt)
mapfile -t RECIPE_INPUTS < <(cd "$REPO" && printf '%s\n' pyproject.toml README.md LICENSE &&
    find src/coderun operator/coderun_operator -type f ! -path '*/__pycache__/*' ! -name '*.py[co]' | LC_ALL=C sort)
MKIMAGE_ARGS=(--entrypoint "[\"$VENV/bin/coderun-operator\"]" --user 65532:65532 --workdir /tmp
    --env "PATH=$VENV/bin:/usr/local/bin:/usr/bin:/bin" --env LANG=C.UTF-8
    --env PYTHONDONTWRITEBYTECODE=1 --env PYTHONUNBUFFERED=1)
OPERATOR_DEBS=(python3 python3-venv ca-certificates)

# Run a command in the rootfs $1 with a clean environment (nothing of the host's PYTHON*/PIP* settings).
operator_chroot() {
    local rootfs=$1
    shift
    chroot "$rootfs" /usr/bin/env -i "PATH=$VENV/bin:/usr/bin:/bin" HOME=/root LANG=C.UTF-8 "$@"
}

# The packages and the third-party dependencies: slow (debootstrap, then PyPI), so build.sh caches them
# apart from the code, keyed by pyproject.toml and operator/requirements.txt.
make_base_rootfs() {
    local rootfs=$1 deps
    debian_rootfs "$rootfs" coderun /tmp "${OPERATOR_DEBS[*]}"

    # The dependencies of the package and of its `operator` extra, as pyproject.toml states them.
    mapfile -t deps < <(python3 -c 'import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print(*project["dependencies"], *project["optional-dependencies"]["operator"], *project["optional-dependencies"]["audit"], sep="\n")' "$REPO/pyproject.toml")
    [ "${#deps[@]}" -gt 0 ] || { echo "operator.sh: no dependencies read from pyproject.toml" >&2; return 1; }
    operator_chroot "$rootfs" python3 -m venv "$VENV"
    # Wheels only (there is no compiler in the image). Behind a TLS-intercepting proxy, the host's PIP_CERT
    # (its CA bundle) is used in the chroot for the download, then removed.
    local pip_env=(PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ONLY_BINARY=:all:)
    if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
        cp "$PIP_CERT" "$rootfs/tmp/pip-cert.pem"
        pip_env+=(PIP_CERT=/tmp/pip-cert.pem)
    fi
    cp "$REPO/operator/requirements.txt" "$rootfs/tmp/constraints.txt"  # the pinned versions
    operator_chroot "$rootfs" "${pip_env[@]}" "$VENV/bin/pip" install -c /tmp/constraints.txt "${deps[@]}" >&2
    rm -f "$rootfs/tmp/constraints.txt"
    rm -f "$rootfs/tmp/pip-cert.pem"
    echo "operator.sh: installed from PyPI:" >&2
    operator_chroot "$rootfs" "$VENV/bin/pip" --disable-pip-version-check freeze --all | sed 's/^/  /' >&2

    slim_rootfs "$rootfs"
    precompile_python "$rootfs" /usr/lib/python3.11 /usr/lib/python3/dist-packages "$VENV/lib"
    debian_finish "$rootfs"
}

# The coderun package itself (the RECIPE_INPUTS), as a wheel built on the host from exactly those files,
# installed into the venv without dependencies (the base has them), then checked as uid 65532.
make_rootfs() {
    local rootfs=$1 src=$WORK/operator-src
    mkdir -p "$src" "$WORK/operator-wheel"
    (cd "$REPO" && cp --parents -t "$src" "${RECIPE_INPUTS[@]}")
    python3 -m pip wheel --quiet --no-deps --disable-pip-version-check -w "$WORK/operator-wheel" "$src" >&2
    mkdir -p "$rootfs/tmp/wheel"
    cp "$WORK"/operator-wheel/coderun-*.whl "$rootfs/tmp/wheel/"
    operator_chroot "$rootfs" sh -c "$VENV/bin/pip install --quiet --no-deps --no-index --no-cache-dir \
        --disable-pip-version-check /tmp/wheel/coderun-*.whl" >&2
    rm -rf "$rootfs/tmp/wheel"
    # pip and setuptools were for the build: the operator does not use them.
    operator_chroot "$rootfs" "$VENV/bin/python" -m pip uninstall --quiet -y pip setuptools >&2
    precompile_python "$rootfs" "$VENV/lib/python3.11/site-packages/coderun" \
        "$VENV/lib/python3.11/site-packages/coderun_operator"
    verify_operator_rootfs "$rootfs"  # needs the base's /dev/null, so before /dev is emptied
    rm -rf "${rootfs:?}"/dev/* "${rootfs:?}"/tmp/* "${rootfs:?}"/root/.cache
}

# As uid 65532, as in the pod (which can write only /tmp): the handlers and the native dependencies
# import, every module imported has its byte-code from the build (nothing compiled at run time), and
# the entry point runs.
verify_operator_rootfs() {
    local rootfs=$1
    local as_operator=(chroot --userspec=65532:65532 "$rootfs" /usr/bin/env -i "PATH=$VENV/bin:/usr/bin:/bin"
        HOME=/tmp LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1)
    verify_precompiled "${as_operator[@]}" "$VENV/bin/python" -- coderun_operator.handlers kopf re2 cryptography \
        coderun.audit.agent
    "${as_operator[@]}" "$VENV/bin/coderun-operator" --help >/dev/null
    "${as_operator[@]}" "$VENV/bin/coderun-audit-agent" --help >/dev/null
    echo "verified: coderun-operator --help and coderun-audit-agent --help run as 65532" >&2
}
