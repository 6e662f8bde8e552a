# coderun.local/egress-proxy:v1 — the egress proxy (docs/egress.md): Debian bookworm minbase with squid-openssl
# (squid 5 built with OpenSSL: it can peek at a TLS ClientHello) and openssl (a throwaway pair for the port that
# peeks), and coderun's helpers (src/coderun/egress, standard library only) run by Debian's python3.
#
# It runs as uid 65532 with a read-only root: squid's runtime files (squid.conf, its pid, the TLS pair, the access
# log, each run's log, the revocation list the admin container writes) go to /run/coderun-egress, an emptyDir; the
# keys (a Secret) are mounted read-only (proxy.py's DEFAULTS name the paths). The same image runs the pod's second
# container, the operator's admin endpoint (coderun-egress-proxy admin). The versions Debian gave are recorded in
# the image and beside it in the cache (PACKAGES_RECORD, ../debian.sh).
IMAGE_REF=coderun.local/egress-proxy:v1
EGRESS_ROOT=/opt/coderun-egress
EGRESS_LIB=/usr/local/lib/coderun-egress
mapfile -t RECIPE_INPUTS < <(cd "$REPO" && printf '%s\n' src/coderun/__init__.py &&
    find src/coderun/egress -type f -name '*.py' | LC_ALL=C sort)
MKIMAGE_ARGS=(--entrypoint "[\"$EGRESS_LIB/bin/coderun-egress-proxy\",\"start\"]" --user 65532:65532 --workdir /tmp
    --env PATH=/usr/local/bin:/usr/sbin:/usr/bin:/bin --env LANG=C.UTF-8)

# The packages: slow (debootstrap), so build.sh caches them apart from the helpers. The proxy faces the network,
# so its packages come with bookworm-security's fixes (squid's among them). Installing squid must not start it
# in the build's chroot (its postinst would, on the build host's network): policy-rc.d says no.
make_base_rootfs() {
    local rootfs=$1 apt
    debian_rootfs "$rootfs" egress /tmp
    echo "deb ${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security} bookworm-security main" \
        >>"$rootfs/etc/apt/sources.list"
    printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
    chmod 0755 "$rootfs/usr/sbin/policy-rc.d"
    find "$CACHE_DIR/debs/bookworm" -name '*.deb' -exec cp -t "$rootfs/var/cache/apt/archives/" {} +
    apt=(chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive apt-get -y -q --no-install-recommends)
    "${apt[@]}" update >&2
    "${apt[@]}" upgrade >&2
    "${apt[@]}" install squid-openssl openssl >&2
    cp -u "$rootfs"/var/cache/apt/archives/*.deb "$CACHE_DIR/debs/bookworm/"
    rm -f "$rootfs/usr/sbin/policy-rc.d"
    # squid's own configuration and service files are never used (proxy.py renders squid.conf at start).
    rm -rf "$rootfs"/etc/squid/* "$rootfs"/etc/init.d/squid "$rootfs"/etc/logrotate.d/squid
    slim_rootfs "$rootfs"
    precompile_python "$rootfs" /usr/lib/python3.11
    debian_finish "$rootfs"
}

# The helpers on top of the cached packages (their files are the RECIPE_INPUTS), then squid parses the config
# they render, as uid 65532.
make_rootfs() {
    local rootfs=$1 file
    while read -r file; do
        install -D -m 0644 "$REPO/$file" "$rootfs$EGRESS_ROOT/${file#src/}"
    done < <(printf '%s\n' "${RECIPE_INPUTS[@]}")
    precompile_python "$rootfs" "$EGRESS_ROOT"
    chroot "$rootfs" /usr/bin/env -i PATH=/usr/bin:/bin python3 -I -c "import sys
sys.path.insert(0, '$EGRESS_ROOT')
from coderun.egress.squid_config import write_error_pages, write_launchers
write_launchers('$EGRESS_LIB/bin', '/usr/bin/python3', '$EGRESS_ROOT')
write_error_pages('$EGRESS_LIB/errors')" >&2
    mkdir -p "$rootfs/run/coderun-egress" "$rootfs/etc/coderun-egress/keys"
    verify_egress_rootfs "$rootfs"  # needs the base's /dev/null, so before /dev is emptied
    rm -rf "${rootfs:?}"/dev/* "${rootfs:?}"/tmp/* "${rootfs:?}"/run/coderun-egress/*
}

# As uid 65532: every helper module imports from its build-time byte-code with nothing but the standard library,
# and squid accepts the configuration the entrypoint renders (squid -k parse; nothing listens).
verify_egress_rootfs() {
    local rootfs=$1 parsed as_proxy=(chroot --userspec=65532:65532 "$rootfs" /usr/bin/env -i
        PATH=/usr/sbin:/usr/bin:/bin HOME=/tmp CODERUN_EGRESS_STATE=/tmp/verify)
    verify_precompiled "${as_proxy[@]}" PYTHONPATH=$EGRESS_ROOT python3 -- \
        coderun.egress.helpers coderun.egress.access_log coderun.egress.proxy coderun.egress.admin coderun.egress.relay
    "${as_proxy[@]}" python3 -I -c "import os, sys
sys.path.insert(0, '$EGRESS_ROOT')
from coderun.egress.proxy import prepare, settings_from
prepare(settings_from(os.environ))" >&2
    if ! parsed=$("${as_proxy[@]}" squid -k parse -f /tmp/verify/squid.conf 2>&1) ||
        grep -qE 'FATAL|ERROR|is ignored' <<<"$parsed"; then
        echo "$parsed" | tail -20 >&2
        echo "egress-proxy.sh: squid does not accept the squid.conf the entrypoint renders" >&2
        return 1
    fi
    echo "verified: the helpers import as uid 65532 from build-time byte-code; squid accepts its squid.conf" >&2
}
