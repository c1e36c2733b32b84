#!/usr/bin/env bash
# Installs what the project needs to build, test and run its demo, when it is
# missing, from Debian's packages with apt-get (non-interactive; needs root or
# sudo). Safe to run repeatedly: does nothing if all is present.
#   redis-server, redis-cli, redis-benchmark  <- redis-server, redis-tools
#   PostgreSQL (initdb, postgres, psql)        <- postgresql
#   MariaDB (mariadbd, mariadb-install-db)     <- mariadb-server, mariadb-client
#   chromium, chromedriver (the pages' tests)  <- chromium, chromium-driver
#   node, npm (to fetch axe-core)               <- nodejs, npm
#   axe-core (the pages' accessibility checks)  <- npm, the version pinned in
#                                                  tools/axe/package.json
# The tests start private instances of each (unix sockets in temporary
# directories); they never use the system services these packages start.
set -euo pipefail

packages=()
for bin in redis-server redis-cli redis-benchmark; do
  command -v "$bin" >/dev/null 2>&1 || { packages+=(redis-server redis-tools); break; }
done
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || ! command -v psql >/dev/null 2>&1; then
  packages+=(postgresql postgresql-client)
fi
for bin in mariadbd mariadb-install-db mariadb; do
  command -v "$bin" >/dev/null 2>&1 || { packages+=(mariadb-server mariadb-client); break; }
done

for bin in chromium chromedriver; do
  [ -x "/usr/bin/$bin" ] || command -v "$bin" >/dev/null 2>&1 || { packages+=(chromium chromium-driver); break; }
done

for bin in node npm; do
  command -v "$bin" >/dev/null 2>&1 || { packages+=(nodejs npm); break; }
done

if ((${#packages[@]})); then
  echo "ensure-deps: installing ${packages[*]} with apt-get" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "ensure-deps: need root or sudo to apt-get install ${packages[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get -o DPkg::Lock::Timeout=300 update -qq
  $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ ! -f "$root/tools/axe/node_modules/axe-core/axe.min.js" ]; then
  echo "ensure-deps: installing axe-core with npm (tools/axe)" >&2
  (cd "$root/tools/axe" && npm install --no-save --silent >/dev/null)
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "ensure-deps: cargo not found. Install a Rust toolchain (1.94 or newer) with rustup: https://rustup.rs" >&2
  exit 1
fi
