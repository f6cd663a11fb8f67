#!/usr/bin/env bash
# router_chaos_test.sh — proves a multi-cluster app profile hides node crashes from clients under
# a mixed load: `strata up` starts 2 clusters (east, west) x 2 nodes and a router; `strata bench`
# drives writes, point reads, bounded scans and rows_limit scans through a route-any profile
# (2 connections x 8 calls in flight) while this script kills -9 the node of east holding the
# table (calls in flight drop with it), restarts it with its own command line, then does the
# same to the other node of east. The bench verifies every
# answer and counts every failed call; the test asserts that none failed (bench exit 0,
# errors=0) and that the router saw the outages (its health log). About a minute and a half.
# Usage: router_chaos_test.sh PATH/TO/strata [BIN_DIR]
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
BIN_ARGS=()
if [ $# -ge 2 ] && [ -n "$2" ]; then BIN_ARGS=(--bin-dir "$2"); fi
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi

TMPD=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/router_chaos.XXXXXX")
DIR=$TMPD/inst
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
BENCH_PID=
RESTARTED=()
finish() {
  [ -n "$BENCH_PID" ] && kill "$BENCH_PID" 2>/dev/null
  "$STRATA" down --dir "$DIR" >/dev/null 2>&1
  for p in "${RESTARTED[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$TMPD"
  cleanup
}
trap finish EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$DIR"/logs/*.log "$TMPD"/bench.out; do
    [ -e "$f" ] || continue
    echo "--- $f (last 25 lines)" >&2
    tail -n 25 "$f" >&2
  done
  exit 1
}

# wait_for WHAT COMMAND...: polls (hang guard: 600 x 0.2 s), never a timing assertion.
wait_for() {
  local what=$1 i
  shift
  for i in $(seq 1 600); do
    if "$@"; then return 0; fi
    sleep 0.2
  done
  fail "gave up waiting for $what"
}
router_log_count() { grep -c -- "$1" "$DIR/logs/router.log" 2>/dev/null || true; }
log_grew() { [ "$(router_log_count "$1")" -gt "$2" ]; }
bench_in() { grep -q -- "$1" "$TMPD/bench.out" 2>/dev/null; }
export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT

# chaos NODE CLUSTER: kill -9 NODE, wait for the router to see CLUSTER down, restart NODE with
# its own command line, wait for CLUSTER up again.
chaos() {
  local node=$1 cluster=$2 pid cmd name downs ups
  downs=$(router_log_count "cluster=$cluster health=down")
  ups=$(router_log_count "cluster=$cluster health=up")
  pid=$(cat "$DIR/run/$node.pid")
  cmd=$(tr '\0' '\037' <"/proc/$pid/cmdline")
  echo "== kill -9 $node (pid $pid)"
  kill -9 "$pid" || fail "could not kill $node"
  wait_for "the router to take $cluster out" log_grew "cluster=$cluster health=down" "$downs"
  sleep 3 # load runs on the other cluster meanwhile
  IFS=$'\037' read -r -a argv <<<"${cmd%$'\037'}"
  name=$(basename "${argv[2]}") # --data DIR/<name>
  "${argv[@]}" >>"$DIR/logs/$name.log" 2>&1 &
  RESTARTED+=("$!")
  echo "$!" >"$DIR/run/$name.pid" # so `strata down` stops it
  echo "== restarted $node (pid $!)"
  wait_for "the router to take $cluster back" log_grew "cluster=$cluster health=up" "$ups"
}

echo "== strata up --dir $DIR --port $PORT --clusters 2 --nodes 2"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 2 "${BIN_ARGS[@]}" ||
  fail "strata up failed"
timeout 60 "$CBT" -project p -instance i createappprofile i any "multi-cluster" route-any \
  >/dev/null 2>&1 || fail "cbt createappprofile any"

echo "== strata bench through 'any': write, read, scan, scan-limit"
"$STRATA" bench --dir "$DIR" --app-profile any --workload write,read,scan,scan-limit \
  --conns 2 --streams 8 --keys 20000 --duration 12 --no-lag --quiet >"$TMPD/bench.out" 2>&1 &
BENCH_PID=$!
wait_for "the bench's first workload" bench_in "^load "
chaos east-0 east # holds the bench table's tablet: calls in flight drop with it
chaos east-1 east
echo "== waiting for the bench to end"
wait "$BENCH_PID"
RC=$?
BENCH_PID=
grep -E "^(workload|write|read|scan|scan-limit|load) " "$TMPD/bench.out"
RESULT=$(grep "^strata-bench result=" "$TMPD/bench.out" | cut -c1-60)
echo "$RESULT"
[ "$RC" = 0 ] || fail "the bench saw failed calls (exit $RC): $RESULT"
echo "$RESULT" | grep -q "result=ok errors=0 " || fail "the bench reported errors: $RESULT"
echo "ok: no call of the multi-cluster profile failed through two node crashes"
echo "PASS"
