#!/usr/bin/env bash
# frozen_cluster_test.sh — a cluster whose only node is frozen (SIGSTOP: the process keeps its
# sockets and the kernel still accepts connections, but nothing answers) is marked down by the
# router's health probes. From then on, requests routed to it by a single-cluster profile must not
# be sent there to wait for a keepalive to give up: each answers UNAVAILABLE "cluster west has no
# reachable node ... no node answered a health probe since ... strata failover ..." (the text is
# checked, not the time: before the router refused such requests they waited 2-5 s for their
# connection's keepalive and failed with a keepalive error instead). A multi-cluster profile is
# served by the other cluster meanwhile. After SIGCONT the same calls through west must succeed
# again (polled, hang guard only). ReadRows, MutateRow and MutateRows. About 15 seconds.
# Usage: frozen_cluster_test.sh PATH/TO/strata PATH/TO/frozen_client
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
STRATA=$1
CLIENT=$2
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
instance_init frozen_cluster
WEST=
EAST=
finish() {
  [ -n "$WEST" ] && kill -CONT "$WEST" 2>/dev/null
  [ -n "$EAST" ] && kill -CONT "$EAST" 2>/dev/null
  instance_teardown
}
trap finish EXIT
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >/dev/null || fail "strata up failed"
cbtq() { BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>/dev/null; }
cbtq createtable t families=cf >/dev/null || fail "createtable failed"
cbtq createappprofile i towest d route-to=west force=true >/dev/null || fail "createappprofile towest failed"
cbtq createappprofile i any d route-any >/dev/null || fail "createappprofile any failed"
call() { "$CLIENT" "127.0.0.1:$PORT" t "$1" "$2"; } # PROFILE read|write|writes
for op in read write writes; do
  out=$(call towest $op)
  [ "${out%% *}" = OK ] || fail "$op via west failed before the freeze: $out"
done

WEST=$(cat "$DIR/run/west-0.pid")
kill -STOP "$WEST"
for _ in $(seq 1 150); do # hang guard: the probes take about a second
  grep -q "cluster=west health=down" "$DIR/logs/router.log" && break
  sleep 0.2
done
grep -q "cluster=west health=down" "$DIR/logs/router.log" || fail "the router never marked west down"
for op in read write writes; do
  out=$(call towest $op)
  echo "frozen west, $op via towest: $out"
  case "$out" in
  "UNAVAILABLE cluster west has no reachable node"*"no node answered a health probe since"*"strata failover"*) ;;
  *) fail "$op via a profile routed to the frozen cluster: expected UNAVAILABLE refused at once, got: $out" ;;
  esac
  out=$(call any $op)
  echo "frozen west, $op via any: $out"
  [ "${out%% *}" = OK ] || fail "$op via a multi-cluster profile while west is frozen: $out"
done

# Both clusters frozen: a multi-cluster profile has nowhere to go, and says so (it used to
# advise "a multi-cluster app profile or strata failover", which the client already had or
# cannot use).
EAST=$(cat "$DIR/run/east-0.pid")
kill -STOP "$EAST"
for _ in $(seq 1 150); do # hang guard: the probes take about a second
  grep -q "cluster=east health=down" "$DIR/logs/router.log" && break
  sleep 0.2
done
for op in read write writes; do
  out=$(call any $op)
  echo "both frozen, $op via any: $out"
  case "$out" in
  "UNAVAILABLE no cluster of this multi-cluster app profile ("*") has a reachable node"*) ;;
  *) kill -CONT "$EAST"; fail "$op via any with both clusters frozen: got: $out" ;;
  esac
done
kill -CONT "$EAST"

kill -CONT "$WEST"
for op in read write writes; do
  ok=
  for _ in $(seq 1 100); do # hang guard: west answers its next probe
    out=$(call towest $op)
    if [ "${out%% *}" = OK ]; then ok=1; break; fi
    sleep 0.2
  done
  [ -n "$ok" ] || fail "$op via west still fails after SIGCONT: $out"
  echo "west resumed, $op via towest: OK"
done
echo PASS
