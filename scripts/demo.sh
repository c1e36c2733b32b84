#!/usr/bin/env bash
# The project's main job (README: "Run the demo"): a whole flash sale on this
# machine — a private redis-server, a SQLite file, the seckill service, 20,000
# simulated users over HTTP, the order pipeline drained, invariants verified
# (exit status 1 if any fails). Installs missing dependencies first. Extra
# arguments go to `seckill-tools demo` (see `--help`: --mode sync, --users, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
exec cargo run --release --locked -p seckill-tools -- demo "$@"
