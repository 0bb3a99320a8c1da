#!/usr/bin/env bash
# What alerts cost a decision through `tollgate serve`: two serve on one
# redis-server this script starts (with the module: engine=auto), both
# with --alert-webhook (the outbox's arguments go with every call), one on
# a rule without `alerts` (off), one on the same rule alerting at 50, 80
# and 100 % (on; a limit no load reaches, so no call crosses: the cost of
# every call, not of a crossing). Loaded in turn, ROUNDS times, by
# `tollgate bench --target grpc://…` with CONNECTIONS connections over KEYS
# descriptor values, each first in every other round. Prints per round each server's decisions/s and CPU per
# decision, then the median of the per-round ratios (on / off). Target: at
# most 3 % more CPU per decision, 3 % fewer decisions/s. (What a crossing
# itself costs Redis: the last table of crates/tollgate/examples/redis_cost.rs.)
#
# Usage: scripts/bench-alerts.sh
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
build_module
REDIS_EXTRA_ARGS=(--loadmodule "$MODULE_SO")
start_redis

for side in off on; do
  alerts=""
  [ "$side" = on ] && alerts=", alerts: [50, 80, 100]"
  cat >"$BENCH_TMP/$side.yaml" <<YAML
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: day, requests_per_unit: 1000000000$alerts}
YAML
done
# Nothing listens there: no call crosses, so nothing is sent.
webhook=http://127.0.0.1:9/alerts
start_serve "$BENCH_TMP/off.yaml" env TOLLGATE_ALERT_WEBHOOK=$webhook CACHE_KEY_PREFIX=off
off_pid=$SERVE_PID off_grpc=$SERVE_GRPC
mv "$BENCH_TMP/serve.log" "$BENCH_TMP/serve-off.log"
start_serve "$BENCH_TMP/on.yaml" env TOLLGATE_ALERT_WEBHOOK=$webhook CACHE_KEY_PREFIX=on
on_pid=$SERVE_PID on_grpc=$SERVE_GRPC

on_off_rounds "$off_pid" "$off_grpc" "$on_pid" "$on_grpc"
machine
