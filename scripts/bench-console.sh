#!/usr/bin/env bash
# What open consoles cost the decisions: one `tollgate serve` (memory store,
# a read-only token, so the heaviest-descriptor sketches are kept) loaded by
# `tollgate bench --target grpc://…` (CONNECTIONS connections, KEYS values)
# in rounds, alternately with no console open and with CONSOLES consoles
# open. A console is what the page asks every 2 s on its busiest page (Top):
# /v1/overview, /v1/top?domain=bench&k=10 and /v1/usage for the descriptors
# listed, here from a Python thread each. Prints each round's decisions/s
# and the server's CPU per decision, then the median of per-round ratios
# (open / none). Target: decisions/s within 3 %.
#
# Usage: scripts/bench-console.sh
# Environment: DURATION (5s), ROUNDS (5), CONSOLES (10), CONNECTIONS (64),
# KEYS (10000). Everything it starts is stopped by pid when it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh

no_arguments "$@"
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-5}
CONSOLES=${CONSOLES:-10}
CONNECTIONS=${CONNECTIONS:-64}
KEYS=${KEYS:-10000}
need python3 "Debian: apt-get install -y python3"

bench_init
build_release
cat >"$BENCH_TMP/config.yaml" <<'YAML'
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000000000}
YAML
start_serve "$BENCH_TMP/config.yaml" env TOLLGATE_READ_TOKEN=bench-reader


# The consoles: CONSOLES pollers in one Python process, until killed.
cat >"$BENCH_TMP/consoles.py" <<'PY'
import http.client, json, sys, threading, time
host, port = sys.argv[1].rsplit(":", 1)
headers = {"Authorization": "Bearer bench-reader", "Content-Type": "application/json"}
def console():
    connection = http.client.HTTPConnection(host, int(port))
    def get(method, path, body=None):
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return json.loads(response.read() or b"null")
    while True:
        started = time.monotonic()
        get("GET", "/v1/overview")
        top = get("GET", "/v1/top?domain=bench&k=10")
        keys = [heavy["key"] for rule in top["rules"] for heavy in rule["hits"]]
        descriptors = [{"entries": [{"key": k, "value": v} for k, v in (p.split("=", 1) for p in key.split(", "))]} for key in keys]
        if descriptors:
            get("POST", "/v1/usage", json.dumps({"domain": "bench", "descriptors": descriptors}))
        time.sleep(max(0.0, 2.0 - (time.monotonic() - started)))
for _ in range(int(sys.argv[2])):
    threading.Thread(target=console, daemon=True).start()
while True:
    time.sleep(3600)
PY

echo "| round | none: decisions/s | none: CPU µs/decision | $CONSOLES open: decisions/s | open: CPU µs/decision | open/none rate | open/none CPU |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
: >"$BENCH_TMP/rows"
for round in $(seq "$ROUNDS"); do
  note "round $round of $ROUNDS"
  read -r none_rate none_cpu < <(grpc_load "none-$round" "$SERVE_PID" "$SERVE_GRPC")
  python3 "$BENCH_TMP/consoles.py" "$SERVE_HTTP" "$CONSOLES" &
  pollers=$!
  BENCH_PIDS+=("$pollers")
  read -r open_rate open_cpu < <(grpc_load "open-$round" "$SERVE_PID" "$SERVE_GRPC")
  kill "$pollers" 2>/dev/null || true
  wait "$pollers" 2>/dev/null || true
  awk -v r="$round" -v a="$none_rate" -v b="$none_cpu" -v c="$open_rate" -v d="$open_cpu" \
    'BEGIN { printf "| %d | %d | %.2f | %d | %.2f | %.3f | %.3f |\n", r, a, b, c, d, c / a, d / b }' | tee -a "$BENCH_TMP/rows"
done
echo
echo "median of the per-round ratios ($CONSOLES consoles open / none): decisions/s $(awk -F'|' '{ print $7 }' "$BENCH_TMP/rows" | median), CPU per decision $(awk -F'|' '{ print $8 }' "$BENCH_TMP/rows" | median)"
machine
