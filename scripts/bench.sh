#!/usr/bin/env bash
# A private deployment to load-test, and `seckill bench` against it: one
# redis-server (unix socket), a SQLite file, and INSTANCES (default 2)
# `seckill serve` processes sharing them, all in a temporary directory that
# is removed afterwards. Arguments go to `seckill bench` (see its --help);
# without any, a 20 s closed loop with 128 in flight. The report and charts
# land in ./bench-report unless --out says otherwise.
#   scripts/bench.sh
#   scripts/bench.sh --rate 8000 --duration 30s --out bench-open
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
cargo build --release --locked -p seckill
seckill=target/release/seckill

work=$(mktemp -d /tmp/seckill-bench.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  redis-cli -s "$work/redis.sock" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

redis-server --port 0 --unixsocket "$work/redis.sock" --save "" --appendonly no \
  --dir "$work" --daemonize yes --logfile "$work/redis.log"
until redis-cli -s "$work/redis.sock" ping >/dev/null 2>&1; do sleep 0.05; done

export SECKILL_TOKEN_SECRET="bench-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
redis_url="redis+unix://$work/redis.sock"
database_url="sqlite://$work/seckill.db"
"$seckill" migrate --database-url "$database_url" 2>/dev/null

urls=()
for i in $(seq 1 "${INSTANCES:-2}"); do
  # Every request comes from 127.0.0.1: no per-IP limit.
  "$seckill" serve --redis-url "$redis_url" --database-url "$database_url" \
    --listen 127.0.0.1:0 --consumer "bench-$i" --ip-rate 0 2>"$work/serve-$i.log" &
  pids+=($!)
  until grep -q "listening on" "$work/serve-$i.log"; do
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$work/serve-$i.log" >&2; exit 1; }
    sleep 0.05
  done
  urls+=(--url "$(grep -o 'http://[0-9.:]*' "$work/serve-$i.log" | head -1)")
done

args=("$@")
((${#args[@]})) || args=(--duration 20s --concurrency 128)
"$seckill" bench "${urls[@]}" --redis-url "$redis_url" --database-url "$database_url" "${args[@]}"
