#!/usr/bin/env bash
# The project's test command (README: "Run the tests"; .ci/run calls it).
# Installs missing dependencies, checks formatting and lints, then runs every
# test in the workspace. Each test starts its own redis-server processes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
# The single-lock and family suites again, on a private 3-master Redis Cluster (spec multi 21).
HASP_SPEC_DEPLOYMENT=cluster cargo test -p hasp --test spec --test family --locked
