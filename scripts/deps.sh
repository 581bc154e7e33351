#!/usr/bin/env bash
# Installs the Debian packages Skyloom's build, tests and demo need.
# As root: apt-get update once, then apt-get install -y the missing ones.
# Otherwise: prints the exact command and fails if anything is missing.
set -euo pipefail

pkgs=(
  build-essential meson ninja-build pkg-config python3
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler
  libssl-dev libsodium-dev libhwloc-dev
  libopenblas-openmp-dev libopenblas0-openmp libdnnl-dev
  libsqlite3-dev libjansson-dev libutf8proc-dev libmicrohttpd-dev
  fortunes
  iproute2
  python3-torch python3-numpy prometheus chromium curl
  clang libclang-rt-14-dev libomp-dev
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "skyloom: missing Debian packages: ${missing[*]}" >&2
  echo "install them as root with:" >&2
  echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "skyloom: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null &&
   systemctl is-active --quiet prometheus 2>/dev/null; then
  echo "skyloom: the prometheus package (for the tests' promtool and scrape check) started" \
       "prometheus.service on port 9090; stop it with: systemctl disable --now prometheus" >&2
fi
