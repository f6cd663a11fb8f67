#!/usr/bin/env bash
# up_repair_test.sh — proves the local-instance commands keep one instance whatever the working
# directory and whatever has died: `strata up --dir REL` (a relative directory) records absolute
# data directories, `strata status` run from elsewhere with the absolute path sees it healthy, and
# `strata down --dir REL --purge` deletes every node's data (none "kept ... outside"). On a partly
# running instance (a node killed with SIGKILL, the router stopped), `strata up` starts exactly
# the missing processes, router included, and leaves the others' pids alone; `strata restart
# east-0` replaces that one process. Every binary answers --version. What `strata up` creates
# in the instance directory is owner-only (files 0600, directories 0700), and an instance made
# with wider modes is narrowed by the next `strata up`.
# Usage: up_repair_test.sh PATH/TO/strata PATH/TO/strata-node PATH/TO/strata-router
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1 NODE_BIN=$2 ROUTER_BIN=$3

TMPD=$(mktemp -d "${STRATA_TEST_TMP:-/tmp}/up_repair.XXXXXX")
TMPD=$(cd "$TMPD" && pwd -P)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
trap 'cd "$TMPD" && "$STRATA" down --dir rel/inst >/dev/null 2>&1; rm -rf "$TMPD"; cleanup' EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$TMPD"/rel/inst/logs/*.log; do
    [ -e "$f" ] || continue
    echo "--- $f (last 20 lines)" >&2
    tail -n 20 "$f" >&2
  done
  exit 1
}

echo "== --version"
for b in "$STRATA" "$NODE_BIN" "$ROUTER_BIN"; do
  V=$("$b" --version) || fail "$b --version failed"
  echo "$V"
  echo "$V" | grep -Eq '^strata(-node|-router)? [0-9]+\.[0-9]+\.[0-9]+' || fail "$b --version: '$V'"
done

echo "== strata up --dir rel/inst (relative)"
cd "$TMPD" || fail "cd"
"$STRATA" up --dir rel/inst --port "$PORT" --clusters 1 --nodes 2 >/dev/null || fail "strata up failed"
ABS=$TMPD/rel/inst
grep -q "^node = 127.0.0.1:[0-9]* $ABS/east-0\$" "$ABS/topology" ||
  fail "the topology does not record absolute data directories: $(grep '^node' "$ABS/topology")"
(cd / && "$STRATA" status --dir "$ABS" >/dev/null) || fail "status by absolute path from / is not healthy"

echo "== owner-only modes"
# modes_check DIRS... -- FILES...: each dir is 700 and each file 600
modes_check() {
  local want=700 f
  for f in "$@"; do
    [ "$f" = -- ] && { want=600; continue; }
    [ "$(stat -c %a "$f")" = "$want" ] || fail "$f is mode $(stat -c %a "$f"), not $want"
  done
}
modes_check "$ABS" "$ABS/logs" "$ABS/run" -- "$ABS/topology" "$ABS"/logs/*.log "$ABS"/run/*.pid
# As an older strata left them: the next up narrows what it opens again.
chmod 755 "$ABS" "$ABS/logs" "$ABS/run"
chmod 644 "$ABS/topology" "$ABS/logs/east-1.log" "$ABS/logs/router.log"

echo "== partly running: east-1 killed, router stopped; strata up starts just those"
E0=$(cat "$ABS/run/east-0.pid")
kill -9 "$(cat "$ABS/run/east-1.pid")"
kill "$(cat "$ABS/run/router.pid")"
for i in $(seq 1 100); do
  "$STRATA" status --dir rel/inst >/dev/null 2>&1 || break
  sleep 0.1
done
if "$STRATA" status --dir rel/inst >/dev/null 2>&1; then fail "status healthy with a node killed"; fi
OUT=$("$STRATA" up --dir rel/inst --port "$PORT" 2>&1) || { echo "$OUT"; fail "strata up did not repair"; }
echo "$OUT"
echo "$OUT" | grep -q "starting its 2 stopped process" || fail "up did not say it starts 2 processes"
echo "$OUT" | grep -Eq "^  east-1 .* ready" || fail "east-1 not started"
echo "$OUT" | grep -Eq "^  router .* ready" || fail "router not started"
echo "$OUT" | grep -Eq "^  east-0 " && fail "east-0 was started again though it ran"
[ "$(cat "$ABS/run/east-0.pid")" = "$E0" ] || fail "east-0's pid changed"
"$STRATA" status --dir rel/inst >/dev/null || fail "not healthy after the repair"
modes_check "$ABS" "$ABS/logs" "$ABS/run" -- "$ABS/topology" "$ABS/logs/east-1.log" "$ABS/logs/router.log"
AGAIN=$("$STRATA" up --dir rel/inst --port "$PORT") || fail "third up failed"
echo "$AGAIN" | grep -q "Already running" || fail "a whole instance is not 'Already running'"

echo "== strata restart east-0"
"$STRATA" restart east-0 --dir rel/inst || fail "strata restart east-0"
E0_NEW=$(cat "$ABS/run/east-0.pid")
[ "$E0_NEW" != "$E0" ] || fail "east-0 kept its pid"
kill -0 "$E0" 2>/dev/null && ! grep -q ' Z ' "/proc/$E0/stat" 2>/dev/null && fail "old east-0 still runs"
"$STRATA" status --dir rel/inst >/dev/null || fail "not healthy after restart"
"$STRATA" restart nosuch --dir rel/inst >/dev/null 2>&1
[ $? = 2 ] || fail "restart of an unknown name did not exit 2"

echo "== strata down --dir rel/inst --purge"
OUT=$("$STRATA" down --dir rel/inst --purge) || fail "down --purge failed"
echo "$OUT"
echo "$OUT" | grep -q "kept" && fail "down --purge kept data"
[ ! -e "$ABS/east-0" ] && [ ! -e "$ABS/east-1" ] && [ ! -e "$ABS/topology" ] || fail "purge left files"
echo "PASS"
