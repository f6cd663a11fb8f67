#!/usr/bin/env bash
# schema_race_test.sh — schema changes of one table sent at once through the router, on
# `strata up --clusters 2 --nodes 1`, with the official cbt CLI: 16 concurrent CreateFamily calls
# all succeed and all 16 families exist (each change used to start from the record as it was, so
# the last push undid the others: 12 calls left 5 families); concurrent DeleteFamily and
# SetGcPolicy calls on different families all take effect; a DeleteTable racing CreateFamily
# calls leaves no table behind. Each node's own schema is checked too: a write to a family the
# node does not have is refused as NOT_FOUND before any other check.
# Usage: schema_race_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
instance_init schema_race
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.log" 2>&1 ||
  { cat "$TMPD/up.log"; fail "strata up failed"; }
R=127.0.0.1:$PORT
NODES=$("$STRATA" status --dir "$DIR" | awk '$3 ~ /-0$/ && $4 ~ /:/ {print $4}')
[ "$(echo "$NODES" | wc -w)" = 2 ] || fail "expected two node addresses in strata status, got: $NODES"

# node_has ADDR TABLE FAMILY: whether the node at ADDR has FAMILY in TABLE's schema.
node_has() {
  local out
  out=$(cbtr "$1" set "$2" r "$3":q=v)
  case $out in
  *"column family not found"* | *NotFound*) return 1 ;;
  *) return 0 ;;
  esac
}

# parallel N CMD...: runs CMD with {} replaced by 1..N at once; fails when any call failed.
parallel() {
  local n=$1 i pids=() rc=0
  shift
  for i in $(seq 1 "$n"); do
    cbtr "$R" "${@//\{\}/$i}" >"$TMPD/call.$i.log" &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { rc=1; cat "$TMPD/call.$((i + 1)).log" >&2; }
  done
  return $rc
}

cbtr "$R" createtable t1 >/dev/null || fail "createtable t1"
parallel 16 createfamily t1 f{} || fail "a concurrent createfamily failed"
LS=$(cbtr "$R" ls t1)
for i in $(seq 1 16); do
  echo "$LS" | grep -q "^f$i[[:space:]]" || fail "family f$i missing after 16 concurrent createfamily calls: $LS"
done
for i in 1 8 16; do # the nodes' schemas (one cbt call each: a sample)
  for a in $NODES; do node_has "$a" t1 "f$i" || fail "node $a lacks family f$i"; done
done
echo "16 concurrent createfamily: all 16 families on the router and both nodes"

# Deletes of f1-f8 and GC policies of f9-f16, all at once.
# Each call's exit status goes to its log's last line, so a failure says whether the call
# itself failed (and how) or succeeded without taking effect.
for i in $(seq 1 8); do
  { cbtr "$R" deletefamily t1 "f$i"; echo "exit status $?"; } >"$TMPD/del.$i.log" 2>&1 &
  { cbtr "$R" setgcpolicy t1 "f$((i + 8))" maxversions=$i; echo "exit status $?"; } \
    >"$TMPD/gc.$i.log" 2>&1 &
done
wait
LS=$(cbtr "$R" ls t1)
for i in $(seq 1 8); do
  echo "$LS" | grep -q "^f$i[[:space:]]" &&
    fail "family f$i still listed after its deletefamily ($(tr '\n' ' ' <"$TMPD/del.$i.log")): $LS"
  echo "$LS" | grep -q "^f$((i + 8))[[:space:]].*versions() > $i[[:space:]]" ||
    fail "family f$((i + 8)) lacks its GC policy maxversions=$i ($(tr '\n' ' ' <"$TMPD/gc.$i.log")): $LS"
done
for i in 1 8; do
  for a in $NODES; do
    node_has "$a" t1 "f$i" && fail "node $a still has deleted family f$i"
    node_has "$a" t1 "f$((i + 8))" || fail "node $a lost family f$((i + 8))"
  done
done
echo "8 deletefamily + 8 setgcpolicy at once: every change took effect"

# DeleteTable while CreateFamily calls run: the table is gone everywhere afterwards.
for i in $(seq 1 6); do cbtr "$R" createfamily t1 "g$i" >/dev/null & done
cbtr "$R" deletetable t1 >"$TMPD/deletetable.log" || { cat "$TMPD/deletetable.log"; fail "deletetable"; }
wait
cbtr "$R" ls | grep -qx t1 && fail "table t1 listed after deletetable"
for a in $NODES; do
  out=$(cbtr "$a" set t1 r f9:q=v)
  case $out in *NotFound* | *"not found"*) ;; *) fail "node $a still has table t1: $out" ;; esac
done
echo "deletetable racing createfamily: no table left"
# Every process stops cleanly (a sanitizer build reports leaks and errors at exit).
"$STRATA" down --dir "$DIR" >"$TMPD/down.log" 2>&1 || { cat "$TMPD/down.log"; fail "strata down failed"; }
grep -l "Sanitizer" "$DIR"/logs/*.log && fail "a sanitizer report"
echo "PASS"
