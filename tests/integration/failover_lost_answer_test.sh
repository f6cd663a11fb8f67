#!/usr/bin/env bash
# failover_lost_answer_test.sh — `strata failover` when the router's answer to the update is lost
# after the router stored it (the router killed right then), two clusters of one node. The CLI
# talks to the router through lost_answer_proxy.py, named as the router in a copy of the
# topology: the UpdateAppProfile reaches the router, which stores it, and the connection then
# closes without an answer.
# 1. The proxy relays the next connections (the router came back): the command reads the
#    profile again, sees it on west, says the update was stored and exits 0. It used to print
#    "UpdateAppProfile refused: UNAVAILABLE ... connection closed by the server" and exit 1
#    although the profile had moved; no rpc log line reaches the operator's stderr either.
# 2. The proxy refuses every later connection (the router stays gone): the command says the
#    outcome is unknown and how to learn it (exit 1), not "refused"; the profile did move.
# Skips (77) without cbt or python3.
# Usage: failover_lost_answer_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
HERE=$(cd "$(dirname "$0")" && pwd)
[ -n "$CBT" ] || { echo "SKIP: cbt missing"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 missing"; exit 77; }
instance_init failover_lost_answer
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
cbtq() { cbtr "127.0.0.1:$PORT" "$@"; }
cbtq createappprofile i app d route-to=east >/dev/null || fail "profile app"
cbtq createappprofile i app2 d route-to=east >/dev/null || fail "profile app2"
routes_to() { cbtq getappprofile i "$1" | grep -q "cluster_id:\"$2\""; }
# proxy_dir NAME [--refuse-after]: starts a proxy; prints an instance directory whose topology
# names it as the router.
proxy_dir() {
  local d=$TMPD/$1 addr
  shift
  mkdir -p "$d"
  python3 "$HERE/lost_answer_proxy.py" "127.0.0.1:$PORT" "$@" >"$d/proxy.log" 2>&1 &
  PIDS+=("$!")
  addr=$(wait_line "$d/proxy.log" '127\.0\.0\.1:[0-9]+') || fail "the proxy did not start"
  sed "s/^listen = .*/listen = $addr/" "$DIR/topology" >"$d/topology"
}

echo "== the answer lost, the router back"
proxy_dir back
"$STRATA" failover app west --dir "$TMPD/back" >"$TMPD/fo1.out" 2>"$TMPD/fo1.err" ||
  { cat "$TMPD/fo1.out" "$TMPD/fo1.err"; fail "strata failover failed although it moved the profile"; }
routes_to app west || fail "the profile does not route to west"
grep -q "stored the update before its answer was lost" "$TMPD/fo1.out" ||
  { cat "$TMPD/fo1.out" "$TMPD/fo1.err"; fail "the command does not say the update was stored"; }
grep -q "^after: .*routing to west" "$TMPD/fo1.out" || { cat "$TMPD/fo1.out"; fail "no after: line"; }
grep -q "refused" "$TMPD/fo1.err" && { cat "$TMPD/fo1.err"; fail "the command says refused"; }
grep -q "level=" "$TMPD/fo1.err" && { cat "$TMPD/fo1.err"; fail "log lines on stderr"; }

echo "== the answer lost, the router gone"
proxy_dir gone --refuse-after
"$STRATA" failover app2 west --dir "$TMPD/gone" >"$TMPD/fo2.out" 2>"$TMPD/fo2.err" &&
  { cat "$TMPD/fo2.out" "$TMPD/fo2.err"; fail "strata failover exited 0 without knowing"; }
grep -q "outcome unknown" "$TMPD/fo2.err" ||
  { cat "$TMPD/fo2.out" "$TMPD/fo2.err"; fail "the command does not say the outcome is unknown"; }
grep -q "refused" "$TMPD/fo2.err" && { cat "$TMPD/fo2.err"; fail "the command says refused"; }
routes_to app2 west || fail "the router did not store the update the proxy let through"
echo "PASS"
