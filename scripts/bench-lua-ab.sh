#!/usr/bin/env bash
# The Redis library of two commits side by side, inside Redis: both are
# loaded into one function (each assembled from its commit's Lua files in
# the registry's order) whose one FCALL runs them in turn, BLOCK decisions
# at a time, ROUNDS times each, and prints the least and the median µs per
# decision of each. Nothing but the Lua runs between two decisions, and the
# two alternate within one call, so the machine's drift touches both alike:
# on a noisy host this tells a change of 5 % where end-to-end runs cannot.
# Each decision is one CHECK of cost 1 (server time) of LIMIT, the text the
# library reads for a limit ("<algorithm id>:<parameters>:<cost>", e.g.
# "7:1000000000:1:1000:1" for GCRA 10⁹ a second, whose TAT carries a
# fraction of a µs), on 1000 keys in turn.
#
# Usage: scripts/bench-lua-ab.sh REV_A REV_B LIMIT   (REV: a commit, or
# "worktree" for the files as they are)
# Environment: BLOCK (default 5000) decisions per turn, ROUNDS (default 30).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=lib/bench.sh
source scripts/lib/bench.sh

case "${1:-}" in
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
esac
[ $# = 3 ] || die "usage: $0 REV_A REV_B LIMIT"
BLOCK=${BLOCK:-5000}
ROUNDS=${ROUNDS:-30}
[[ "$BLOCK" =~ ^[1-9][0-9]*$ && "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || die "BLOCK and ROUNDS must be positive integers"
[[ "$3" =~ ^[0-9]+(:[0-9]+)+$ ]] || die "LIMIT must read like 7:1000000000:1:1000:1 (got \"$3\")"

# source REV PATH: a file of the library at REV.
source_at() {
  if [ "$1" = worktree ]; then
    cat "crates/tollgate/src/$2"
  else
    git show "$1:crates/tollgate/src/$2" || die "no $2 at $1"
  fi
}

# library REV: the library's source at REV, as store/redis/mod.rs assembles it.
library() {
  local module
  source_at "$1" store/redis/prelude.lua
  for module in $(source_at "$1" algorithm/mod.rs | sed -n '/^registry! {/,/^}/s/.*=> \([a-z_]*\)::.*/\1/p'); do
    source_at "$1" "algorithm/$module.lua"
  done
  source_at "$1" store/redis/tollgate.lua
}

bench_init
start_redis
{
  echo "#!lua name=lua_ab"
  echo "local function build_a()"
  library "$1"
  echo "return run end"
  echo "local function build_b()"
  library "$2"
  echo "return run end"
  cat <<'LUA'
local run_a, run_b = build_a(), build_b()

local function now_us()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function compare(_, args)
  local block, rounds, limit = tonumber(args[1]), tonumber(args[2]), args[3]
  local keys = {}
  for i = 1, 1000 do
    keys[i] = { "ab:{" .. i .. "}" }
  end
  local call_args = { "1", "1:1:1:-1:", limit }
  local times = { {}, {} }
  local i = 0
  for _ = 1, rounds do
    for which, run in ipairs({ run_a, run_b }) do
      local started = now_us()
      for _ = 1, block do
        i = i + 1
        run(keys[i % 1000 + 1], call_args)
      end
      local list = times[which]
      list[#list + 1] = (now_us() - started) / block
    end
  end
  local lines = {}
  for which, label in ipairs({ "A", "B" }) do
    local list = times[which]
    table.sort(list)
    lines[which] = string.format("%s: least %.3f µs, median %.3f µs per decision", label, list[1], list[math.floor(#list / 2) + 1])
  end
  return lines
end

redis.register_function("lua_ab", compare)
LUA
} >"$BENCH_TMP/lua_ab.lua"
rcli -x FUNCTION LOAD <"$BENCH_TMP/lua_ab.lua" >/dev/null || die "the two libraries did not load"
echo "A = $1, B = $2, LIMIT $3, $ROUNDS rounds of $BLOCK decisions ($(machine))"
rcli FCALL lua_ab 0 "$BLOCK" "$ROUNDS" "$3"
