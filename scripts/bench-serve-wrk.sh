#!/usr/bin/env bash
# `tollgate serve` (memory store) saturated by C load generators, so that the
# server, not the load generator, is the bottleneck: wrk (HTTP/1.1) for
# /healthz, /v1/check and /json, h2load (HTTP/2) for gRPC ShouldRateLimit;
# 64 connections each. The server is pinned to CPU 0, the load to CPU 1.
# Each decision endpoint runs twice: with a descriptor its rule matches (a
# decision), and with one no rule matches (the same request and answer
# path, no store call: the floor the front end sets).
# Prints requests/s of each and the ratio to /healthz.
#
# Usage: scripts/bench-serve-wrk.sh   (DURATION=5 seconds by default)
# Needs: wrk and h2load (Debian: apt-get install -y wrk nghttp2-client), python3.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in wrk h2load taskset python3; do
  command -v "$tool" >/dev/null || { echo "bench-serve-wrk.sh: $tool is missing (apt-get install -y wrk nghttp2-client)" >&2; exit 1; }
done
duration=${DURATION:-5}
work=$(mktemp -d)
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
cargo build --release -q -p tollgate-cli

cat > "$work/limits.yaml" <<'YAML'
domain: bench
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000000000}
YAML
# Request bodies: Tollgate's /v1/check, Envoy's /json, and the gRPC message
# (a 5-byte gRPC frame header, then RateLimitRequest in protobuf).
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def body(key):
    return {"domain": "bench", "descriptors": [{"entries": [{"key": key, "value": "c-1"}]}]}
open(f"{work}/body.json", "w").write(json.dumps(body("client")))
open(f"{work}/body-nomatch.json", "w").write(json.dumps(body("nomatch")))
def varint(n):
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        out += bytes([low | (0x80 if n else 0)])
        if not n:
            return out
def field(number, payload):
    return varint(number << 3 | 2) + varint(len(payload)) + payload
for key, name in [(b"client", "grpc.bin"), (b"nomatch", "grpc-nomatch.bin")]:
    entry = field(1, key) + field(2, b"c-1")
    request = field(1, b"bench") + field(2, field(1, entry)) + varint(3 << 3) + varint(1)
    open(f"{work}/{name}", "wb").write(b"\0" + len(request).to_bytes(4, "big") + request)
PY
for body in body body-nomatch; do
  printf 'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nlocal f = io.open("%s/%s.json"); wrk.body = f:read("*a"); f:close()\n' "$work" "$body" > "$work/$body.lua"
done

taskset -c 0 target/release/tollgate serve --config "$work/limits.yaml" --http 127.0.0.1:0 --grpc 127.0.0.1:0 2> "$work/serve.log" &
server=$!
for _ in $(seq 100); do grep -q "is ready" "$work/serve.log" && break; sleep 0.1; done
http=$(grep -o 'http=[0-9.:]*' "$work/serve.log" | head -1 | cut -d= -f2)
grpc=$(grep -o 'grpc=[0-9.:]*' "$work/serve.log" | head -1 | cut -d= -f2)
[ -n "$http" ] && [ -n "$grpc" ] || { echo "bench-serve-wrk.sh: the server did not start" >&2; cat "$work/serve.log" >&2; exit 1; }

rate_wrk() { taskset -c 1 wrk -t1 -c64 -d"${duration}s" "$@" | awk '/Requests\/sec/ {print $2}'; }
rate_h2load() {
  taskset -c 1 h2load -c64 -m1 -D"$duration" -H 'content-type: application/grpc' -H 'te: trailers' \
    -d "$work/$1" "http://$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" 2>&1 \
    | awk '/finished in/ {print $4}'
}
healthz=$(rate_wrk "http://$http/healthz")
rows=("GET /healthz:$healthz")
for path in /v1/check /json; do
  rows+=("POST $path:$(rate_wrk -s "$work/body.lua" "http://$http$path")")
  rows+=("POST $path, no rule matches:$(rate_wrk -s "$work/body-nomatch.lua" "http://$http$path")")
done
rows+=("gRPC ShouldRateLimit (h2load):$(rate_h2load grpc.bin)")
rows+=("gRPC ShouldRateLimit, no rule matches:$(rate_h2load grpc-nomatch.bin)")

echo "tollgate serve (memory store) on CPU 0, wrk / h2load on CPU 1, 64 connections, ${duration}s each"
echo
echo "| run | requests/s | vs /healthz |"
echo "| --- | ---: | ---: |"
for row in "${rows[@]}"; do
  name=${row%%:*}; rate=${row##*:}
  printf '| %s | %.0f | %.2f |\n' "$name" "$rate" "$(python3 -c "print($rate / $healthz)")"
done
