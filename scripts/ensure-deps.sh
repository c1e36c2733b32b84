#!/usr/bin/env bash
# Installs what the project needs to build, test and run its demo, when it is
# missing: redis-server, redis-cli and redis-benchmark (Debian package
# redis-server, which pulls in redis-tools). Uses apt-get non-interactively;
# needs root or sudo. Safe to run repeatedly: does nothing if all is present.
set -euo pipefail

need_apt=()
for bin in redis-server redis-cli redis-benchmark; do
  command -v "$bin" >/dev/null 2>&1 || need_apt+=("$bin")
done

if ((${#need_apt[@]})); then
  echo "ensure-deps: missing ${need_apt[*]}; installing Debian package redis-server with apt-get" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "ensure-deps: need root or sudo to apt-get install redis-server" >&2; exit 1; }
    sudo="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null
  # The package starts a system service on port 6379; the project never uses
  # it (every test and the demo start private servers), so leave it be.
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "ensure-deps: cargo not found. Install a Rust toolchain (1.88 or newer) with rustup: https://rustup.rs" >&2
  exit 1
fi
