#!/usr/bin/env bash
# up_starting_test.sh — `strata up` run again after a `strata up` that was killed (kill -9) once it
# had spawned the nodes but before they listened. The nodes it finds running but taking no
# connection yet (still starting, as a node replaying its log is) are waited for within --wait-s
# like the processes it starts, and it exits 0 once they serve, their pids unchanged; it used to
# call them hung at once, advise `strata restart` for each and exit 1. With a --wait-s too short
# it says they are still starting, quoting the last line of their log, leaves them running and
# advises no restart. A node stopped with SIGSTOP is named as stopped by a signal (with `kill
# -CONT`), not as starting. The nodes are held before they listen by a strata-node wrapper
# (--bin-dir) that waits for a file, so "spawned but not listening" is a state, not a race.
# Usage: up_starting_test.sh PATH/TO/strata PATH/TO/strata-node PATH/TO/strata-router
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1 NODE_BIN=$(realpath "$2") ROUTER_BIN=$(realpath "$3")
instance_init up_starting
STOPPED=""
teardown() {
  [ -n "$STOPPED" ] && kill -CONT $STOPPED 2>/dev/null
  touch "$TMPD/release"
  instance_teardown
}
trap teardown EXIT

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 >"$TMPD/up0.out" 2>&1 ||
  { cat "$TMPD/up0.out"; fail "strata up"; }
"$STRATA" down --dir "$DIR" >"$TMPD/down.out" 2>&1 || { cat "$TMPD/down.out"; fail "strata down"; }

# Named strata-node (what `strata up` recognises as its own), it takes no connection until
# released, then becomes the node with the same pid.
BIN=$TMPD/bin
mkdir -p "$BIN"
printf '#!/bin/sh\nwhile [ ! -e "%s" ]; do sleep 0.05; done\nexec "%s" "$@"\n' \
  "$TMPD/release" "$NODE_BIN" >"$BIN/strata-node"
chmod +x "$BIN/strata-node"
ln -s "$ROUTER_BIN" "$BIN/strata-router"

# killed_up: `strata up` killed with SIGKILL once it has spawned both nodes (held before they
# listen); sets P0 and P1, their pids.
killed_up() {
  rm -f "$TMPD/release"
  "$STRATA" up --dir "$DIR" --bin-dir "$BIN" >"$TMPD/up1.out" 2>&1 &
  local up=$!
  for _ in $(seq 1 300); do
    [ -s "$DIR/run/east-0.pid" ] && [ -s "$DIR/run/east-1.pid" ] && break
    sleep 0.1
  done
  kill -9 "$up"
  wait "$up" 2>/dev/null
  P0=$(cat "$DIR/run/east-0.pid") P1=$(cat "$DIR/run/east-1.pid")
  kill -0 "$P0" && kill -0 "$P1" || fail "the spawned nodes did not outlive strata up"
  [ -e "$DIR/run/router.pid" ] && fail "the router was started before the nodes listened"
}

echo "== strata up killed once both nodes are spawned; strata up again waits for them"
killed_up
"$STRATA" up --dir "$DIR" --bin-dir "$BIN" >"$TMPD/up3.out" 2>&1 &
UP3=$!
wait_line "$TMPD/up3.out" "east-0 .*running \(pid $P0\), not answering yet" >/dev/null ||
  fail "up does not say it waits for east-0"
touch "$TMPD/release"
wait "$UP3"
rc=$?
cat "$TMPD/up3.out"
[ "$rc" = 0 ] || fail "up after the nodes finished starting exited $rc"
grep -Eq "^  east-0 .* ready \(pid $P0\)" "$TMPD/up3.out" || fail "east-0 not waited for"
grep -Eq "^  router .* ready" "$TMPD/up3.out" || fail "router not started"
[ "$(cat "$DIR/run/east-0.pid")" = "$P0" ] && [ "$(cat "$DIR/run/east-1.pid")" = "$P1" ] ||
  fail "a node was restarted"
"$STRATA" status --dir "$DIR" >"$TMPD/st.out" 2>&1 || { cat "$TMPD/st.out"; fail "not serving"; }
echo "ok: exit 0, every node serving, none restarted"

echo "== a node stopped with SIGSTOP: named as stopped, at once"
STOPPED=$P1
kill -STOP "$P1"
"$STRATA" up --dir "$DIR" >"$TMPD/up4.out" 2>&1
rc=$?
cat "$TMPD/up4.out"
[ "$rc" = 1 ] || fail "up with east-1 stopped exited $rc"
grep -F "east-1 (pid $P1) runs but does not answer" "$TMPD/up4.out" | grep -F "stopped by a signal" |
  grep -qF "kill -CONT $P1" || fail "up does not say east-1 is stopped by a signal"
grep -q "still starting\|not answering yet" "$TMPD/up4.out" && fail "a stopped node taken for a starting one"
kill -CONT "$P1"
STOPPED=""
"$STRATA" up --dir "$DIR" >"$TMPD/up5.out" 2>&1 || { cat "$TMPD/up5.out"; fail "up after SIGCONT"; }
grep -q "Already running" "$TMPD/up5.out" || { cat "$TMPD/up5.out"; fail "not Already running"; }
echo "ok: stopped node named as stopped"

echo "== --wait-s 2 while they start: named as starting, left running, no restart advised"
"$STRATA" down --dir "$DIR" >"$TMPD/down.out" 2>&1 || { cat "$TMPD/down.out"; fail "strata down"; }
killed_up
"$STRATA" up --dir "$DIR" --bin-dir "$BIN" --wait-s 2 >"$TMPD/up2.out" 2>&1
rc=$?
cat "$TMPD/up2.out"
[ "$rc" = 1 ] || fail "up with the nodes still starting exited $rc"
for n in "east-0 (pid $P0)" "east-1 (pid $P1)"; do
  grep -F "$n runs but has not listened on" "$TMPD/up2.out" | grep -F "still starting" |
    grep -qF "=== " || fail "up does not say $n is still starting, with its log's last line"
done
grep -q "strata restart east-\|hung\|stopped by a signal" "$TMPD/up2.out" &&
  fail "up advises a restart (or says hung) for a node still starting"
[ "$(cat "$DIR/run/east-0.pid")" = "$P0" ] && kill -0 "$P0" || fail "east-0 was restarted"
[ "$(cat "$DIR/run/east-1.pid")" = "$P1" ] && kill -0 "$P1" || fail "east-1 was restarted"
[ -e "$DIR/run/router.pid" ] && fail "the router was started before the nodes listened"
echo "ok: named as still starting, not restarted"
echo PASS
