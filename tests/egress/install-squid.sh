#!/usr/bin/env bash
# Installs what the egress tier runs: Debian's squid-openssl (squid 5 with OpenSSL, as in the proxy image) and
# openssl. Idempotent and quiet when both are there. The package's postinst would start a system squid; a
# policy-rc.d that says no is put in place for the install when the host has none.
set -euo pipefail
packages=(squid-openssl openssl)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
guard=
if [ ! -e /usr/sbin/policy-rc.d ]; then
  guard=/usr/sbin/policy-rc.d
  printf '#!/bin/sh\nexit 101\n' >"$guard"
  chmod 0755 "$guard"
  trap 'rm -f "$guard"' EXIT
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
