#!/usr/bin/env bash
# The project's test command (README: "Run the tests"; .ci/run calls it).
# Installs missing dependencies, checks formatting and lints, then runs every
# test in the workspace. Each test starts its own redis-server processes; the
# lock suites run again on a Redis Cluster and on Valkey 9.1.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# hasp without its optional Sentinel and Cluster support (features).
cargo clippy -p hasp --no-default-features --lib --locked -- -D warnings
cargo test --workspace --locked
# The single-lock and family suites again, on a private 3-master Redis Cluster (multi 21),
# and on one server that speaks TLS only (lock 35).
HASP_SPEC_DEPLOYMENT=cluster cargo test -p hasp --test spec --test family --locked
HASP_SPEC_DEPLOYMENT=tls cargo test -p hasp --test spec --test family --locked
# The single-lock, fault and family suites again on Valkey 9.1, whose
# conditional commands (DELIFEQ, SET IFEQ) hasp sends natively
# (scripts/ensure-valkey.sh fetches the binary into .cache/). That build
# of Valkey has no TLS, so the TLS tests are left to the passes above.
status=0
valkey=$(scripts/ensure-valkey.sh) || status=$?
if [ "$status" -eq 0 ]; then
  REDIS_SERVER="$valkey" cargo test -p hasp --test spec --test faults --test family --locked -- --skip tls::
elif [ "$status" -eq 2 ]; then
  echo "test.sh: no Valkey binary for this machine; the Valkey pass is skipped" >&2
else
  exit "$status"
fi
