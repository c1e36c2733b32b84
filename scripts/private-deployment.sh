# Sourced by bench.sh and schemathesis.sh: a private deployment in a
# temporary directory removed on exit — one redis-server on a unix socket,
# a fresh token secret, and `serve_instance` to start `seckill serve`
# processes on it. Needs $seckill (the binary) set by the caller.
# With REDIS_TLS=1 the instances reach Redis over TLS instead (a free port
# of 127.0.0.1, certificates of a private CA made with openssl; the unix
# socket stays for redis-cli), and $redis_tls_args holds the flags that
# trust the CA.

work=$(mktemp -d /tmp/seckill-private.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  redis-cli -s "$work/redis.sock" shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

redis_tls_args=()
listen=()
if [ "${REDIS_TLS:-0}" = 1 ]; then
  command -v openssl >/dev/null || { echo "REDIS_TLS=1 needs openssl (apt-get install openssl)" >&2; exit 1; }
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj /CN=private-ca -keyout "$work/ca.key" -out "$work/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 \
    -keyout "$work/server.key" -out "$work/server.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' > "$work/server.ext"
  openssl x509 -req -in "$work/server.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial \
    -days 1 -extfile "$work/server.ext" -out "$work/server.crt" 2>/dev/null
  # A port nothing listens on (bash's /dev/tcp fails to connect to it).
  while tls_port=$((20000 + RANDOM % 40000)); (: < "/dev/tcp/127.0.0.1/$tls_port") 2>/dev/null; do :; done
  listen=(--port 0 --tls-port "$tls_port" --tls-cert-file "$work/server.crt" --tls-key-file "$work/server.key"
    --tls-ca-cert-file "$work/ca.crt" --tls-auth-clients no)
  redis_tls_args=(--redis-tls-ca-file "$work/ca.crt")
else
  listen=(--port 0)
fi
redis-server "${listen[@]}" --unixsocket "$work/redis.sock" --save "" --appendonly no \
  --dir "$work" --daemonize yes --logfile "$work/redis.log"
until redis-cli -s "$work/redis.sock" ping >/dev/null 2>&1; do sleep 0.05; done

export SECKILL_TOKEN_SECRET="private-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
if [ "${REDIS_TLS:-0}" = 1 ]; then
  redis_url="rediss://127.0.0.1:$tls_port/"
else
  redis_url="redis+unix://$work/redis.sock"
fi

# serve_instance NAME [serve flags...]: starts an instance (every request
# comes from 127.0.0.1: no per-IP rate or connection limit) and prints its
# base URL.
serve_instance() {
  local name=$1
  shift
  "$seckill" serve --redis-url "$redis_url" "${redis_tls_args[@]}" --listen 127.0.0.1:0 \
    --consumer "$name" --ip-rate 0 --max-connections-per-address 10000 "$@" >/dev/null 2>"$work/serve-$name.log" &
  pids+=($!)
  until grep -q "listening on" "$work/serve-$name.log"; do
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$work/serve-$name.log" >&2; exit 1; }
    sleep 0.05
  done
  grep -o 'http://[0-9.:]*' "$work/serve-$name.log" | head -1
}
