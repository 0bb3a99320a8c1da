#!/usr/bin/env bash
# What alerts cost serve a decision, counted in instructions (callgrind),
# which, unlike CPU time on a shared machine, barely varies from run to
# run: `tollgate serve` under valgrind on a redis-server this script starts
# (with the module), the rule of scripts/bench-alerts.sh without alerts
# (off) then alerting at 50, 80 and 100 % (on; no call crosses); 2 000
# requests to warm up, then the counters zeroed and N requests counted.
# Prints each side's instructions per decision and on / off.
#
# Usage: scripts/bench-alerts-callgrind.sh
# Environment: N (default 10000). Everything it starts is stopped by pid.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh

no_arguments "$@"
N=${N:-10000}
KEYS=100000
need valgrind "Debian: apt-get install -y valgrind"
need callgrind_control "Debian: apt-get install -y valgrind"

bench_init
build_release
build_module
REDIS_EXTRA_ARGS=(--loadmodule "$MODULE_SO")
start_redis

declare -A per
for side in off on; do
  alerts=""
  [ "$side" = on ] && alerts=", alerts: [50, 80, 100]"
  mkdir -p "$BENCH_TMP/$side"
  cat >"$BENCH_TMP/$side/limits.yaml" <<YAML
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: day, requests_per_unit: 1000000000$alerts}
YAML
  out="$BENCH_TMP/$side/callgrind.out"
  # Slowed fifty times over: a long deadline on every Redis call.
  start_serve "$BENCH_TMP/$side/limits.yaml" env TOLLGATE_ALERT_WEBHOOK=http://127.0.0.1:9/alerts \
    CACHE_KEY_PREFIX="$side" REDIS_TIMEOUT=10s valgrind --tool=callgrind --callgrind-out-file="$out"
  load() {
    "$TOLLGATE" bench --target "grpc://$SERVE_GRPC" --domain bench --descriptor client=c --keys "$KEYS" \
      --connections 16 --requests "$1" --json --quiet >/dev/null
  }
  load 2000
  callgrind_control -z "$SERVE_PID" >/dev/null 2>&1
  load "$N"
  callgrind_control -d "$SERVE_PID" >/dev/null 2>&1
  for _ in $(seq 100); do
    [ -s "$out.1" ] && break
    sleep 0.1
  done
  per[$side]=$(awk -v n="$N" '/^summary:/ { printf "%d", $2 / n }' "$out.1")
  note "$side: ${per[$side]} instructions per decision"
  kill "$SERVE_PID"
  wait "$SERVE_PID" 2>/dev/null || true
done
echo "| alerts | instructions per decision |"
echo "|---|---:|"
echo "| off | ${per[off]} |"
echo "| on | ${per[on]} |"
awk -v a="${per[off]}" -v b="${per[on]}" 'BEGIN { printf "\non / off: %.3f\n", b / a }'
machine
