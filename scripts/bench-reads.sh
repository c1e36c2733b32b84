#!/usr/bin/env bash
# The read path of a hot sale: `wrk` (64 connections, 2 threads) on one
# `seckill serve` instance of a private deployment (one redis-server, a
# SQLite file), alternating GET /healthz and GET /api/vouchers/{id} for
# ROUNDS rounds (default 3) of SECONDS each (default 10), then the median of
# each and their ratio. Also prints the Redis commands per second each
# route cost. Installs wrk from Debian's packages when it is missing.
#   scripts/bench-reads.sh
#   ROUNDS=5 SECONDS_EACH=20 scripts/bench-reads.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
if ! command -v wrk >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends wrk >/dev/null
fi
cargo build --release --locked -p seckill
seckill=target/release/seckill

# shellcheck source=scripts/private-deployment.sh
. scripts/private-deployment.sh
database_url="sqlite://$work/seckill.db"
"$seckill" migrate --database-url "$database_url" 2>/dev/null
serve_instance reads --database-url "$database_url" > "$work/url"
base=$(cat "$work/url")

admin=$("$seckill" token --admin)
now=$(date +%s%3N)
voucher=$(curl -sf -X POST "$base/api/vouchers" -H "authorization: Bearer $admin" \
  -H 'content-type: application/json' \
  -d "{\"title\":\"Hot sale\",\"stock\":1000,\"begin_ms\":$((now - 1000)),\"end_ms\":$((now + 3600000))}" |
  sed -E 's/.*"id":([0-9]+).*/\1/')

rounds=${ROUNDS:-3}
seconds=${SECONDS_EACH:-10}
commands() { redis-cli -s "$work/redis.sock" info stats | sed -n 's/^total_commands_processed:\([0-9]*\).*/\1/p'; }
measure() { # route -> requests/s, then Redis commands/s
  local before after out
  before=$(commands)
  out=$(wrk -t2 -c64 -d"${seconds}s" "$base$1")
  after=$(commands)
  echo "$out" | sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p'
  echo $(((after - before) / seconds))
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

health=() voucher_rates=() health_redis=() voucher_redis=()
for round in $(seq 1 "$rounds"); do
  mapfile -t h < <(measure /healthz)
  mapfile -t v < <(measure "/api/vouchers/$voucher")
  health+=("${h[0]}") health_redis+=("${h[1]}")
  voucher_rates+=("${v[0]}") voucher_redis+=("${v[1]}")
  echo "round $round: /healthz ${h[0]} req/s (Redis ${h[1]} cmd/s), /api/vouchers/$voucher ${v[0]} req/s (Redis ${v[1]} cmd/s)"
done
h=$(printf '%s\n' "${health[@]}" | median)
v=$(printf '%s\n' "${voucher_rates[@]}" | median)
echo "median of $rounds: /healthz $h req/s, /api/vouchers/{id} $v req/s: $(awk -v a="$v" -v b="$h" 'BEGIN {printf "%.0f%%", 100 * a / b}') of /healthz"
echo "Redis commands/s during the voucher reads (median): $(printf '%s\n' "${voucher_redis[@]}" | median)"
