#!/usr/bin/env bash
# What keeping the heaviest descriptors (/v1/top) costs a decision: two
# `tollgate serve` on the memory store (its cheapest decisions, where a
# cost shows most), one without a token (the sketches off) and one with a
# read-only token (the sketches on), loaded in turn, ROUNDS times, by
# `tollgate bench --target grpc://…` with CONNECTIONS connections over KEYS
# distinct descriptor values (100 000: most descriptors are new to a sketch,
# its costliest path), each first in every other round. Prints per round
# each server's decisions/s and CPU per decision, then the median of the
# per-round ratios (on / off). Target: at most 3 % more CPU per decision,
# 3 % fewer decisions/s.
#
# Usage: scripts/bench-top.sh
# Environment: DURATION (default 5s), ROUNDS (5), CONNECTIONS (64), KEYS
# (100000). Everything it starts is stopped by pid when it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh

no_arguments "$@"
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-5}
CONNECTIONS=${CONNECTIONS:-64}
KEYS=${KEYS:-100000}

bench_init
build_release

cat >"$BENCH_TMP/config.yaml" <<'YAML'
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000000000}
YAML

start_serve "$BENCH_TMP/config.yaml" env -u TOLLGATE_READ_TOKEN -u TOLLGATE_ADMIN_TOKEN
off_pid=$SERVE_PID off_grpc=$SERVE_GRPC
mv "$BENCH_TMP/serve.log" "$BENCH_TMP/serve-off.log"
start_serve "$BENCH_TMP/config.yaml" env TOLLGATE_READ_TOKEN=bench-reader
on_pid=$SERVE_PID on_grpc=$SERVE_GRPC

on_off_rounds "$off_pid" "$off_grpc" "$on_pid" "$on_grpc"
machine
