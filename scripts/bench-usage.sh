#!/usr/bin/env bash
# What a usage request costs, and that it does not grow with the store:
# `tollgate serve` on a redis-server this script starts (free port, no
# persistence), a tenant's rules (a minute's requests, a calendar month's
# token budget), then N sequential requests of each kind over one
# keep-alive connection — GET /v1/usage?domain=llm&tenant=acme (the
# listing's first page: the tenant's fixed rules, then the 100 models it
# has used, a rule whose model varies: SCAN steps) and POST /v1/usage of
# two descriptors — first on a Redis holding only those, then with
# 1 000 000 other keys in it (DEBUG POPULATE). Prints p50 and p99 of each,
# the pages and time a whole listing takes (following the cursor), and the
# key count before and after (a usage request writes nothing).
#
# Usage: scripts/bench-usage.sh
# Environment: N (default 3000). Everything it starts is stopped by pid.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh

no_arguments "$@"
N=${N:-3000}
need python3 "Debian: apt-get install -y python3"

bench_init
build_release
REDIS_EXTRA_ARGS=(--enable-debug-command local)
start_redis

cat >"$BENCH_TMP/llm.yaml" <<'YAML'
domain: llm
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: model
        value: gpt-4
        rate_limit:
          unit: month
          requests_per_unit: 5000000
          algorithm: {algorithm: fixed_window, limit: 5000000, calendar: month, time_zone: Europe/Paris, overage: record}
      - key: model
        rate_limit: {unit: day, requests_per_unit: 1000}
YAML
start_serve "$BENCH_TMP/llm.yaml" env TOLLGATE_READ_TOKEN=bench-reader

measure() {
  python3 - "$SERVE_HTTP" "$N" <<'PY'
import http.client, json, sys, time
host, port = sys.argv[1].rsplit(":", 1)
n = int(sys.argv[2])
connection = http.client.HTTPConnection(host, int(port))
headers = {"Authorization": "Bearer bench-reader", "Content-Type": "application/json"}
def timed(method, path, body=None):
    started = time.perf_counter()
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    response.read()
    assert response.status == 200, response.status
    return time.perf_counter() - started
body = json.dumps({"domain": "llm", "descriptors": [
    {"entries": [{"key": "tenant", "value": "acme"}]},
    {"entries": [{"key": "tenant", "value": "acme"}, {"key": "model", "value": "gpt-4"}]}]})
for _ in range(200):
    timed("GET", "/v1/usage?domain=llm&tenant=acme")
def walk():
    pages, rows, cursor, started = 0, 0, "", time.perf_counter()
    while True:
        connection.request("GET", "/v1/usage?domain=llm&tenant=acme&limit=100" + cursor, headers=headers)
        page = json.loads(connection.getresponse().read())
        pages, rows = pages + 1, rows + len(page["usage"])
        if page["cursor"] is None:
            return pages, rows, time.perf_counter() - started
        cursor = "&cursor=" + page["cursor"]
pages, rows, took = walk()
print(f"| the whole listing, 100 a page | {pages} pages, {rows} rows | {took * 1e3:.0f} ms |")
for name, call in [("GET /v1/usage?domain=llm&tenant=acme", lambda: timed("GET", "/v1/usage?domain=llm&tenant=acme")),
                   ("POST /v1/usage, 2 descriptors", lambda: timed("POST", "/v1/usage", body))]:
    times = sorted(call() for _ in range(n))
    print(f"| {name} | {times[n // 2] * 1e6:.0f} µs | {times[int(n * 0.99)] * 1e6:.0f} µs |")
PY
}

for model in $(seq 100); do
  curl -sf "http://$SERVE_HTTP/json" -d "{\"domain\": \"llm\", \"descriptors\": [{\"entries\": [{\"key\": \"tenant\", \"value\": \"acme\"}, {\"key\": \"model\", \"value\": \"m$model\"}]}]}" >/dev/null
done
echo "| request ($N each) | p50 | p99 |"
echo "|---|---:|---:|"
note "keys in Redis: $(rcli DBSIZE)"
measure
rcli DEBUG POPULATE 1000000 tollgate:filler 16 >/dev/null
note "keys in Redis: $(rcli DBSIZE)"
measure
note "keys in Redis after: $(rcli DBSIZE)"
machine
