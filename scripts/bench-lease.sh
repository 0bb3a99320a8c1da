#!/usr/bin/env bash
# Leases on one hot key, against anchors started in the same run: one
# redis-server this script starts (free port, no persistence, a temporary
# directory), four `tollgate bench` processes at once, every one on the same
# key (--keys 1, the same --prefix). Prints Markdown:
#
# (a) throughput: GCRA 1 000 000/s burst 1 000, 16 tasks a process, without
#     a lease, with "lease": "50ms", and the same four processes on the
#     memory store (each its own: the machine's ceiling); aggregate
#     decisions/s and store calls per decision (targets: >= 10 x without a
#     lease, or >= 0.8 x memory where that is lower; <= 0.02 calls);
# (b) over-admission at full size: each leasable algorithm with a 50 ms
#     lease, the admissions of all four processes against its bound over
#     the run (server TIME) stretched by one lease, over >= 1 M decisions;
# (c) fairness: a fixed window of 20 000/s with a 50 ms lease, the four
#     processes sending at a steady rate (--rate) of twice the limit, then
#     half: each process's share of the admissions (target: 25 % +- 20 %),
#     and the denials at half the limit (target: none).
#
# Usage: scripts/bench-lease.sh
# Environment: DURATION (default 5s) per run.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh

no_arguments "$@"
DURATION=${DURATION:-5s}
need python3 "Debian: apt-get install -y python3"

bench_init
build_release
start_redis

run=0
four() { # STORE LIMIT [ARGS…]: four processes at once; their JSON summaries in $BENCH_TMP/run-N.*
  local store=$1 limit=$2 pids=() i prefix=()
  shift 2
  run=$((run + 1))
  [ "$store" = memory ] || prefix=(--prefix "lease-$run")
  for i in 1 2 3 4; do
    "$TOLLGATE" bench --store "$store" --tasks 16 --keys 1 --limit "$limit" --duration "$DURATION" \
      --json --quiet ${prefix[@]+"${prefix[@]}"} "$@" >"$BENCH_TMP/run-$run.$i" &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
}
sums() { # RUN: decisions/s, store calls per decision, allowed, decisions, start, end, shares (%)
  python3 - "$BENCH_TMP/run-$1".* <<'PY'
import json, sys
runs = [json.load(open(path)) for path in sys.argv[1:]]
decided = sum(r["allowed"] + r["denied"] for r in runs)
allowed = sum(r["allowed"] for r in runs)
rate = sum(r["decisions_per_s"] for r in runs)
calls = sum(r["store_calls"] for r in runs)
start = min(r["server_time_start_us"] for r in runs)
end = max(r["server_time_end_us"] for r in runs)
shares = "/".join(f'{100 * r["allowed"] / max(allowed, 1):.1f}' for r in runs)
denied = sum(r["denied"] for r in runs)
print(rate, f"{calls / max(decided, 1):.4f}", allowed, decided, start, end, shares, denied)
PY
}

GCRA='{"algorithm":"gcra","rate":1000000,"period":"1s","burst":1000}'
GCRA_LEASED='{"algorithm":"gcra","rate":1000000,"period":"1s","burst":1000,"lease":"50ms"}'
note "(a) one hot key: no lease, a lease, memory"
four "$REDIS_URL" "$GCRA"
read -r plain_rate plain_calls _ < <(sums "$run")
four "$REDIS_URL" "$GCRA_LEASED"
read -r leased_rate leased_calls leased_allowed leased_decided leased_start leased_end leased_shares _ < <(sums "$run")
four memory "$GCRA"
read -r memory_rate _ < <(sums "$run")

echo "## Leases on one hot key, one redis-server ($(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')), $(machine)"
echo
echo "| 4 processes x 16 tasks, one key, GCRA 10^6/s burst 1 000 | decisions/s | store calls per decision |"
echo "|---|---:|---:|"
echo "| Redis, no lease | $plain_rate | $plain_calls |"
echo "| Redis, \"lease\": \"50ms\" | $leased_rate | $leased_calls |"
echo "| memory (each process its own store) | $memory_rate | - |"
echo
awk -v l="$leased_rate" -v p="$plain_rate" -v m="$memory_rate" 'BEGIN {
  printf "- leased / no lease: %.1f x; leased / memory: %.2f x (target: >= 10 x, or >= 0.8 x memory where lower)\n", l / p, l / m }'
echo "- the leased run admitted $leased_allowed of $leased_decided decisions over $((leased_end - leased_start)) us (bound: 1 000 + 10^6/s over the run and one lease)"
echo

note "(b) over-admission at full size, every leasable algorithm"
echo "| limit, \"lease\": \"50ms\" | decisions | admitted | bound over [S - lease, E] | shares % |"
echo "|---|---:|---:|---:|---|"
lease_us=50000
for spec in \
  'fixed_window|{"algorithm":"fixed_window","limit":50000,"window":"1s","lease":"50ms"}' \
  'sliding_window|{"algorithm":"sliding_window","limit":50000,"window":"1s","buckets":10,"lease":"50ms"}' \
  'sliding_log|{"algorithm":"sliding_log","limit":2000,"window":"1s","lease":"50ms"}' \
  'token_bucket|{"algorithm":"token_bucket","capacity":5000,"refill":50000,"interval":"1s","lease":"50ms"}' \
  'gcra|{"algorithm":"gcra","rate":50000,"period":"1s","burst":5000,"lease":"50ms"}'; do
  name=${spec%%|*} limit=${spec#*|}
  four "$REDIS_URL" "$limit"
  read -r _ _ allowed decided start end shares _ < <(sums "$run")
  bound=$(python3 - "$name" "$((start - lease_us))" "$end" <<'PY'
import sys
name, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
span = b - a
print({
    "fixed_window": 50000 * (b // 1000000 - a // 1000000 + 1),
    "sliding_window": 50000 * -(-(span + 1) // 1000001),
    "sliding_log": 2000 * -(-(span + 1) // 1000000),
    "token_bucket": 5000 + 50000 * span // 1000000,
    "gcra": 5000 + 50000 * span // 1000000,
}[name])
PY
)
  verdict=$([ "$allowed" -le "$bound" ] && echo "within" || echo "OVER")
  echo "| $name | $decided | $allowed | $bound ($verdict) | $shares |"
done
echo

note "(c) fairness: twice the limit, then half, at a steady rate"
FAIR='{"algorithm":"fixed_window","limit":20000,"window":"1s","lease":"50ms"}'
four "$REDIS_URL" "$FAIR" --rate 10000
read -r _ twice_calls twice_allowed twice_decided _ _ twice_shares _ < <(sums "$run")
four "$REDIS_URL" "$FAIR" --rate 2500
read -r _ half_calls half_allowed half_decided _ _ half_shares half_denied < <(sums "$run")
echo "| fixed window 20 000/s, lease 50 ms, 4 processes | decisions | admitted | shares % | denied | store calls per decision |"
echo "|---|---:|---:|---|---:|---:|"
echo "| twice the limit (4 x 10 000/s) | $twice_decided | $twice_allowed | $twice_shares | $((twice_decided - twice_allowed)) | $twice_calls |"
echo "| half the limit (4 x 2 500/s) | $half_decided | $half_allowed | $half_shares | $half_denied | $half_calls |"
