#!/usr/bin/env bash
# Installs what the egress tier runs: Debian's squid-openssl (squid 5 with OpenSSL, as in the proxy image) and
# openssl. Idempotent and quiet when both are there. The package's postinst would start a system squid; a
# policy-rc.d that says no is put in place for the install when the host has none.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod 0755 /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
bash "$here/../../e2e/cluster/install-packages.sh" squid-openssl openssl
