# shellcheck shell=bash
# Shared by scripts/bench-serve.sh, bench-envoy.sh and bench-redis.sh (sourced, not
# run): errors, required binaries, the release build, a private redis-server,
# reading `tollgate bench --json` summaries, and stopping by pid on exit.
#
# The sourcing script sets `set -euo pipefail` and `cd`s to the repository.

# The pids this script started, stopped (in reverse order) on exit.
BENCH_PIDS=()
BENCH_TMP=""

die() {
  echo "$(basename "$0"): error: $*" >&2
  exit 1
}

note() {
  echo "$(basename "$0"): $*" >&2
}

# no_arguments "$@": a script that takes none prints its header comment for
# -h / --help and refuses anything else.
no_arguments() {
  case "${1:-}" in
    "") ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *) die "unknown argument \"$1\" (usage: $0)" ;;
  esac
}

# redis_flag "$@": the usage of a script that takes only --redis; sets
# REDIS_FLAG to true or false.
redis_flag() {
  REDIS_FLAG=false
  local arg
  for arg in "$@"; do
    case "$arg" in
      --redis) REDIS_FLAG=true ;;
      -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
      *) die "unknown argument \"$arg\" (usage: $0 [--redis])" ;;
    esac
  done
}

# need BINARY [HINT]: fails with a clear message when BINARY is not on PATH.
need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is required but not installed${2:+ ($2)}"
}

bench_cleanup() {
  local status=$?
  local i pid
  for ((i = ${#BENCH_PIDS[@]} - 1; i >= 0; i--)); do
    pid=${BENCH_PIDS[i]}
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      # Give it 5 s to stop, then make sure.
      for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  if [ -n "$BENCH_TMP" ]; then
    rm -rf "$BENCH_TMP"
  fi
  exit "$status"
}

# Creates the temporary directory and installs the exit trap.
bench_init() {
  BENCH_TMP=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-bench.XXXXXX")
  trap bench_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

# Builds the release binary; sets TOLLGATE to its path.
build_release() {
  need cargo "https://rustup.rs"
  note "building the release binary (cargo build --release -p tollgate-cli)"
  cargo build --release --locked --quiet -p tollgate-cli
  TOLLGATE="${CARGO_TARGET_DIR:-target}/release/tollgate"
  [ -x "$TOLLGATE" ] || die "the build left no executable at $TOLLGATE"
}

# Builds the Redis module (crates/tollgate-redis-module); MODULE_SO is the
# absolute path of the .so it leaves.
build_module() {
  note "building the Redis module (cargo build --release -p tollgate-redis-module)"
  cargo build --release --locked --quiet -p tollgate-redis-module
  local target="${CARGO_TARGET_DIR:-target}"
  [[ "$target" = /* ]] || target="$PWD/$target"
  MODULE_SO="$target/release/libtollgate_redis_module.so"
  [ -f "$MODULE_SO" ] || die "the build left no module at $MODULE_SO"
}

# A TCP port on 127.0.0.1 that nothing listens on right now.
free_port() {
  local port
  for _ in $(seq 100); do
    port=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  die "no free TCP port found on 127.0.0.1"
}

# Starts redis-server (REDIS_SERVER: another server binary, a Valkey's) on
# a free port, without persistence, in the temporary directory; sets
# REDIS_PORT and REDIS_URL. Retries on another port when the chosen one was
# taken in the meantime.
start_redis() {
  local server=${REDIS_SERVER:-redis-server}
  need "$server" "Debian: apt-get install -y redis-server"
  need redis-cli "Debian: apt-get install -y redis-tools"
  local attempt pid log dir
  for attempt in 1 2 3 4 5; do
    REDIS_PORT=$(free_port)
    dir="$BENCH_TMP/redis-$attempt"
    log="$dir/redis.log"
    mkdir -p "$dir"
    # REDIS_EXTRA_ARGS (an array, optional): more arguments, e.g. --loadmodule.
    "$server" --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
      --dir "$dir" --logfile "$log" --daemonize no --protected-mode yes ${REDIS_EXTRA_ARGS[@]+"${REDIS_EXTRA_ARGS[@]}"} >/dev/null 2>&1 &
    pid=$!
    BENCH_PIDS+=("$pid")
    for _ in $(seq 100); do
      if ! kill -0 "$pid" 2>/dev/null; then
        break
      fi
      if grep -q "Ready to accept connections" "$log" 2>/dev/null; then
        # shellcheck disable=SC2034 # Used by the sourcing script.
        REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
        REDIS_PID=$pid
        note "$(basename "$server") $("$server" --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') (pid $pid) on port $REDIS_PORT"
        return
      fi
      sleep 0.05
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  die "redis-server did not start; its last log: $(tail -n 5 "$log" 2>/dev/null)"
}

# start_serve CONFIG [PREFIX...]: `tollgate serve` on CONFIG, on port 0 (it
# logs the addresses it got: no port races), deciding in Redis when
# start_redis ran; PREFIX (e.g. taskset -c 0) runs before it. Returns once it
# is ready; sets SERVE_PID, SERVE_HTTP, SERVE_GRPC and SERVE_STORE.
start_serve() {
  local config=$1 ready="" args
  shift
  args=(serve --config "$config" --http 127.0.0.1:0 --grpc 127.0.0.1:0)
  SERVE_STORE=memory
  if [ -n "${REDIS_URL:-}" ]; then
    args+=(--redis "$REDIS_URL")
    SERVE_STORE="redis ($REDIS_URL)"
  fi
  RUST_LOG=info "$@" "$TOLLGATE" "${args[@]}" 2>"$BENCH_TMP/serve.log" &
  SERVE_PID=$!
  BENCH_PIDS+=("$SERVE_PID")
  for _ in $(seq 600); do
    kill -0 "$SERVE_PID" 2>/dev/null || die "tollgate serve exited: $(cat "$BENCH_TMP/serve.log")"
    ready=$(grep -m 1 "tollgate serve is ready" "$BENCH_TMP/serve.log" || true)
    [ -n "$ready" ] && break
    sleep 0.05
  done
  [ -n "$ready" ] || die "tollgate serve did not get ready within 30 s: $(cat "$BENCH_TMP/serve.log")"
  SERVE_HTTP=$(sed -n 's/.* http=\([^ ]*\).*/\1/p' <<<"$ready")
  SERVE_GRPC=$(sed -n 's/.* grpc=\([^ ]*\).*/\1/p' <<<"$ready")
  if [ -z "$SERVE_HTTP" ] || [ -z "$SERVE_GRPC" ]; then
    die "no addresses in the server's ready line: $ready"
  fi
}

rcli() {
  redis-cli -p "$REDIS_PORT" "$@"
}

# json_field NAME FILE: the value of a top-level number, boolean or string
# field of a one-line JSON summary of `tollgate bench --json`.
json_field() {
  local value
  value=$(sed -n "s/.*\"$1\":\(\"[^\"]*\"\|[^,}]*\).*/\1/p" "$2")
  [ -n "$value" ] || die "no field \"$1\" in $2: $(cat "$2")"
  value=${value#\"}
  echo "${value%\"}"
}

# commandstats FILE: `INFO commandstats` as "command calls usec" lines.
commandstats() {
  rcli INFO commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_\([^:]*\):calls=\([0-9]*\),usec=\([0-9]*\),.*/\1 \2 \3/p' >"$1"
}

# redis_cpu: the CPU seconds (user + system) the redis-server has used so far.
redis_cpu() {
  rcli INFO cpu | tr -d '\r' | awk -F: '/^used_cpu_(sys|user):/ { t += $2 } END { printf "%.6f", t }'
}

# pid_cpu PID: the CPU seconds (user + system) process PID has used so far.
pid_cpu() {
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f", ($14 + $15) / hz }' "/proc/$1/stat"
}

# children_cpu VAR: sets VAR to the CPU seconds this shell's finished
# children have used. (Not through $(...): `times` must run in this shell.)
children_cpu() {
  times >"$BENCH_TMP/times"
  printf -v "$1" '%s' "$(awk 'NR == 2 {
    t = 0
    for (i = 1; i <= 2; i++) { split($i, p, "m"); t += p[1] * 60 + p[2] }
    printf "%.3f", t
  }' "$BENCH_TMP/times")"
}

now_s() {
  date +%s.%N
}

# percent CPU_BEFORE CPU_AFTER WALL_BEFORE WALL_AFTER: CPU use over the wall
# time, in % of one core.
percent() {
  awk -v a="$1" -v b="$2" -v s="$3" -v e="$4" 'BEGIN { if (e > s) printf "%.0f %%", 100 * (b - a) / (e - s); else print "-" }'
}

# The machine, so figures can be compared: CPU, cores, load, commit.
machine() {
  local cpu load commit
  cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
  load=$(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null || echo "?")
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo "?")
  if ! git diff --quiet HEAD 2>/dev/null; then
    commit="$commit+changes"
  fi
  echo "machine: ${cpu:-unknown CPU}, $(nproc) cores, load average $load; commit $commit"
}

# median: the median of the numbers on standard input, one a line.
median() {
  sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# grpc_load NAME PID GRPC: one `tollgate bench --target grpc://GRPC` run
# (descriptor client=c of domain bench, KEYS values, CONNECTIONS
# connections, DURATION; at RATE requests/s when set, else as fast as
# answers come), its summary in NAME.json; prints the decisions/s and the
# CPU (µs) of process PID per decision.
grpc_load() {
  local name=$1 pid=$2 grpc=$3 before after rate seconds paced=()
  [ -n "${RATE:-}" ] && paced=(--rate "$RATE")
  before=$(pid_cpu "$pid")
  "$TOLLGATE" bench --target "grpc://$grpc" --domain bench --descriptor client=c --keys "$KEYS" \
    --connections "$CONNECTIONS" --duration "$DURATION" ${paced[@]+"${paced[@]}"} --json --quiet >"$BENCH_TMP/$name.json" 2>"$BENCH_TMP/$name.err" ||
    die "tollgate bench ($name) failed: $(cat "$BENCH_TMP/$name.err")"
  after=$(pid_cpu "$pid")
  rate=$(json_field decisions_per_s "$BENCH_TMP/$name.json")
  seconds=$(json_field elapsed_s "$BENCH_TMP/$name.json")
  awk -v r="$rate" -v s="$seconds" -v a="$before" -v b="$after" 'BEGIN { printf "%d %.2f\n", r, (b - a) * 1e6 / (r * s) }'
}

# on_off_rounds OFF_PID OFF_GRPC ON_PID ON_GRPC: ROUNDS rounds of grpc_load
# on two servers, each first in every other round; prints a Markdown row
# per round (each server's decisions/s and CPU per decision, the Redis
# CPU per decision when start_redis ran, and on / off), then the medians of
# the per-round ratios.
on_off_rounds() {
  local off_pid=$1 off_grpc=$2 on_pid=$3 on_grpc=$4 round side rate cpu before after
  local -A rates cpus redis
  echo "| round | off: decisions/s | off: CPU µs/decision | off: Redis µs | on: decisions/s | on: CPU µs/decision | on: Redis µs | on/off rate | on/off CPU | on/off Redis |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  : >"$BENCH_TMP/rows"
  for round in $(seq "$ROUNDS"); do
    note "round $round of $ROUNDS"
    local order=(off on)
    ((round % 2)) || order=(on off)
    for side in "${order[@]}"; do
      local pid_var=${side}_pid grpc_var=${side}_grpc
      before=$( [ -n "${REDIS_PID:-}" ] && pid_cpu "$REDIS_PID" || echo 0)
      read -r rate cpu < <(grpc_load "$side-$round" "${!pid_var}" "${!grpc_var}")
      after=$( [ -n "${REDIS_PID:-}" ] && pid_cpu "$REDIS_PID" || echo 0)
      rates[$side]=$rate cpus[$side]=$cpu
      redis[$side]=$(awk -v a="$before" -v b="$after" -v r="$rate" -v s="$(json_field elapsed_s "$BENCH_TMP/$side-$round.json")" 'BEGIN { printf "%.2f", (b - a) * 1e6 / (r * s) }')
    done
    awk -v r="$round" -v a="${rates[off]}" -v b="${cpus[off]}" -v x="${redis[off]}" -v c="${rates[on]}" -v d="${cpus[on]}" -v y="${redis[on]}" \
      'BEGIN { printf "| %d | %d | %.2f | %.2f | %d | %.2f | %.2f | %.3f | %.3f | %.3f |\n", r, a, b, x, c, d, y, c / a, d / b, (x > 0 ? y / x : 0) }' | tee -a "$BENCH_TMP/rows"
  done
  echo
  echo "median of the per-round ratios (on / off): decisions/s $(awk -F'|' '{ print $9 }' "$BENCH_TMP/rows" | median)," \
    "CPU per decision $(awk -F'|' '{ print $10 }' "$BENCH_TMP/rows" | median)," \
    "Redis CPU per decision $(awk -F'|' '{ print $11 }' "$BENCH_TMP/rows" | median)"
}

