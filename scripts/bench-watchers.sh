#!/usr/bin/env bash
# Many watchers on one instance: WATCHERS (default 5,000) open live streams
# (`seckill-tools watch`) on one `seckill serve` of a private deployment (one
# redis-server, a SQLite file, one open sale). Five phases of SECONDS_EACH
# (default 15) seconds:
#   1. idle, no watcher   2. idle, one watcher   3. idle, WATCHERS watchers
#   4. purchases, no watcher                     5. purchases, WATCHERS watchers
# For each: Redis commands/s, the instance's CPU (% of one core) and
# resident memory at the end, the watchers' client's CPU (it shares the
# machine); for 3 and 4 the purchase throughput of
# `seckill-tools bench` (closed loop, 64 in flight, a fresh sale of 200,000
# units, so the stock the watchers see moves every tick). Raises the open-files
# limit for the watchers' sockets.
#   scripts/bench-watchers.sh
#   WATCHERS=2000 SECONDS_EACH=10 scripts/bench-watchers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
cargo build --release --locked -p seckill -p seckill-tools
seckill=target/release/seckill
tools=target/release/seckill-tools
watchers=${WATCHERS:-5000}
seconds=${SECONDS_EACH:-15}
ulimit -n "$(ulimit -Hn)"
(( $(ulimit -n) > watchers * 2 + 1000 )) || { echo "open-files limit $(ulimit -n) is too low for $watchers watchers" >&2; exit 1; }

# shellcheck source=scripts/private-deployment.sh
. scripts/private-deployment.sh
database_url="sqlite://$work/seckill.db"
"$seckill" migrate --database-url "$database_url" 2>/dev/null
# serve_instance runs in this shell (not a subshell) so its pid is kept.
serve_instance watched --database-url "$database_url" --user-rate 0 \
  --max-connections $((watchers + 2000)) > "$work/url"
base=$(cat "$work/url")
pid=${pids[-1]}

admin=$("$seckill" token --admin)
now=$(date +%s%3N)
curl -sf -X POST "$base/api/vouchers" -H "authorization: Bearer $admin" -H 'content-type: application/json' \
  -d "{\"title\":\"Watched sale\",\"stock\":100000000,\"begin_ms\":$((now - 1000)),\"end_ms\":$((now + 3600000))}" >/dev/null

commands() { redis-cli -s "$work/redis.sock" info stats | sed -n 's/^total_commands_processed:\([0-9]*\).*/\1/p'; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/${1:-$pid}/stat" 2>/dev/null || echo 0; }
rss_mib() { awk '/^VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$pid/status"; }
hz=$(getconf CLK_TCK)

# phase NAME WATCHERS LOAD: prints one table row.
phase() {
  local name=$1 count=$2 load=$3 watch_pid="" c0 t0 c1 t1 w0=0 w1=0 rate="-"
  if ((count > 0)); then
    "$tools" watch --url "$base" --count "$count" --duration "$((seconds + 20))s" > "$work/watch-$name.log" &
    watch_pid=$!
    sleep 8 # the watchers connect (a few hundred a second) before measuring
  fi
  c0=$(commands); t0=$(cpu_ticks)
  [ -z "$watch_pid" ] || w0=$(cpu_ticks "$watch_pid")
  if [ "$load" = load ]; then
    "$tools" bench --url "$base" --duration "${seconds}s" --concurrency 64 --users 1000000 --stock 200000 \
      --out "$work/bench-$name" >"$work/bench-$name.log" 2>&1 || true
    rate=$(sed -n 's/.*"throughput_rps": *\([0-9]*\).*/\1/p' "$work/bench-$name/report.json" | head -1)
  else
    sleep "$seconds"
  fi
  c1=$(commands); t1=$(cpu_ticks)
  [ -z "$watch_pid" ] || w1=$(cpu_ticks "$watch_pid")
  percent() { awk -v d="$1" -v hz="$hz" -v s="$seconds" 'BEGIN {print 100 * d / hz / s}'; }
  printf '| %s | %s | %d | %.0f%% | %s MiB | %.0f%% | %s |\n' "$name" "$count" $(((c1 - c0) / seconds)) \
    "$(percent $((t1 - t0)))" "$(rss_mib)" "$(percent $((w1 - w0)))" "${rate:-?}"
  if [ -n "$watch_pid" ]; then wait "$watch_pid" || true; cat "$work/watch-$name.log" >&2; fi
}

echo "| phase | watchers | Redis commands/s | instance CPU | instance RSS | watchers' client CPU | purchases/s |"
echo "|---|---:|---:|---:|---:|---:|---:|"
phase idle 0 idle
phase idle-one-watcher 1 idle
phase idle-watched "$watchers" idle
phase load 0 load
phase load-watched "$watchers" load
