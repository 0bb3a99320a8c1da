#!/usr/bin/env bash
# The Redis module (crates/tollgate-redis-module) against outside anchors
# started in the same run, on one redis-server this script starts (free
# port, no persistence, a temporary directory) with the module and
# redis-cell 0.2.2 (built here from its crates.io source) loaded. Prints
# Markdown:
#
# (a) the engine alone: redis-benchmark -c 50 -P 16 of INCR, of redis-cell's
#     CL.THROTTLE and of TOLLGATE.DECIDE, each deciding one GCRA limit that
#     always allows over KEYS keys (target: module >= 1.0 x redis-cell);
# (b) end to end, one process: tollgate bench --tasks 64 on engine=module and
#     engine=lua, with the process's CPU per decision, in two shapes: one
#     client thread (the other core is the server's, as redis-benchmark runs;
#     target <= 2 us of client CPU per decision), and two client threads with
#     calls of at most 24 decisions, so that two calls overlap (the server
#     decides one while the client answers the other; target: module >= 0.25
#     x INCR);
# (c) the cost tables of crates/tollgate/examples/redis_cost.rs on the module
#     (Redis CPU per decision of every algorithm next to its hand-written
#     anchor script; targets: GCRA <= 0.35 x the GCRA script; sliding log and
#     concurrency <= 1.0 x the sliding log script, and within 1.2 x from 10 to
#     100 000 entries on the key).
#
# Usage: scripts/bench-module.sh
# Environment: DURATION (default 5s) per tollgate bench run; KEYS (default
# 1000); RB_REQUESTS (default 2000000) per redis-benchmark run; REDIS_SERVER
# (default redis-server) the server binary, e.g. a valkey-server.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh

no_arguments "$@"
DURATION=${DURATION:-5s}
KEYS=${KEYS:-1000}
RB_REQUESTS=${RB_REQUESTS:-2000000}
need redis-benchmark "Debian: apt-get install -y redis-tools"

bench_init
build_release
build_module
note "building the cost example"
cargo build --release --locked --quiet -p tollgate --example redis_cost
TARGET="${CARGO_TARGET_DIR:-target}"

note "building redis-cell 0.2.2 (the anchor) from its crates.io source"
mkdir -p "$BENCH_TMP/cell-fetch/src"
printf '[package]\nname = "cell-fetch"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nredis-cell = "=0.2.2"\n' >"$BENCH_TMP/cell-fetch/Cargo.toml"
: >"$BENCH_TMP/cell-fetch/src/lib.rs"
(cd "$BENCH_TMP/cell-fetch" && cargo fetch --quiet)
cell_src=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d -name 'redis-cell-0.2.2' | head -n 1)
[ -n "$cell_src" ] || die "redis-cell 0.2.2 was not fetched"
cp -r "$cell_src" "$BENCH_TMP/redis-cell"
(cd "$BENCH_TMP/redis-cell" && cargo build --release --quiet 2>/dev/null)
CELL="$BENCH_TMP/redis-cell/target/release/libredis_cell.so"

REDIS_EXTRA_ARGS=(--loadmodule "$MODULE_SO" --loadmodule "$CELL")
start_redis

rb() { # ARGS…: requests per second of redis-benchmark -c 50 -P 16
  local rate
  rate=$(redis-benchmark -p "$REDIS_PORT" -c 50 -P 16 -n "$RB_REQUESTS" -r "$KEYS" --csv "$@" 2>/dev/null |
    awk -F'"' 'NR == 2 { printf "%.0f", $4 }') || die "redis-benchmark $1 failed (does the server answer $1 $2 …?)"
  [ -n "$rate" ] || die "redis-benchmark $1 reported no rate"
  printf '%s' "$rate"
}
GCRA='{"algorithm":"gcra","rate":1000000,"period":"1s","burst":1000}'
tg() { # ENGINE THREADS BATCH: decisions per second and client CPU per decision of tollgate bench --tasks 64
  "$TOLLGATE" bench --store "$REDIS_URL?engine=$1" --tasks 64 --threads "$2" --batch "$3" --keys "$KEYS" \
    --limit "$GCRA" --duration "$DURATION" --json --quiet >"$BENCH_TMP/tg.json"
  printf '%.0f %s\n' "$(json_field decisions_per_s "$BENCH_TMP/tg.json")" "$(json_field cpu_us_per_decision "$BENCH_TMP/tg.json")"
}

note "redis-benchmark: INCR, CL.THROTTLE, TOLLGATE.DECIDE (twice each, interleaved)"
incr=() cell=() module=()
for _ in 1 2; do
  incr+=("$(rb INCR 'incr:__rand_int__')")
  cell+=("$(rb CL.THROTTLE 'cell:__rand_int__' 1000 1000000 1 1)")
  # GCRA <burst>:<unit µs>:<cells per unit>:<max debt ticks (2^52: none)>, then the cost.
  module+=("$(rb TOLLGATE.DECIDE 1 'module:__rand_int__' 1 '1:1:1:-1:' '7:1000:1:1:4503599627370496:1')")
done
note "tollgate bench: module, lua, module, lua; one thread, then two"
read -r tg_module tg_module_cpu < <(tg module 1 64)
read -r tg_lua tg_lua_cpu < <(tg lua 1 64)
read -r tg_module2 tg_module2_cpu < <(tg module 1 64)
read -r tg_lua2 tg_lua2_cpu < <(tg lua 1 64)
read -r tw_module tw_module_cpu < <(tg module 2 24)
read -r tw_lua tw_lua_cpu < <(tg lua 2 24)
read -r tw_module2 tw_module2_cpu < <(tg module 2 24)
read -r tw_lua2 tw_lua2_cpu < <(tg lua 2 24)

echo "## The module on one redis-server ($(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')), $(machine)"
echo
echo "| run | requests/s (two runs) |"
echo "|---|---:|"
echo "| redis-benchmark -c 50 -P 16, INCR | ${incr[0]}, ${incr[1]} |"
echo "| redis-benchmark -c 50 -P 16, redis-cell CL.THROTTLE (GCRA) | ${cell[0]}, ${cell[1]} |"
echo "| redis-benchmark -c 50 -P 16, TOLLGATE.DECIDE (GCRA) | ${module[0]}, ${module[1]} |"
echo
echo "- module / redis-cell: $(awk -v a="${module[0]}" -v b="${cell[0]}" -v c="${module[1]}" -v d="${cell[1]}" 'BEGIN { printf "%.3f, %.3f", a / b, c / d }') (target >= 1.0)"
echo
echo "| tollgate bench --tasks 64, GCRA always allowing | decisions/s | client CPU µs per decision |"
echo "|---|---:|---:|"
echo "| engine=module, --threads 1 | $tg_module, $tg_module2 | $tg_module_cpu, $tg_module2_cpu |"
echo "| engine=lua, --threads 1 | $tg_lua, $tg_lua2 | $tg_lua_cpu, $tg_lua2_cpu |"
echo "| engine=module, --threads 2 --batch 24 | $tw_module, $tw_module2 | $tw_module_cpu, $tw_module2_cpu |"
echo "| engine=lua, --threads 2 --batch 24 | $tw_lua, $tw_lua2 | $tw_lua_cpu, $tw_lua2_cpu |"
echo
echo "- module end to end / INCR: one thread $(awk -v a="$tg_module" -v b="${incr[0]}" 'BEGIN { printf "%.2f", a / b }'), two threads $(awk -v a="$tw_module" -v b="${incr[0]}" 'BEGIN { printf "%.2f", a / b }') (target >= 0.25)"
echo
# The module: the table of every algorithm, the keys of 10 … 100 000
# entries next to the sliding log script, the longest calls. The library:
# the table of every algorithm (its keys of many entries: bench-redis.sh).
echo "### engine=module"
echo
"$TARGET/release/examples/redis_cost" "$REDIS_URL?engine=module" 20000 2>/dev/null |
  sed -n '/^| what/,/^$/p; /^## One key/,/^## MEMORY/p' | sed '/^## MEMORY/d'
echo "### engine=lua"
echo
"$TARGET/release/examples/redis_cost" "$REDIS_URL?engine=lua" 20000 2>/dev/null |
  sed -n '/^| what/,/^$/p'
