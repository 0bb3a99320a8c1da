#!/usr/bin/env bash
# The Redis store against outside anchors started in the same run, on one
# redis-server this script starts (free port, no persistence, a temporary
# directory), with release builds. Prints Markdown:
#
# (a) throughput: redis-benchmark -c 50 -P 16 of a 12-line GCRA Lua script
#     (TIME, GET, SET … PX) and of INCR, then `tollgate bench --store
#     redis:// --tasks 64` (one process, one connection, GCRA that always
#     allows) without batching (--batch 1) and with micro-batching (the
#     default), and with one task (latency); the ratios the Redis engine
#     issue asks for: no batching / GCRA script >= 0.8, batching / INCR >= 0.3.
# (b) the cost table of `cargo run --example redis_cost` (crates/tollgate/
#     examples/redis_cost.rs): Redis CPU per decision of every algorithm next
#     to the GCRA script and an INCRBY + PEXPIRE script called the same way;
#     the sliding log and concurrency at 10 … 100 000 live entries; MEMORY
#     USAGE per algorithm next to a plain string key.
#
# Usage: scripts/bench-redis.sh
# Environment: DURATION (default 5s) per tollgate bench run; KEYS (default
# 1000) distinct keys; RB_REQUESTS (default 2000000) per redis-benchmark run;
# COST_DECISIONS (default 20000) per algorithm in (b); REDIS_SERVER (default
# redis-server) the server binary, e.g. a valkey-server.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh

no_arguments "$@"
DURATION=${DURATION:-5s}
KEYS=${KEYS:-1000}
RB_REQUESTS=${RB_REQUESTS:-2000000}
COST_DECISIONS=${COST_DECISIONS:-20000}
[[ "$KEYS" =~ ^[1-9][0-9]*$ ]] || die "KEYS must be a positive integer (got \"$KEYS\")"
need redis-benchmark "Debian: apt-get install -y redis-tools"

bench_init
build_release
note "building the cost example (cargo build --release --example redis_cost)"
cargo build --release --locked --quiet -p tollgate --example redis_cost
COST="${CARGO_TARGET_DIR:-target}/release/examples/redis_cost"
start_redis

# --- (a) throughput -------------------------------------------------------

GCRA_ANCHOR=$(cat crates/tollgate/examples/anchors/gcra.lua)
gcra_sha=$(rcli SCRIPT LOAD "$GCRA_ANCHOR")
[ "$(rcli EVALSHA "$gcra_sha" 1 probe 1 1000000000 | head -n 1)" = 1 ] || die "the GCRA anchor script does not allow"

rb() { # LABEL ARGS…: requests per second of redis-benchmark -c 50 -P 16
  local label=$1 rps
  shift
  rps=$(redis-benchmark -p "$REDIS_PORT" -c 50 -P 16 -n "$RB_REQUESTS" -r "$KEYS" --csv "$@" 2>/dev/null |
    awk -F'"' 'NR == 2 { print $4 }')
  [ -n "$rps" ] || die "redis-benchmark printed nothing for $label"
  printf '%.0f' "$rps"
}
tg() { # ARGS…: decisions per second of tollgate bench, and its p50 latency in µs
  "$TOLLGATE" bench --store "$REDIS_URL" --keys "$KEYS" --duration "$DURATION" --json --quiet "$@" >"$BENCH_TMP/tg.json"
  printf '%.0f %s\n' "$(json_field decisions_per_s "$BENCH_TMP/tg.json")" "$(json_field p50_us "$BENCH_TMP/tg.json")"
}

note "redis-benchmark: GCRA script and INCR"
rb_gcra=$(rb gcra EVALSHA "$gcra_sha" 1 "anchor:{__rand_int__}:gcra" 1 1000000000)
rb_incr=$(rb incr INCR "incr:__rand_int__")
note "tollgate bench: 64 tasks without and with batching, then 1 task"
read -r tg_single tg_single_p50 < <(tg --tasks 64 --batch 1)
read -r tg_batched tg_batched_p50 < <(tg --tasks 64)
read -r tg_one tg_one_p50 < <(tg --tasks 1)
read -r tg_one_unbatched tg_one_unbatched_p50 < <(tg --tasks 1 --batch 1)

echo "## Throughput on one redis-server ($(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')), $(machine)"
echo
echo "| run | decisions/s | p50 µs |"
echo "|---|---:|---:|"
echo "| redis-benchmark -c 50 -P 16, GCRA script | $rb_gcra | |"
echo "| redis-benchmark -c 50 -P 16, INCR | $rb_incr | |"
echo "| tollgate bench --tasks 64 --batch 1 (one decision per call) | $tg_single | $tg_single_p50 |"
echo "| tollgate bench --tasks 64 (micro-batching) | $tg_batched | $tg_batched_p50 |"
echo "| tollgate bench --tasks 1 (micro-batching on) | $tg_one | $tg_one_p50 |"
echo "| tollgate bench --tasks 1 --batch 1 | $tg_one_unbatched | $tg_one_unbatched_p50 |"
echo
echo "- no batching / GCRA script: $(awk -v a="$tg_single" -v b="$rb_gcra" 'BEGIN { printf "%.2f", a / b }') (target >= 0.8)"
echo "- micro-batching / INCR: $(awk -v a="$tg_batched" -v b="$rb_incr" 'BEGIN { printf "%.2f", a / b }') (target >= 0.3)"
echo

# --- (b) cost per decision, entries, memory ----------------------------------

"$COST" "$REDIS_URL" "$COST_DECISIONS"
