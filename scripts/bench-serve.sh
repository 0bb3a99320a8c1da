#!/usr/bin/env bash
# Throughput of `tollgate serve`, all front ends in one run of one server:
# HTTP GET /healthz (the floor: no decision), POST /v1/check, POST /json and
# gRPC ShouldRateLimit, each loaded by `tollgate bench --target` with
# CONNECTIONS concurrent connections (one request in flight each) for
# DURATION, one after the other. Prints decisions/s, each run's ratio to the
# /healthz rate, latencies and counts, as a Markdown table.
#
# With --redis the server decides in a redis-server this script starts (free
# port, no persistence, a temporary directory), and the table is followed by
# the Redis commands per gRPC request, from INFO commandstats read before and
# after the gRPC run (the target: at most one library call, FCALL or
# EVALSHA, per request, decisions of concurrent requests sharing one, and
# nothing else).
#
# Usage: scripts/bench-serve.sh [--redis]
# Environment: DURATION (default 5s), CONNECTIONS (64), KEYS (1000 distinct
# descriptor values); SERVE_CPUS and BENCH_CPUS (e.g. 0 and 1) pin the server
# and the load generator to CPUs with taskset, so they do not share one;
# BENCH_THREADS sets the load generator's threads (default: one per core; 1
# suits a load generator pinned to one CPU); MODULE=1 (with --redis) loads
# the Redis module (crates/tollgate-redis-module, built here) into that
# redis-server, so that the server decides with it rather than with Lua.
#
# The limit (a fixed window of 10^9 per second per value) never refuses, so
# every request is one full decision. Everything this script starts is
# stopped by pid when it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh

redis_flag "$@"
redis=$REDIS_FLAG
DURATION=${DURATION:-5s}
CONNECTIONS=${CONNECTIONS:-64}
KEYS=${KEYS:-1000}
serve_pin=()
bench_pin=()
if [ -n "${SERVE_CPUS:-}" ] || [ -n "${BENCH_CPUS:-}" ]; then
  need taskset "Debian: apt-get install -y util-linux"
  if [ -n "${SERVE_CPUS:-}" ]; then serve_pin=(taskset -c "$SERVE_CPUS"); fi
  if [ -n "${BENCH_CPUS:-}" ]; then bench_pin=(taskset -c "$BENCH_CPUS"); fi
fi

bench_init
build_release

cat >"$BENCH_TMP/config.yaml" <<'EOF'
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000000000}
EOF

if $redis; then
  if [ "${MODULE:-0}" = 1 ]; then
    build_module
    REDIS_EXTRA_ARGS=(--loadmodule "$MODULE_SO")
  fi
  start_redis
fi
start_serve "$BENCH_TMP/config.yaml" "${serve_pin[@]}"
serve_pid=$SERVE_PID
http=$SERVE_HTTP
grpc=$SERVE_GRPC
store=$SERVE_STORE
note "tollgate serve (pid $serve_pid): HTTP $http, gRPC $grpc, store $store"

described=(--domain bench --descriptor client=c --keys "$KEYS")

# run NAME ARGS...: one `tollgate bench --target` run; its summary in NAME.json
# and, in NAME.cpu, the CPU use of the server, the load generator and Redis
# over the run's wall time (connection set-up and warm-up included).
run() {
  local name=$1 serve_before bench_before bench_after redis_before started ended redis_use="-"
  shift
  note "$name: $DURATION with $CONNECTIONS connections"
  serve_before=$(pid_cpu "$serve_pid")
  children_cpu bench_before
  if $redis; then redis_before=$(redis_cpu); fi
  started=$(now_s)
  if ! "${bench_pin[@]}" "$TOLLGATE" bench "$@" ${BENCH_THREADS:+--threads "$BENCH_THREADS"} \
    --connections "$CONNECTIONS" --duration "$DURATION" --json --quiet \
    >"$BENCH_TMP/$name.json" 2>"$BENCH_TMP/$name.err"; then
    die "tollgate bench ($name) failed: $(cat "$BENCH_TMP/$name.err")"
  fi
  ended=$(now_s)
  children_cpu bench_after
  if $redis; then redis_use=$(percent "$redis_before" "$(redis_cpu)" "$started" "$ended"); fi
  printf '%s|%s|%s\n' "$(percent "$serve_before" "$(pid_cpu "$serve_pid")" "$started" "$ended")" \
    "$(percent "$bench_before" "$bench_after" "$started" "$ended")" "$redis_use" >"$BENCH_TMP/$name.cpu"
  if [ -s "$BENCH_TMP/$name.err" ]; then
    note "$name: $(cat "$BENCH_TMP/$name.err")"
  fi
  if [ "$name" != healthz ] && [ "$(json_field limit_applied "$BENCH_TMP/$name.json")" != true ]; then
    die "$name: no limit applied to the requests: the run measured no decision"
  fi
}

run healthz --target "http://$http" --request healthz
run check --target "http://$http" --request check "${described[@]}"
run json --target "http://$http" --request json "${described[@]}"
if $redis; then
  commandstats "$BENCH_TMP/before.stats"
fi
run grpc --target "grpc://$grpc" "${described[@]}"
if $redis; then
  commandstats "$BENCH_TMP/after.stats"
fi

echo
echo "tollgate serve, $store store: $CONNECTIONS connections, $DURATION per run, $KEYS keys"
machine
if [ -n "${SERVE_CPUS:-}${BENCH_CPUS:-}" ]; then
  echo "pinned: tollgate serve on CPUs ${SERVE_CPUS:-any}, tollgate bench on CPUs ${BENCH_CPUS:-any}"
fi
echo
healthz_rate=$(json_field decisions_per_s "$BENCH_TMP/healthz.json")
printf '| %-22s | %11s | %11s | %9s | %9s | %10s | %10s | %6s | %9s | %9s | %9s |\n' \
  run "decisions/s" "vs /healthz" "p50 µs" "p99 µs" ok over_limit errors "serve CPU" "bench CPU" "Redis CPU"
printf '|%s|%s:|%s:|%s:|%s:|%s:|%s:|%s:|%s:|%s:|%s:|\n' \
  "------------------------" "------------" "------------" "----------" "----------" \
  "-----------" "-----------" "-------" "----------" "----------" "----------"
for row in "healthz:HTTP GET /healthz" "check:HTTP POST /v1/check" "json:HTTP POST /json" \
  "grpc:gRPC ShouldRateLimit"; do
  name=${row%%:*}
  file="$BENCH_TMP/$name.json"
  rate=$(json_field decisions_per_s "$file")
  ratio=$(awk -v a="$rate" -v b="$healthz_rate" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
  IFS='|' read -r serve_use bench_use redis_use <"$BENCH_TMP/$name.cpu"
  printf '| %-22s | %11s | %11s | %9s | %9s | %10s | %10s | %6s | %9s | %9s | %9s |\n' \
    "${row#*:}" "$rate" "$ratio" "$(json_field p50_us "$file")" "$(json_field p99_us "$file")" \
    "$(json_field ok "$file")" "$(json_field over_limit "$file")" "$(json_field errors "$file")" \
    "$serve_use" "$bench_use" "$redis_use"
done
echo
echo "(CPU: user + system time over each run's wall time, in % of one core; $(nproc) cores. A load"
echo "generator near its CPUs' limit caps every rate, /healthz's included: the ratios then say little.)"

if $redis; then
  requests=$(json_field requests "$BENCH_TMP/grpc.json")
  warmups=$(json_field warmup_requests "$BENCH_TMP/grpc.json")
  sent=$((requests + warmups))
  # Commandstats also counts the commands a script runs (TIME, GET, ...):
  # those are not round trips. They are the commands the library calls; the
  # same command sent by a client would be counted with them (the "time"
  # row, one per EVALSHA, tells: the script reads TIME once per call).
  inside=$(grep -ho '\(rcall\|rpcall\|redis\.call\|redis\.pcall\)("[A-Za-z]*"' \
    crates/tollgate/src/store/redis/*.lua crates/tollgate/src/algorithm/*.lua |
    sed 's/.*("\(.*\)"/\1/' | tr '[:upper:]' '[:lower:]' | sort -u | tr '\n' ' ')
  echo
  echo "Redis commands during the gRPC run, per request (INFO commandstats before and after;"
  echo "$sent requests: $requests timed + $warmups warm-ups)"
  echo
  awk -v sent="$sent" -v inside=" $inside" '
    FNR == NR { before[$1] = $2; next }
    { calls[$1] = $2 - before[$1] }
    END {
      printf "| %-12s | %-32s | %10s | %11s |\n", "command", "sent by", "calls", "per request"
      printf "|--------------|----------------------------------|-----------:|------------:|\n"
      # The engine call: the module'"'"'s TOLLGATE.DECIDE, or the library'"'"'s
      # FCALL on Redis 7+ and Valkey, EVALSHA before.
      library = calls["fcall"] + calls["evalsha"] + calls["tollgate.decide"]
      name = calls["tollgate.decide"] > 0 ? "tollgate.decide" : calls["fcall"] > 0 ? "fcall" : "evalsha"
      printf "| %-12s | %-32s | %10d | %11.3f |\n", name, "tollgate serve", library, library / sent
      other = 0
      for (c in calls) {
        if (c == "evalsha" || c == "fcall" || c == "tollgate.decide" || c == "info" || calls[c] == 0 || index(inside, " " c " ")) continue
        other += calls[c]
        printf "| %-12s | %-32s | %10d | %11.3f |\n", c, "tollgate serve", calls[c], calls[c] / sent
      }
      for (c in calls) {
        if (calls[c] == 0 || !index(inside, " " c " ")) continue
        printf "| %-12s | %-32s | %10d | %11.3f |\n", c, "the engine, inside the call", calls[c], calls[c] / sent
      }
      printf "\nround trips per request: %.3f: %s (target: at most one library call per request, batched, and no other command)\n",
        (library + other) / sent, (library > 0 && library <= sent && other == 0) ? "met" : "NOT met"
    }' "$BENCH_TMP/before.stats" "$BENCH_TMP/after.stats"
fi
