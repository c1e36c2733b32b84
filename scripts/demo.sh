#!/usr/bin/env bash
# The project's main job (README: "Run the demo"). Installs missing
# dependencies, then runs the lock demo against a private redis-server (or
# against REDIS_URL if set). Extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
exec cargo run --release --locked -p hasp --example demo -- "$@"
