#!/usr/bin/env bash
# The Redis store under load, against a redis-server this script starts (free
# port, no persistence, a temporary directory), with a release build. Prints
# three Markdown tables:
#
# (a) decisions/s of `tollgate bench --store redis://` with 1 and 64 tasks
#     (one connection, a GCRA limit that never refuses), side by side with
#     redis-benchmark -c 50 -P 16 sending Tollgate's own script with the same
#     arguments (EVALSHA of tollgate.lua, keys varied with __rand_int__ as
#     --keys varies them); the ratio tasks-64 / redis-benchmark (target >= 0.8).
#     Before that, one decision of `tollgate bench` is captured with MONITOR
#     and compared with the argument list redis-benchmark sends: the script
#     stops if they differ.
# (b) Redis CPU time per decision of each of the eight algorithms: CONFIG
#     RESETSTAT, ALG_REQUESTS decisions with a limit that mostly allows, then
#     usec_per_call of EVALSHA from INFO commandstats (all of the script's
#     work, its inner commands included). The limits are per hour, so every
#     call finds the key's state from the previous one.
# (c) MEMORY USAGE of one key per algorithm after 10 decisions, same limits
#     (the log and lease entries it holds, for sliding_log and concurrency).
#
# Usage: scripts/bench-redis.sh
# Environment: DURATION (default 5s; a number of s or ms) per tollgate bench
# run; KEYS (default 1000) distinct keys; REDIS_BENCHMARK_REQUESTS (default:
# as many as tasks-64 decided in DURATION, at least 10000); ALG_REQUESTS
# (default 20000) decisions per algorithm in (b).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh

case "${1:-}" in
  "") ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *) die "unknown argument \"$1\" (usage: $0)" ;;
esac
DURATION=${DURATION:-5s}
KEYS=${KEYS:-1000}
ALG_REQUESTS=${ALG_REQUESTS:-20000}
case "$DURATION" in
  *ms) duration_s=$(awk -v v="${DURATION%ms}" 'BEGIN { print v / 1000 }') ;;
  *s) duration_s=${DURATION%s} ;;
  *) die "DURATION must be a number of s or ms, such as 5s or 500ms (got \"$DURATION\")" ;;
esac
[[ "$duration_s" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "DURATION must be a number of s or ms (got \"$DURATION\")"
[[ "$KEYS" =~ ^[1-9][0-9]*$ ]] || die "KEYS must be a positive integer (got \"$KEYS\")"
need redis-benchmark "Debian: apt-get install -y redis-tools"
need sha1sum

bench_init
build_release
start_redis

LUA=crates/tollgate/src/store/redis/tollgate.lua
# The file as it is, final newline included (-x), as RedisStore loads it
# (include_str!): the same SHA-1. ("$(cat …)" would drop the newline.)
sha=$(rcli -x SCRIPT LOAD <"$LUA")
[ "$sha" = "$(sha1sum "$LUA" | cut -d ' ' -f 1)" ] ||
  die "SCRIPT LOAD answered \"$sha\", not the SHA-1 of $LUA"

# --- (a) tollgate bench next to redis-benchmark ------------------------------

# `tollgate bench`'s default limit: GCRA at 10^9 per second, burst 10^9.
RATE=1000000000
PERIOD_US=1000000
BURST=1000000000
gcd() {
  local a=$1 b=$2 t
  while [ "$b" -ne 0 ]; do
    t=$((a % b))
    a=$b
    b=$t
  done
  echo "$a"
}
# Exact rates as integer ticks (rate.rs): one unit weighs period/g ticks, one
# µs drains rate/g ticks.
g=$(gcd "$PERIOD_US" "$RATE")
unit=$((PERIOD_US / g))
per_micro=$((RATE / g))
# RedisStore::invocation() for one `check` of cost 1 on a single gcra limit:
# KEYS: the limit's key; ARGV: now ("" = the server's TIME), 1 decision, op,
# cost, max_wait (-1: none), lease (""), named (0), 1 limit, then the
# algorithm, its 7 parameters (Limit::script_params: burst, 0, 0, 0, 0, unit,
# per_micro) and the cost this limit sees.
gcra_argv() { # KEY: sets GCRA_ARGV (numkeys, the key, then ARGV)
  GCRA_ARGV=(1 "$1" "" 1 check 1 -1 "" 0 1 gcra "$BURST" 0 0 0 0 "$unit" "$per_micro" 1)
}

# Capture what `tollgate bench` really sends, and compare.
rcli MONITOR >"$BENCH_TMP/monitor.txt" 2>&1 &
monitor_pid=$!
BENCH_PIDS+=("$monitor_pid")
for _ in $(seq 100); do
  grep -q OK "$BENCH_TMP/monitor.txt" 2>/dev/null && break
  sleep 0.02
done
"$TOLLGATE" bench --store "$REDIS_URL" --requests 1 --json --quiet >/dev/null
sent=""
for _ in $(seq 100); do
  sent=$(grep -i -m 1 '"evalsha"' "$BENCH_TMP/monitor.txt" || true)
  [ -n "$sent" ] && break
  sleep 0.02
done
kill "$monitor_pid" 2>/dev/null || true
wait "$monitor_pid" 2>/dev/null || true
[ -n "$sent" ] || die "MONITOR saw no EVALSHA from tollgate bench"
sent=${sent#*] }
want="\"EVALSHA\" \"$sha\""
gcra_argv "tollgate-bench:{bench-0}:gcra"
for arg in "${GCRA_ARGV[@]}"; do
  want="$want \"$arg\""
done
if [ "${sent,,}" != "${want,,}" ]; then
  die "the arguments for redis-benchmark no longer match what RedisStore sends (update gcra_argv):
  RedisStore sends: $sent
  this script:      $want"
fi
rcli FLUSHALL >/dev/null

# tollgate_run NAME ARGS...: one `tollgate bench --store` run, summary in
# NAME.json; in NAME.cpu, Redis's and the load generator's CPU use over the
# run's wall time.
tollgate_run() {
  local name=$1 redis_before bench_before bench_after started ended
  shift
  note "$name"
  redis_before=$(redis_cpu)
  children_cpu bench_before
  started=$(now_s)
  "$TOLLGATE" bench --store "$REDIS_URL" "$@" --json --quiet >"$BENCH_TMP/$name.json" 2>"$BENCH_TMP/$name.err" ||
    die "tollgate bench ($name) failed: $(cat "$BENCH_TMP/$name.err")"
  ended=$(now_s)
  children_cpu bench_after
  printf '%s|%s\n' "$(percent "$redis_before" "$(redis_cpu)" "$started" "$ended")" \
    "$(percent "$bench_before" "$bench_after" "$started" "$ended")" >"$BENCH_TMP/$name.cpu"
  if [ -s "$BENCH_TMP/$name.err" ]; then
    note "$name: $(cat "$BENCH_TMP/$name.err")"
  fi
}

tollgate_run tasks1 --tasks 1 --keys "$KEYS" --duration "$DURATION"
tollgate_run tasks64 --tasks 64 --keys "$KEYS" --duration "$DURATION"
rate64=$(json_field decisions_per_s "$BENCH_TMP/tasks64.json")
n=${REDIS_BENCHMARK_REQUESTS:-$(awk -v r="$rate64" -v d="$duration_s" 'BEGIN { n = int(r * d); print (n < 10000 ? 10000 : n) }')}
[[ "$n" =~ ^[1-9][0-9]*$ ]] || die "REDIS_BENCHMARK_REQUESTS must be a positive integer (got \"$n\")"

# __rand_int__ becomes 12 random digits below -r: KEYS distinct keys, under
# a prefix of their own (checked below).
gcra_argv "tollgate-rb:{bench-__rand_int__}:gcra"
note "redis-benchmark: $n EVALSHA, 50 clients, pipeline 16"
rcli CONFIG RESETSTAT >/dev/null
redis_before=$(redis_cpu)
children_cpu bench_before
started=$(now_s)
redis-benchmark -p "$REDIS_PORT" -c 50 -P 16 -n "$n" -r "$KEYS" --csv EVALSHA "$sha" "${GCRA_ARGV[@]}" \
  >"$BENCH_TMP/rb.csv" 2>"$BENCH_TMP/rb.err" || die "redis-benchmark failed: $(cat "$BENCH_TMP/rb.err")"
ended=$(now_s)
children_cpu bench_after
rb_redis=$(percent "$redis_before" "$(redis_cpu)" "$started" "$ended")
rb_bench=$(percent "$bench_before" "$bench_after" "$started" "$ended")
# The last line: "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...
rb_line=$(tail -n 1 "$BENCH_TMP/rb.csv" | tr -d '\r')
rb_rps=$(awk -F'","' '{ printf "%.0f", $(NF-6) }' <<<"$rb_line")
rb_p50=$(awk -F'","' '{ printf "%.1f", $(NF-3) * 1000 }' <<<"$rb_line")
rb_p99=$(awk -F'","' '{ v = $(NF-1); gsub(/"/, "", v); printf "%.1f", v * 1000 }' <<<"$rb_line")
if ! [[ "$rb_rps" =~ ^[0-9]+$ ]] || [ "$rb_rps" -eq 0 ]; then
  die "cannot read redis-benchmark's output: $(cat "$BENCH_TMP/rb.csv")"
fi
# Every call of redis-benchmark reached the script and succeeded...
rb_stats=$(rcli INFO commandstats | tr -d '\r' |
  sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*failed_calls=\([0-9]*\).*/\1 \2/p')
# (With pipelining it may send a few more than -n.)
if [ "${rb_stats#* }" != 0 ] || [ "${rb_stats% *}" -lt "$n" ]; then
  die "redis-benchmark: expected $n EVALSHA calls, none failed; INFO commandstats says (calls failed): $rb_stats"
fi
# ... and decided (the script answers bad arguments with {"err", message}).
reply=$(rcli EVALSHA "$sha" "${GCRA_ARGV[@]}" | head -n 2 | tr '\n' ' ')
[ "$reply" = "ok 1 " ] || die "the script did not allow a decision with redis-benchmark's arguments: $reply"

echo
echo "(a) Redis store, GCRA check that never refuses, $KEYS keys: tollgate bench ($DURATION) next to"
echo "redis-benchmark with the same EVALSHA ($n requests)"
machine
echo
printf '| %-44s | %11s | %9s | %9s | %6s | %9s | %10s |\n' client "decisions/s" "p50 µs" "p99 µs" errors \
  "Redis CPU" "client CPU"
printf '|%s|%s:|%s:|%s:|%s:|%s:|%s:|\n' "----------------------------------------------" "------------" \
  "----------" "----------" "-------" "----------" "-----------"
for row in "tasks1:tollgate bench --tasks 1 (one connection)" "tasks64:tollgate bench --tasks 64 (one connection)"; do
  name=${row%%:*}
  file="$BENCH_TMP/$name.json"
  IFS='|' read -r redis_use bench_use <"$BENCH_TMP/$name.cpu"
  printf '| %-44s | %11s | %9s | %9s | %6s | %9s | %10s |\n' "${row#*:}" "$(json_field decisions_per_s "$file")" \
    "$(json_field p50_us "$file")" "$(json_field p99_us "$file")" "$(json_field errors "$file")" \
    "$redis_use" "$bench_use"
done
printf '| %-44s | %11s | %9s | %9s | %6s | %9s | %10s |\n' "redis-benchmark -c 50 -P 16" "$rb_rps" "$rb_p50" \
  "$rb_p99" "-" "$rb_redis" "$rb_bench"
ratio=$(awk -v a="$rate64" -v b="$rb_rps" 'BEGIN { printf "%.2f", a / b }')
verdict=$(awk -v r="$ratio" 'BEGIN { print (r >= 0.8 ? "met" : "NOT met") }')
echo
echo "tasks-64 / redis-benchmark: $ratio (target >= 0.8: $verdict)"
echo "(CPU: user + system time over each run's wall time, in % of one core; Redis uses one core for"
echo "scripts, so near 100 % it is the bottleneck. redis-benchmark's latencies are per pipelined call.)"

# --- (b) Redis CPU per decision, per algorithm --------------------------------

# Limits over an hour that the load never reaches: every decision allows,
# and each key's state outlives the run (a limit of 10^6 per second would
# lapse within a millisecond, and most calls would find no state at all).
# Each key sees about ALG_REQUESTS / KEYS decisions.
ALGORITHMS=(
  'fixed_window|{"algorithm":"fixed_window","limit":1000000,"window":"1h"}'
  'sliding_window|{"algorithm":"sliding_window","limit":1000000,"window":"1h","buckets":10}'
  'sliding_log|{"algorithm":"sliding_log","limit":1000000,"window":"1h"}'
  'token_bucket|{"algorithm":"token_bucket","capacity":1000000,"refill":1000,"interval":"1h"}'
  'reservation|{"algorithm":"reservation","rate":1000,"period":"1h","max_burst":1000000}'
  'leaky_bucket|{"algorithm":"leaky_bucket","rate":1000,"period":"1h","capacity":1000000}'
  'gcra|{"algorithm":"gcra","rate":1000,"period":"1h","burst":1000000}'
  'concurrency|{"algorithm":"concurrency","limit":1000000,"ttl":"1h"}'
)

# entries KEY: the log entries ("#…") or leases ("l:…") the key's hash holds.
entries() {
  rcli HKEYS "$1" | grep -c -E '^(#|l:)' || true
}

rows=()
for entry in "${ALGORITHMS[@]}"; do
  alg=${entry%%|*}
  limit=${entry#*|}
  op=(--op check)
  notes=""
  if [ "$alg" = concurrency ]; then
    op=(--op acquire)
    notes="each request is an acquire and its release: two calls"
  fi
  rcli CONFIG RESETSTAT >/dev/null
  tollgate_run "alg-$alg" --limit "$limit" "${op[@]}" --requests "$ALG_REQUESTS" --tasks 16 --keys "$KEYS" \
    --prefix "cpu-$alg"
  file="$BENCH_TMP/alg-$alg.json"
  stats=$(rcli INFO commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),usec=[0-9]*,usec_per_call=\([0-9.]*\),.*/\1 \2/p')
  [ -n "$stats" ] || die "no EVALSHA in INFO commandstats after the $alg run"
  if [ "$alg" = sliding_log ]; then
    notes="key bench-0 held $(entries "cpu-$alg:{bench-0}:$alg") log entries at the end"
  fi
  requests=$(json_field requests "$file")
  allowed=$(awk -v a="$(json_field allowed "$file")" -v r="$requests" 'BEGIN { printf "%.1f %%", 100 * a / r }')
  errors=$(json_field errors "$file")
  if [ "$errors" != 0 ]; then
    notes="${notes:+$notes; }$errors errors: $(cat "$BENCH_TMP/alg-$alg.err")"
  fi
  rows+=("$(printf '| %-14s | %9s | %9s | %11s | %-60s | %s |' "$alg" "$allowed" "${stats% *}" "${stats#* }" \
    "\`$limit\`" "$notes")")
done

# --- (c) MEMORY USAGE of one key per algorithm --------------------------------

memory_rows=()
for entry in "${ALGORITHMS[@]}"; do
  alg=${entry%%|*}
  limit=${entry#*|}
  key="mem-$alg:{bench-0}:$alg"
  if [ "$alg" = concurrency ]; then
    # `tollgate bench --op acquire` releases each lease: take 10 and keep
    # them, calling the script as RedisStore does for an acquire (max_wait
    # 0, a lease name per call; parameters: limit, ttl in µs, five zeros).
    for i in $(seq 10); do
      rcli EVALSHA "$sha" 1 "$key" "" 1 acquire 1 0 "lease-$i" 0 1 concurrency 1000000 3600000000 0 0 0 0 0 1 \
        >"$BENCH_TMP/acquire.out" || die "acquire failed: $(cat "$BENCH_TMP/acquire.out")"
    done
    held="$(entries "$key") leases"
    [[ "$limit" == *'"limit":1000000,"ttl":"1h"'* ]] || die "update the acquire parameters to match: $limit"
  else
    "$TOLLGATE" bench --store "$REDIS_URL" --limit "$limit" --requests 10 --keys 1 --prefix "mem-$alg" \
      --json --quiet >"$BENCH_TMP/mem.json"
    held=""
    if [ "$alg" = sliding_log ]; then
      # One entry per distinct microsecond of admission.
      held="$(entries "$key") log entries"
    fi
  fi
  [ "$(rcli EXISTS "$key")" = 1 ] || die "no key $key after 10 decisions of $alg"
  bytes=$(rcli MEMORY USAGE "$key" SAMPLES 0)
  memory_rows+=("$(printf '| %-14s | %6s | %6s | %-8s | %-16s | %s |' "$alg" "$bytes" "$(rcli HLEN "$key")" \
    "$(rcli OBJECT ENCODING "$key")" "$held" "\`$limit\`")")
done

echo
echo "(b) Redis CPU time per decision (EVALSHA usec_per_call): $ALG_REQUESTS requests each, 16 tasks, $KEYS keys"
echo
printf '| %-14s | %9s | %9s | %11s | %-60s | %s |\n' algorithm allowed "EVALSHA" "µs per call" limit notes
printf '|%s|%s:|%s:|%s:|%s|%s|\n' "----------------" "----------" "----------" "------------" \
  "--------------------------------------------------------------" "-------"
printf '%s\n' "${rows[@]}"

echo
echo "(c) One key after 10 decisions: MEMORY USAGE … SAMPLES 0 (bytes), hash fields (HLEN, with \"a\" and \"x\")"
echo
printf '| %-14s | %6s | %6s | %-8s | %-16s | %s |\n' algorithm bytes fields encoding held limit
printf '|%s|%s:|%s:|%s|%s|%s|\n' "----------------" "-------" "-------" "----------" "------------------" "-------"
printf '%s\n' "${memory_rows[@]}"
