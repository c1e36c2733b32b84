#!/usr/bin/env bash
# A private deployment to load-test, and `seckill-tools bench` against it: one
# redis-server (unix socket), a SQLite file, and INSTANCES (default 2)
# `seckill serve` processes sharing them, all in a temporary directory that
# is removed afterwards. Arguments go to `seckill-tools bench` (see its --help);
# without any, a 20 s closed loop with 128 in flight. The report and charts
# land in ./bench-report unless --out says otherwise. REDIS_TLS=1: the
# instances reach Redis over TLS (see private-deployment.sh).
#   scripts/bench.sh
#   scripts/bench.sh --rate 8000 --duration 30s --out bench-open
#   REDIS_TLS=1 scripts/bench.sh --concurrency 128 --duration 20s
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
cargo build --release --locked -p seckill -p seckill-tools
seckill=target/release/seckill
tools=target/release/seckill-tools

# shellcheck source=scripts/private-deployment.sh
. scripts/private-deployment.sh
database_url="sqlite://$work/seckill.db"
"$seckill" migrate --database-url "$database_url" 2>/dev/null

urls=()
for i in $(seq 1 "${INSTANCES:-2}"); do
  # serve_instance runs in this shell (not a subshell) so its pid is kept.
  serve_instance "bench-$i" --database-url "$database_url" > "$work/url-$i"
  urls+=(--url "$(cat "$work/url-$i")")
done

args=("$@")
((${#args[@]})) || args=(--duration 20s --concurrency 128)
"$tools" bench "${urls[@]}" --redis-url "$redis_url" "${redis_tls_args[@]}" --database-url "$database_url" "${args[@]}"
