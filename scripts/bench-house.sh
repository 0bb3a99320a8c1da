#!/usr/bin/env bash
# The in-process decision against a base commit: every benchmark of the
# `keyed` and `algorithms` benches of this tree and of BASE (default
# 7521433, built in a worktree), benchmark by benchmark, the two sides in
# turn ROUNDS times, each first in every other round. Prints each benchmark's median of the per-round
# ratios (this tree / base), the worst per group, and this tree's fair
# groups against governor (same run). Targets: every group within 1.05 ×
# of base, the fair groups at or under governor.
#
# Usage: scripts/bench-house.sh [regex of benchmark ids]
# Environment: BASE (7521433), ROUNDS (4), WARM (0.3 s), MEASURE (0.7 s);
# BASE_TREE and BASE_TARGET reuse a worktree and a target directory already
# built (default: target/house/tree and target/house/target).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=${BASE:-7521433}
ROUNDS=${ROUNDS:-4}
WARM=${WARM:-0.3}
MEASURE=${MEASURE:-0.7}
FILTER=${1:-}
BASE_TREE=${BASE_TREE:-target/house/tree}
BASE_TARGET=${BASE_TARGET:-$PWD/target/house/target}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

if [ ! -d "$BASE_TREE" ]; then
    git worktree add --detach "$BASE_TREE" "$BASE" >/dev/null
fi

# The bench executables of the tree in $1 built into $2, one per line.
bench_bins() {
    (cd "$1" && CARGO_TARGET_DIR=$2 cargo bench -p tollgate --bench keyed --bench algorithms \
        --no-run --message-format=json) |
        python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["kind"] == ["bench"] and m.get("executable"):
        print(m["executable"])'
}

echo "building this tree and $BASE ..." >&2
mapfile -t new_bins < <(bench_bins . "$PWD/target")
mapfile -t base_bins < <(bench_bins "$BASE_TREE" "$BASE_TARGET")

# Each benchmark of each bench, matched by `^id$` (and FILTER), as the
# bench lists it.
benchmarks() {
    "$1" --bench --list 2>/dev/null | sed -n 's/: benchmark$//p' | grep -E -- "${FILTER:-.}" || true
}

# Runs benchmark $4 of side $1's bench $3 into $OUT/<side>/<round $2>.
run_one() {
    CRITERION_HOME="$OUT/$1/$2" "$3" --bench --noplot --warm-up-time "$WARM" \
        --measurement-time "$MEASURE" "^$(printf '%s' "$4" | sed 's/[][+.*^$()|?{}]/\\&/g')\$" >/dev/null 2>&1
}

# Benchmark by benchmark, the two sides in turn ROUNDS times (each first
# in every other round), so that each pair of runs meets the machine in the
# same state: its load drifts over minutes, more than the differences
# measured.
for new_bin in "${new_bins[@]}"; do
    # The base's executable of the same bench (`<bench>-<hash>`).
    bench=$(basename "$new_bin")
    base_bin=$(printf '%s\n' "${base_bins[@]}" | grep "/${bench%-*}-[0-9a-f]*$")
    while IFS= read -r id; do
        echo "$id" >&2
        for round in $(seq 1 "$ROUNDS"); do
            if ((round % 2)); then
                run_one new "$round" "$new_bin" "$id"
                run_one base "$round" "$base_bin" "$id"
            else
                run_one base "$round" "$base_bin" "$id"
                run_one new "$round" "$new_bin" "$id"
            fi
        done
    done < <(benchmarks "$new_bin")
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])

def read(side, round_):
    found = {}
    for root, _, files in os.walk(os.path.join(out, side, str(round_))):
        if root.endswith("/new") and "estimates.json" in files:
            with open(os.path.join(root, "benchmark.json")) as f:
                name = json.load(f)["full_id"]
            with open(os.path.join(root, "estimates.json")) as f:
                found[name] = json.load(f)["median"]["point_estimate"]
    return found

new = [read("new", r) for r in range(1, rounds + 1)]
base = [read("base", r) for r in range(1, rounds + 1)]
names = sorted(set(new[0]) & set(base[0]))
groups = {}
print(f"{'benchmark':<64} {'this ns':>9} {'base ns':>9} {'ratio':>7}")
for name in names:
    ratios = [n[name] / b[name] for n, b in zip(new, base) if name in n and name in b]
    ratio = statistics.median(ratios)
    this = statistics.median(n[name] for n in new if name in n)
    that = statistics.median(b[name] for b in base if name in b)
    print(f"{name:<64} {this:>9.1f} {that:>9.1f} {ratio:>7.3f}")
    group = name.rsplit("/", 1)[0]
    groups[group] = max(groups.get(group, 0), ratio)
print()
print("worst ratio per group (target ≤ 1.05):")
for group, worst in sorted(groups.items()):
    print(f"  {group:<50} {worst:.3f}")
print()
print("this tree against governor in the fair and direct groups, same runs (target ≤ 1.00):")
for group in sorted({name.rsplit("/", 1)[0] for name in new[0]}):
    if "fair" not in group and "direct" not in group:
        continue
    members = sorted(name for name in new[0] if name.startswith(group + "/"))
    anchors = [name for name in members if name.rsplit("/", 1)[1].startswith("governor")]
    if not anchors:
        continue
    for ours in (name for name in members if name not in anchors):
        ratios = [n[ours] / n[anchors[0]] for n in new if ours in n and anchors[0] in n]
        print(f"  {ours:<58} {statistics.median(ratios):.3f}")
PY
