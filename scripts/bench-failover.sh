#!/usr/bin/env bash
# Redis failing under load, on one redis-server this script starts (free
# port, no persistence, a temporary directory), with release builds. Prints
# Markdown:
#
# (a) for each failure policy (open, closed, local): `tollgate bench --store
#     redis:// --tasks 64 --on-store-error POLICY`, a GCRA limit of 1 000/s
#     (burst 100) on 10 keys, for 8 s. Redis is killed (SIGKILL, by its pid)
#     2 s in and started again on the same port 5 s in. Reported: decisions
#     by path, the p99 latency of the decisions Redis did not make (the
#     breaker open), and how long after Redis was ready again the store
#     decided again.
# (b) the deny cache: one subject flooded past a limit of 1 a day by 64
#     tasks for 3 s; Redis calls (FCALL/EVALSHA) per decision.
#
# Usage: scripts/bench-failover.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh

no_arguments "$@"

bench_init
build_release
start_redis
REDIS_PID=${BENCH_PIDS[-1]}
REDIS_DIR="$BENCH_TMP/redis-again"
mkdir -p "$REDIS_DIR"

now_ms() {
  date +%s%3N
}

# Starts redis-server again on REDIS_PORT; sets REDIS_PID and READY_MS, the
# ms it was ready at.
restart_redis() {
  local log="$REDIS_DIR/redis-$1.log" pid
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$REDIS_DIR" --logfile "$log" --daemonize no >/dev/null 2>&1 &
  pid=$!
  BENCH_PIDS+=("$pid")
  REDIS_PID=$pid
  for _ in $(seq 200); do
    if grep -q "Ready to accept connections" "$log" 2>/dev/null; then
      READY_MS=$(now_ms)
      return
    fi
    sleep 0.01
  done
  die "redis-server did not start again on port $REDIS_PORT"
}

LIMIT='{"algorithm":"gcra","rate":1000,"period":"1s","burst":100}'
echo "## Redis killed under load (64 tasks, 10 keys, GCRA 1 000/s burst 100, 8 s; killed at 2 s, back at 5 s)"
echo
echo "| policy | decisions | store | local | policy | allowed | denied | errors | p99 while Redis was down (µs) | store again after Redis was ready (ms) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for policy in open closed local; do
  out="$BENCH_TMP/failover-$policy.json"
  "$TOLLGATE" bench --store "$REDIS_URL" --tasks 64 --keys 10 --duration 8s --limit "$LIMIT" \
    --on-store-error "$policy" --json --quiet >"$out" 2>"$BENCH_TMP/failover-$policy.err" &
  bench_pid=$!
  BENCH_PIDS+=("$bench_pid")
  sleep 2
  kill -KILL "$REDIS_PID"
  wait "$REDIS_PID" 2>/dev/null || true
  sleep 3
  restart_redis "$policy"
  wait "$bench_pid" || die "tollgate bench failed: $(cat "$BENCH_TMP/failover-$policy.err")"
  recovered=$(json_field recovered_at_unix_ms "$out")
  if [ "$recovered" = null ] || [ -z "$recovered" ]; then
    back="never"
  else
    back=$((recovered - READY_MS))
  fi
  echo "| $policy | $(json_field requests "$out") | $(json_field path_store "$out") | $(json_field path_local "$out") | $(json_field path_policy "$out") | $(json_field allowed "$out") | $(json_field denied "$out") | $(json_field errors "$out") | $(json_field fallback_p99_us "$out") | $back |"
  rcli FLUSHALL >/dev/null
done
echo

echo "## Deny cache: one subject flooded past 1 a day (64 tasks, 3 s)"
echo
rcli CONFIG RESETSTAT >/dev/null
out="$BENCH_TMP/deny.json"
"$TOLLGATE" bench --store "$REDIS_URL" --tasks 64 --keys 1 --duration 3s \
  --limit '{"algorithm":"fixed_window","limit":1,"window":"1d"}' \
  --on-store-error error --deny-cache 10000 --json --quiet >"$out"
calls=$(rcli INFO commandstats | sed -n 's/^cmdstat_\(fcall\|evalsha\):calls=\([0-9]*\),.*/\2/p' | awk '{ sum += $1 } END { print sum + 0 }')
decisions=$(json_field requests "$out")
echo "| decisions | from the deny cache | Redis calls | Redis calls per decision |"
echo "| --- | --- | --- | --- |"
echo "| $decisions | $(json_field path_deny_cache "$out") | $calls | $(awk -v c="$calls" -v d="$decisions" 'BEGIN { printf "%.5f", c / d }') |"
