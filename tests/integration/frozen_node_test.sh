#!/usr/bin/env bash
# frozen_node_test.sh — one node of a two-node cluster frozen (SIGSTOP: the process keeps its
# sockets and the kernel still accepts connections, but nothing answers), the other healthy; the
# cluster is not dark, so requests to the frozen node's rows are sent and must fail by themselves.
#  - A MutateRows with an entry in every tablet (both nodes) streams the statuses of the healthy
#    node's entries in a message of their own, before the message carrying the frozen node's
#    failed entries: checked by message order, not time (the router used to answer once, after
#    the frozen part failed about 45 s later, so a client deadline lost every status). Every
#    entry gets exactly one status.
#  - A MutateRow (explicit timestamp: retried by the router) to a row of the frozen node fails
#    UNAVAILABLE naming the node as silent: once a keepalive PING to the node went unanswered,
#    the router refuses its calls instead of dialling it again and waiting for another keepalive
#    each time (it used to retry for about 50 s).
#  - After SIGCONT the same MutateRow succeeds (polled, hang guard only).
# About 20 seconds. Usage: frozen_node_test.sh PATH/TO/strata PATH/TO/frozen_client
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
STRATA=$1
CLIENT=$2
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
instance_init frozen_node
FROZEN=
finish() {
  [ -n "$FROZEN" ] && kill -CONT "$FROZEN" 2>/dev/null
  instance_teardown
}
trap finish EXIT
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 >/dev/null || fail "strata up failed"
cbtq() { BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>/dev/null; }
cbtq createtable t families=cf splits=b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q,r,s,t,u,v,w,x,y >/dev/null ||
  fail "createtable failed"
call() { "$CLIENT" "127.0.0.1:$PORT" t default "$@"; }
out=$(call iwrites)
[ "$(echo "$out" | tail -n1)" = "OK " ] || fail "MutateRows before the freeze: $out"

FROZEN=$(cat "$DIR/run/east-1.pid")
kill -STOP "$FROZEN"
out=$(call iwrites)
echo "$out"
[ "$(echo "$out" | tail -n1)" = "OK " ] || fail "MutateRows with east-1 frozen: expected OK with per-entry failures, got: $out"
msgs=$(echo "$out" | grep '^MSG ')
first=$(echo "$msgs" | head -n1)
case "$first" in
"MSG ok="[1-9]*" failed=0") ;;
*) fail "the first MutateRows message should hold only the healthy node's OK statuses: $msgs" ;;
esac
echo "$msgs" | tail -n +2 | grep -Eq '^MSG ok=[0-9]+ failed=[1-9]' ||
  fail "no later message carries the frozen node's failed entries: $msgs"
rows=$(echo "$out" | sed -n 's/^FAILED_ROWS //p')
[ -n "$rows" ] || fail "no entry failed although east-1 is frozen: $out"
row=${rows%%,*}

out=$(call iwrite "$row")
echo "MutateRow of $row (east-1): $out"
case "$out" in
"UNAVAILABLE node "*" of cluster east went silent "*"has not answered since"*) ;;
*) fail "MutateRow to the frozen node: expected UNAVAILABLE naming the silent node, got: $out" ;;
esac

kill -CONT "$FROZEN"
FROZEN=
ok=
for _ in $(seq 1 100); do # hang guard: the node answers its idle connection
  out=$(call iwrite "$row")
  if [ "$out" = "OK " ]; then ok=1; break; fi
  sleep 0.2
done
[ -n "$ok" ] || fail "MutateRow of $row still fails after SIGCONT: $out"
grep -q "answers again after" "$DIR/logs/router.log" || fail "the router never logged east-1 answering again"
echo PASS
