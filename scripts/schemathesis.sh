#!/usr/bin/env bash
# Property-based API testing with schemathesis against a private `seckill
# serve` (one redis-server on a unix socket, and a SQLite file unless
# DATABASE_URL names another database): every operation of the served
# OpenAPI document, all checks (no server error, every status and body as
# documented, ...), once with an admin token and once with a user token.
# schemathesis is installed from PyPI into target/schemathesis-venv the
# first time. Arguments go to `schemathesis run` (e.g. --max-examples 200).
#   scripts/schemathesis.sh
#   DATABASE_URL=postgres://... scripts/schemathesis.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
cargo build --release --locked -p seckill
seckill=target/release/seckill

venv=target/schemathesis-venv
if [ ! -x "$venv/bin/schemathesis" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet schemathesis
fi

work=$(mktemp -d /tmp/seckill-schemathesis.XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && { kill -INT "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
  redis-cli -s "$work/redis.sock" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

redis-server --port 0 --unixsocket "$work/redis.sock" --save "" --appendonly no \
  --dir "$work" --daemonize yes --logfile "$work/redis.log"
until redis-cli -s "$work/redis.sock" ping >/dev/null 2>&1; do sleep 0.05; done

export SECKILL_TOKEN_SECRET="st-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
"$seckill" serve --redis-url "redis+unix://$work/redis.sock" \
  --database-url "${DATABASE_URL:-sqlite://$work/seckill.db}" \
  --listen 127.0.0.1:0 --ip-rate 0 --user-rate 0 2>"$work/serve.log" &
pid=$!
until grep -q "listening on" "$work/serve.log"; do
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.05
done
base=$(grep -o 'http://[0-9.:]*' "$work/serve.log" | head -1)

status=0
for who in "--admin" "--user 42"; do
  # shellcheck disable=SC2086
  token=$("$seckill" token $who --ttl 3600)
  echo "== schemathesis as ${who#--} =="
  # All checks but one: positive_data_acceptance expects every
  # schema-valid body to be accepted, and OpenAPI 3.0 cannot say
  # "end_ms after begin_ms" (such a body is a documented 400, field end_ms).
  "$venv/bin/schemathesis" run "$base/openapi.json" --checks all \
    --exclude-checks positive_data_acceptance \
    -H "Authorization: Bearer $token" "$@" || status=1
done
if grep -q " ERROR " "$work/serve.log"; then
  echo "the service logged errors:" >&2
  grep " ERROR " "$work/serve.log" | head -20 >&2
  status=1
fi
exit $status
