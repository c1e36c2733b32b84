# Sourced by bench.sh and schemathesis.sh: a private deployment in a
# temporary directory removed on exit — one redis-server on a unix socket,
# a fresh token secret, and `serve_instance` to start `seckill serve`
# processes on it. Needs $seckill (the binary) set by the caller.

work=$(mktemp -d /tmp/seckill-private.XXXXXX)
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

export SECKILL_TOKEN_SECRET="private-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
redis_url="redis+unix://$work/redis.sock"

# serve_instance NAME [serve flags...]: starts an instance (every request
# comes from 127.0.0.1: no per-IP rate or connection limit) and prints its
# base URL.
serve_instance() {
  local name=$1
  shift
  "$seckill" serve --redis-url "$redis_url" --listen 127.0.0.1:0 \
    --consumer "$name" --ip-rate 0 --max-connections-per-address 10000 "$@" >/dev/null 2>"$work/serve-$name.log" &
  pids+=($!)
  until grep -q "listening on" "$work/serve-$name.log"; do
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$work/serve-$name.log" >&2; exit 1; }
    sleep 0.05
  done
  grep -o 'http://[0-9.:]*' "$work/serve-$name.log" | head -1
}
