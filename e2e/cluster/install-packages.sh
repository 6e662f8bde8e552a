#!/usr/bin/env bash
# Installs Debian packages: those named as arguments, else the ones the local cluster runs on. Idempotent and
# quiet when all are present.
set -euo pipefail
packages=("$@")
[ $# -gt 0 ] || packages=(runc containernetworking-plugins iptables nftables conntrack iproute2
          ethtool socat util-linux mount debootstrap busybox-static libc6-dev gcc curl ca-certificates)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
