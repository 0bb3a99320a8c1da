#!/usr/bin/env bash
# Token budgets: what reserve + settle costs against a plain check, and
# the gateway's check + report, in one sitting, on the memory store and on
# one redis-server this script starts with Tollgate's module loaded (free
# port, no persistence, a temporary directory), each engine forced in turn;
# redis-benchmark's INCR (-P 16) on the same server is the anchor. Prints
# Markdown.
#
# Each run: `tollgate bench --op OP --cost 10 --cost-max 20`, a fixed window
# of 10^12 units (nothing is ever refused), 1 task on memory and 256 on
# Redis (enough to keep the client and the server busy: what is measured is
# cost, not a round trip's wait), on one key (one tenant's budget: its
# concurrent settlements go to the store together) and on 10 000 keys
# (each settlement a store call of its own). OP is check (one decision),
# settle (an estimate, then `Limiter::settle` at half of it: a check and a
# refund) or check-then-record (a check of 0, then a record of the cost).
# The target: a reserve + settle pair costs at most 2 x one check.
#
# Each figure is the median of ROUNDS runs (default 3), the checks and the
# pairs taking turns.
#
# Usage: scripts/bench-budget.sh
# Environment: REQUESTS (default 2000000 on memory, 400000 on Redis), ROUNDS.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh

no_arguments "$@"
need python3 "Debian: apt-get install -y python3"
need redis-benchmark "Debian: apt-get install -y redis-tools"

bench_init
build_release
build_module
REDIS_EXTRA_ARGS=(--loadmodule "$MODULE_SO")
start_redis

LIMIT='{"algorithm":"fixed_window","limit":1000000000000,"window":"3650d"}'
run=0
once() { # OUT STORE TASKS KEYS REQUESTS OP: one run, its JSON summary in OUT
  local out=$1 store=$2 tasks=$3 keys=$4 requests=$5 op=$6 prefix=()
  [ "$store" = memory ] || prefix=(--prefix "budget-${store##*=}-${out##*-}")
  "$TOLLGATE" bench --store "$store" --tasks "$tasks" --keys "$keys" --limit "$LIMIT" --requests "$requests" \
    --op "$op" --cost 10 --cost-max 20 --json --quiet ${prefix[@]+"${prefix[@]}"} >"$out"
}
three() { # STORE TASKS KEYS REQUESTS: ROUNDS rounds of check, settle, check-then-record taking
  # turns; prints, per op, the median operations/s and ns per operation (six numbers)
  local store=$1 tasks=$2 keys=$3 requests=$4 round checks=() settles=() reports=()
  for round in $(seq "$ROUNDS"); do
    run=$((run + 1))
    checks+=("$BENCH_TMP/run-$run")
    once "$BENCH_TMP/run-$run" "$store" "$tasks" "$keys" "$requests" check
    run=$((run + 1))
    settles+=("$BENCH_TMP/run-$run")
    once "$BENCH_TMP/run-$run" "$store" "$tasks" "$keys" "$requests" settle
    run=$((run + 1))
    reports+=("$BENCH_TMP/run-$run")
    once "$BENCH_TMP/run-$run" "$store" "$tasks" "$keys" "$requests" check-then-record
  done
  python3 - "${checks[*]}" "${settles[*]}" "${reports[*]}" <<'PY'
import json, statistics, sys
out = []
for paths in sys.argv[1:]:
    rate = statistics.median(json.load(open(path))["decisions_per_s"] for path in paths.split())
    out += [f"{rate:.0f}", f"{1e9 / rate:.0f}"]
print(*out)
PY
}

ROUNDS=${ROUNDS:-3}
MEMORY_REQUESTS=${REQUESTS:-2000000}
REDIS_REQUESTS=${REQUESTS:-400000}
note "memory"
read -r m_check m_check_ns m_settle m_settle_ns m_report m_report_ns < <(three memory 1 1 "$MEMORY_REQUESTS")
ratio() { python3 -c "print(f'{$1 / $2:.2f}')"; }
rows=()
for engine in module lua; do
  for keys in 1 10000; do
    note "redis, $engine, $keys key(s)"
    read -r check check_ns settle settle_ns report report_ns < <(three "$REDIS_URL?engine=$engine" 256 "$keys" "$REDIS_REQUESTS")
    where="Redis ${engine/lua/Lua}, 256 tasks, $keys key$([ "$keys" = 1 ] || echo s)"
    rows+=("| $where | check | $check | $check_ns | 1.00 |")
    rows+=("| $where | settle (estimate + settle) | $settle | $settle_ns | $(ratio "$settle_ns" "$check_ns") |")
    rows+=("| $where | check-then-record | $report | $report_ns | $(ratio "$report_ns" "$check_ns") |")
  done
done
note "anchor: redis-benchmark INCR -P 16"
incr=$(redis-benchmark -p "$REDIS_PORT" -c 50 -n 1000000 -P 16 -q -t incr | sed -n 's/.*INCR: \([0-9.]*\) requests per second.*/\1/p')

echo "## Token budgets: reserve + settle against a check, redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), $(machine)"
echo
echo "| store | op | per second | ns each | × one check |"
echo "|---|---|---:|---:|---:|"
echo "| memory, 1 task | check | $m_check | $m_check_ns | 1.00 |"
echo "| memory, 1 task | settle (estimate + settle) | $m_settle | $m_settle_ns | $(ratio "$m_settle_ns" "$m_check_ns") |"
echo "| memory, 1 task | check-then-record | $m_report | $m_report_ns | $(ratio "$m_report_ns" "$m_check_ns") |"
printf '%s\n' "${rows[@]}"
echo
echo "Anchor, same server and sitting: redis-benchmark -c 50 -P 16 INCR, $incr requests/s."
