#!/usr/bin/env bash
# The service's speed against a base, paired: the `seckill` binary built from
# BASE (a commit, default HEAD~1) and from the work tree as it is (or from a
# second commit, HEAD_REF), both served at once on one private deployment
# (one redis-server on a unix socket, a SQLite file each, rate limits off),
# then `wrk` on every route a buyer and the storefront use, the two binaries
# alternated leg by leg (base, head, base, head …) so that a machine that
# slows down slows both. Prints each route's requests/s per round, the ratio
# of the medians (head / base), the instance's CPU per request (µs, from
# /proc) and Redis' CPU per purchase; the purchase and the voucher read
# also as a share of the same binary's /healthz.
#   scripts/compare-service.sh                  # HEAD~1 against the work tree
#   scripts/compare-service.sh 1a10c2d          # a given base
#   HEAD_REF=main scripts/compare-service.sh v1  # two commits
#   ROUNDS=3 SECONDS_EACH=10 CONNECTIONS=64 BUYERS=3000 scripts/compare-service.sh
#   BASE_BIN=/tmp/seckill-a HEAD_BIN=/tmp/seckill-b scripts/compare-service.sh  # two binaries built already
# Installs wrk from Debian's packages when it is missing. The base is built
# in a git worktree under target/compare/ with the checkout's own target
# directory, so the dependencies are compiled once.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
scripts/ensure-deps.sh
if ! command -v wrk >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends wrk >/dev/null
fi

base_ref=${1:-HEAD~1}
head_ref=${HEAD_REF:-}
rounds=${ROUNDS:-2}
seconds=${SECONDS_EACH:-8}
connections=${CONNECTIONS:-64}
buyers=${BUYERS:-3000}
bins=$(mktemp -d /tmp/seckill-compare.XXXXXX)

# build REF OUT: the seckill binary of commit REF (the work tree if REF is
# empty) copied to OUT.
build() {
  local ref=$1 out=$2 src=$root
  if [ -n "$ref" ]; then
    src=$root/target/compare/src
    git worktree remove --force "$src" >/dev/null 2>&1 || rm -rf "$src"
    git worktree prune
    git worktree add --detach --force "$src" "$ref" >/dev/null
  fi
  (cd "$src" && CARGO_TARGET_DIR=$root/target cargo build --release --locked -q -p seckill)
  cp "$root/target/release/seckill" "$out"
  if [ -n "$ref" ]; then git worktree remove --force "$src"; fi
}
if [ -n "${BASE_BIN:-}" ] && [ -n "${HEAD_BIN:-}" ]; then
  cp "$BASE_BIN" "$bins/base" && cp "$HEAD_BIN" "$bins/head"
  base_desc=$BASE_BIN head_desc=$HEAD_BIN
else
  echo "building the base ($(git rev-parse --short "$base_ref")) and the head (${head_ref:-the work tree})" >&2
  build "$(git rev-parse "$base_ref")" "$bins/base"
  build "${head_ref:+$(git rev-parse "$head_ref")}" "$bins/head"
  base_desc=$(git rev-parse --short "$base_ref")
  head_desc=${head_ref:+$(git rev-parse --short "$head_ref")}
  head_desc=${head_desc:-work tree at $(git rev-parse --short HEAD)}
fi

seckill=$bins/head
# shellcheck source=scripts/private-deployment.sh
. scripts/private-deployment.sh
trap 'cleanup; rm -rf "$bins"' EXIT

declare -A url pid voucher
for side in base head; do
  seckill=$bins/$side
  "$seckill" migrate --database-url "sqlite://$work/$side.db" 2>/dev/null
  serve_instance "$side" --database-url "sqlite://$work/$side.db" --prefix "$side" \
    --user-rate 0 --pay-within-ms 3600000 > "$work/url-$side"
  url[$side]=$(cat "$work/url-$side")
  pid[$side]=${pids[-1]}
  admin=$("$seckill" token --admin)
  now=$(date +%s%3N)
  voucher[$side]=$(curl -sf -X POST "${url[$side]}/api/vouchers" -H "authorization: Bearer $admin" \
    -H 'content-type: application/json' \
    -d "{\"title\":\"Hot sale\",\"stock\":1000000,\"begin_ms\":$((now - 1000)),\"end_ms\":$((now + 3600000))}" |
    sed -E 's/.*"id":([0-9]+).*/\1/')
done
# One token per buyer, minted by each side's own binary (the token format
# may differ between them), in parallel.
for side in base head; do
  seq 1 "$buyers" | xargs -P 4 -I{} "$bins/$side" token --user {} > "$work/tokens-$side"
done

cat > "$work/rotate.lua" <<'LUA'
-- Each request as the next buyer in $TOKENS, with $METHOD on $ROUTE.
local tokens = {}
for line in io.lines(os.getenv("TOKENS")) do tokens[#tokens + 1] = line end
local method, route = os.getenv("METHOD"), os.getenv("ROUTE")
local n = 0
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("n", threads * 7919)
end
function request()
  n = n % #tokens + 1
  return wrk.format(method, route, { ["authorization"] = "Bearer " .. tokens[n] })
end
LUA

# The legs: name, method, path ({v}: the sale), whether it signs in.
legs=(
  "healthz GET /healthz no"
  "storefront GET / no"
  "script GET /assets/seckill.js no"
  "sales GET /api/vouchers no"
  "sale GET /api/vouchers/{v} no"
  "purchase POST /api/vouchers/{v}/seckill yes"
  "my-order GET /api/vouchers/{v}/order yes"
  "my-orders GET /api/orders yes"
)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
redis_cpu() { redis-cli -s "$work/redis.sock" info cpu | awk -F: '/^used_cpu_(sys|user):/ {s += $2} END {printf "%.6f", s}'; }
hz=$(getconf CLK_TCK)

# status SIDE METHOD PATH AUTH -> the HTTP status one request of the leg gets
status() {
  local side=$1 method=$2 path=${3//\{v\}/${voucher[$1]}} auth=$4
  local header=()
  [ "$auth" = yes ] && header=(-H "authorization: Bearer $(head -1 "$work/tokens-$side")")
  curl -s -o /dev/null -w '%{http_code}' -X "$method" "${header[@]}" "${url[$side]}$path"
}

# Both sides must answer each leg alike (a base that refuses the head's
# tokens, say, would measure its 401s): one request each, compared.
for entry in "${legs[@]}"; do
  read -r name method path auth <<< "$entry"
  # A purchase's first answer (accepted) differs from the next (409).
  status base "$method" "$path" "$auth" > /dev/null
  status head "$method" "$path" "$auth" > /dev/null
  b=$(status base "$method" "$path" "$auth") h=$(status head "$method" "$path" "$auth")
  echo "$name answers: base $b, head $h" >&2
  if [ "$b" != "$h" ] || [ "${b:0:1}" = 5 ]; then
    echo "compare-service.sh: $name answers $b on the base and $h on the head: not comparable" >&2
    exit 1
  fi
done

# leg SIDE METHOD PATH AUTH -> "req/s cpu-µs-per-request redis-µs-per-request"
leg() {
  local side=$1 method=$2 path=${3//\{v\}/${voucher[$1]}} auth=$4 out
  local cpu0 cpu1 r0 r1 rate
  cpu0=$(cpu_ticks "${pid[$side]}") r0=$(redis_cpu)
  if [ "$auth" = yes ]; then
    out=$(TOKENS="$work/tokens-$side" METHOD=$method ROUTE=$path \
      wrk -t2 -c"$connections" -d"${seconds}s" -s "$work/rotate.lua" "${url[$side]}")
  else
    out=$(wrk -t2 -c"$connections" -d"${seconds}s" "${url[$side]}$path")
  fi
  cpu1=$(cpu_ticks "${pid[$side]}") r1=$(redis_cpu)
  rate=$(echo "$out" | sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p')
  awk -v rate="$rate" -v c="$((cpu1 - cpu0))" -v hz="$hz" -v s="$seconds" -v r="$(awk -v a="$r1" -v b="$r0" 'BEGIN {print a - b}')" \
    'BEGIN {n = rate * s; printf "%.0f %.1f %.1f\n", rate, 1e6 * c / hz / n, 1e6 * r / n}'
}
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

declare -A rates cpu redis
for round in $(seq 1 "$rounds"); do
  for entry in "${legs[@]}"; do
    read -r name method path auth <<< "$entry"
    for side in base head; do
      read -r r c x < <(leg "$side" "$method" "$path" "$auth")
      rates[$side,$name]+="$r " cpu[$side,$name]+="$c " redis[$side,$name]+="$x "
      echo "round $round $name $side: $r req/s, instance ${c} µs/request, Redis ${x} µs/request" >&2
    done
  done
done

echo
echo "$(date -u +%F): base $base_desc, head $head_desc; $rounds rounds of ${seconds}s, $connections connections, $(nproc) CPUs"
printf '| %-10s | %-22s | %-22s | %6s | %12s | %12s | %12s |\n' route "base req/s" "head req/s" "ratio" "base µs/req" "head µs/req" "Redis µs/req"
printf '|%s|%s|%s|%s|%s|%s|%s|\n' ------------ ------------------------ ------------------------ -------- -------------- -------------- --------------
for entry in "${legs[@]}"; do
  read -r name _ <<< "$entry"
  b=$(tr ' ' '\n' <<< "${rates[base,$name]}" | grep . | median)
  h=$(tr ' ' '\n' <<< "${rates[head,$name]}" | grep . | median)
  bc=$(tr ' ' '\n' <<< "${cpu[base,$name]}" | grep . | median)
  hc=$(tr ' ' '\n' <<< "${cpu[head,$name]}" | grep . | median)
  hr=$(tr ' ' '\n' <<< "${redis[head,$name]}" | grep . | median)
  printf '| %-10s | %-22s | %-22s | %6s | %12s | %12s | %12s |\n' "$name" "${rates[base,$name]% }" "${rates[head,$name]% }" \
    "$(awk -v a="$h" -v b="$b" 'BEGIN {printf "%.2f", a / b}')" "$bc" "$hc" "$hr"
done
for side in base head; do
  h=$(tr ' ' '\n' <<< "${rates[$side,healthz]}" | grep . | median)
  p=$(tr ' ' '\n' <<< "${rates[$side,purchase]}" | grep . | median)
  s=$(tr ' ' '\n' <<< "${rates[$side,sale]}" | grep . | median)
  echo "$side: purchase $(awk -v a="$p" -v b="$h" 'BEGIN {printf "%.0f%%", 100 * a / b}') of /healthz, voucher read $(awk -v a="$s" -v b="$h" 'BEGIN {printf "%.0f%%", 100 * a / b}')"
done
