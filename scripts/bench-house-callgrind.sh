#!/usr/bin/env bash
# The in-process decision against a base commit, counted in instructions
# (callgrind), which unlike wall time barely varies from run to run: the
# probe (scripts/lib/house_probe.rs) copied into this tree and into BASE
# (default 7521433, built in a worktree), built with the bench profile, and
# each of its loops counted alone. Prints instructions per decision on each
# side and their ratio: a direct limiter's request and check, the memory
# store's request and check over 1 000 subjects (GCRA, its one-word path),
# and one subject of each algorithm as the `algorithms` bench decides it.
#
# Usage: scripts/bench-house-callgrind.sh
# Environment: BASE (7521433); BASE_TREE and BASE_TARGET as for
# scripts/bench-house.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=${BASE:-7521433}
BASE_TREE=${BASE_TREE:-target/house/tree}
BASE_TARGET=${BASE_TARGET:-$PWD/target/house/target}
command -v valgrind >/dev/null || { echo "valgrind is missing (Debian: apt-get install -y valgrind)" >&2; exit 1; }
if [ $# -ne 0 ]; then
    echo "usage: scripts/bench-house-callgrind.sh (no arguments)" >&2
    exit 2
fi
if [ ! -d "$BASE_TREE" ]; then
    git worktree add --detach "$BASE_TREE" "$BASE" >/dev/null
fi
OUT=$(mktemp -d)
PROBE=crates/tollgate/examples/house_probe.rs
trap 'rm -rf "$OUT" "$PROBE" "$BASE_TREE/$PROBE"' EXIT
cp scripts/lib/house_probe.rs "$PROBE"
cp scripts/lib/house_probe.rs "$BASE_TREE/$PROBE"
cargo build -q --profile bench -p tollgate --example house_probe
(cd "$BASE_TREE" && CARGO_TARGET_DIR=$BASE_TARGET cargo build -q --profile bench -p tollgate --example house_probe)
new_bin=target/release/examples/house_probe
base_bin=$BASE_TARGET/release/examples/house_probe

# Instructions per decision of loop $2 of binary $1 (its argument $3).
per_decision() {
    valgrind --tool=callgrind --callgrind-out-file="$OUT/out" --collect-atstart=no \
        "--toggle-collect=*probe_$2*" "$1" "$2" ${3:+"$3"} 2>&1 |
        sed -n 's/.*Collected : \([0-9]*\).*/\1/p' | awk '{ printf "%.1f", $1 / 200000 }'
}

printf '%-28s %9s %9s %7s\n' probe this base ratio
while read -r name loop json; do
    new=$(per_decision "$new_bin" "$loop" "$json")
    base=$(per_decision "$base_bin" "$loop" "$json")
    awk -v n="$name" -v a="$new" -v b="$base" 'BEGIN { printf "%-28s %9.1f %9.1f %7.3f\n", n, a, b, a / b }'
done <<'PROBES'
direct_request direct_request
direct_check direct_check
keyed_request store_request
keyed_check store_check
fixed_window one {"algorithm":"fixed_window","limit":100,"window":"1s"}
sliding_window one {"algorithm":"sliding_window","limit":100,"window":"1s","buckets":10}
sliding_log one {"algorithm":"sliding_log","limit":100,"window":"1s"}
token_bucket_smooth one {"algorithm":"token_bucket","capacity":10,"refill":100,"interval":"1s"}
token_bucket_interval one {"algorithm":"token_bucket","capacity":10,"refill":1,"interval":"10ms","mode":"interval"}
reservation one {"algorithm":"reservation","rate":100,"period":"1s","max_burst":10}
leaky_bucket one {"algorithm":"leaky_bucket","rate":100,"period":"1s","capacity":10}
gcra one {"algorithm":"gcra","rate":100,"period":"1s","burst":10}
PROBES
