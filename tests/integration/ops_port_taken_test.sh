#!/usr/bin/env bash
# ops_port_taken_test.sh — a node killed with kill -9 whose port another program took meanwhile:
# `strata restart`, `strata chaos restart-cluster` and `strata up` must say the node did not
# start (exit 1, naming the bind failure) instead of "ready" — they used to take the other
# program's answer to their connect for the node listening, while the node had already exited
# with "Address already in use". Once the port is free, `strata restart` starts it and the data
# written before is served. A node stopped with SIGSTOP is restarted cleanly (SIGTERM and
# SIGCONT), not killed after the grace period. One cluster of one node. Skips (77) without python3 or cbt.
# Usage: ops_port_taken_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
[ -n "$CBT" ] || { echo "cbt missing: skipped"; exit 77; }
up_single ops_port_taken
cbtr "127.0.0.1:$PORT" createtable t families=cf >/dev/null || fail "createtable"
cbtr "127.0.0.1:$PORT" set t r1 cf:q=before >/dev/null || fail "set r1"
NODE=$(sed -n 's/^node = \(127\.0\.0\.1:[0-9]*\) .*/\1/p' "$DIR/topology" | head -n1)
NPORT=${NODE##*:}
"$STRATA" chaos kill-cluster east --dir "$DIR" >/dev/null || fail "chaos kill-cluster"

# Another program takes the node's port (listening, accepting nothing) for as long as it lives.
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8)
print("held", flush=True); time.sleep(600)' "$NPORT" >"$TMPD/holder.out" 2>&1 &
HOLDER=$!
PIDS+=("$HOLDER")
wait_line "$TMPD/holder.out" held >/dev/null || fail "could not hold port $NPORT"

expect_refused() { # NAME OUTFILE STATUS
  [ "$3" -ne 0 ] || { cat "$2"; fail "$1 said the node started while port $NPORT was taken"; }
  grep -q "Address already in use" "$2" || { cat "$2"; fail "$1 did not show why the node stopped"; }
  ! grep -q "ready (pid" "$2" || { cat "$2"; fail "$1 printed ready for the node"; }
}
echo "== strata restart east-0 with its port taken"
"$STRATA" restart east-0 --dir "$DIR" --wait-s 10 >"$TMPD/restart.out" 2>&1
expect_refused "strata restart" "$TMPD/restart.out" $?
echo "== strata chaos restart-cluster east with its port taken"
"$STRATA" chaos restart-cluster east --dir "$DIR" --wait-s 10 >"$TMPD/chaos.out" 2>&1
expect_refused "strata chaos restart-cluster" "$TMPD/chaos.out" $?
echo "== strata up with the node's port taken"
"$STRATA" up --dir "$DIR" --wait-s 10 >"$TMPD/up.out" 2>&1
expect_refused "strata up" "$TMPD/up.out" $?
"$STRATA" status --dir "$DIR" >"$TMPD/status.out" 2>&1 &&
  { cat "$TMPD/status.out"; fail "strata status says healthy with the node not running"; }

echo "== the port freed, strata restart starts the node and r1 is served"
kill "$HOLDER"
wait "$HOLDER" 2>/dev/null
"$STRATA" restart east-0 --dir "$DIR" >"$TMPD/restart2.out" 2>&1 ||
  { cat "$TMPD/restart2.out"; fail "strata restart after the port was freed"; }
"$STRATA" up --dir "$DIR" >/dev/null 2>&1 || fail "strata up (router) after the restart"
out=$(cbtr "127.0.0.1:$PORT" -timeout 20s lookup t r1) || fail "lookup r1: $out"
grep -q '"before"' <<<"$out" || fail "r1 lost: $out"

# A node stopped with SIGSTOP is woken (SIGCONT after the SIGTERM) and shuts down cleanly; it
# used to sit out the 30 s grace period and be killed with SIGKILL.
echo "== strata restart of a node stopped with SIGSTOP"
NLOG="$DIR/logs/east-0.log"
OLD=$(cat "$DIR/run/east-0.pid")
before=$(grep -c "shutting down" "$NLOG")
kill -STOP "$OLD"
"$STRATA" restart east-0 --dir "$DIR" >"$TMPD/restart3.out" 2>&1 ||
  { kill -CONT "$OLD" 2>/dev/null; cat "$TMPD/restart3.out"; fail "strata restart of a stopped node"; }
after=$(grep -c "shutting down" "$NLOG")
[ "$after" -gt "$before" ] || { cat "$TMPD/restart3.out"; fail "the stopped node did not shut down cleanly (killed?)"; }
out=$(cbtr "127.0.0.1:$PORT" -timeout 20s lookup t r1) || fail "lookup r1 after the restart: $out"
grep -q '"before"' <<<"$out" || fail "r1 lost after the restart: $out"
echo "PASS"
