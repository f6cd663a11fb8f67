#!/usr/bin/env bash
# two_routers_test.sh — one instance served by two routers at once (A from `strata up`, B a second
# strata-router on the same topology), driven by cbt: app profiles changed through A route
# through B; a table created through A is served by B, deleted through A is NOT_FOUND through B
# and stays deleted, recreated through B with other families shows neither old rows nor old
# families through A. Then a manual failover away from a dead first cluster: once that cluster
# is back (its metadata copy missed the failover; a replication cut keeps it stale), neither
# router may route the profile back to it (they did: every reload read the first cluster's copy
# alone). Skips (77) without cbt.
# Usage: two_routers_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
ROUTER_BIN=$(cd "$(dirname "$STRATA")/.." && pwd)/router/strata-router
if [ -z "$CBT" ]; then echo "SKIP: cbt not installed"; exit 77; fi

instance_init two_routers
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
A=127.0.0.1:$PORT
start_router "$DIR/topology" "$TMPD/b.log"; B=$ROUTER_ADDR
FAIL_EXTRA_LOGS=("$TMPD/b.log")

# route ADDR PROFILE: the cluster PROFILE routes to, as the router at ADDR answers.
route() { cbtr "$1" getappprofile i "$2" | grep -Eo 'cluster_id:"[a-z-]+"' | cut -d'"' -f2; }
# within S CMD...: runs CMD until it succeeds, for at most S seconds (a hang guard: routers
# follow each other's changes at their next metadata reload, every second).
within() {
  local end=$((SECONDS + $1))
  shift
  until "$@"; do [ $SECONDS -lt "$end" ] || return 1; sleep 0.2; done
}
routes_to() { [ "$(route "$1" "$2")" = "$3" ]; }
has_row() { cbtr "$1" read "$2" app-profile="$3" | grep -q "^$4\$"; }

echo "== app profiles changed through A, used through B"
cbtr "$A" createtable t families=f >/dev/null || fail "createtable t"
for p in pe:east pw:west px:east; do
  cbtr "$A" createappprofile i "${p%%:*}" d "route-to=${p#*:}" >/dev/null || fail "create ${p%%:*}"
done
within 10 routes_to "$B" px east || fail "B never saw profile px"
"$STRATA" chaos partition east west --dir "$DIR" >/dev/null || fail "partition"
cbtr "$A" updateappprofile i px d route-to=west force=true >/dev/null || fail "update px"
within 10 routes_to "$B" px west || fail "B kept px on east"
cbtr "$B" set t r1 f:c=v app-profile=px >/dev/null || fail "write through B"
has_row "$A" t pw r1 || fail "B's write with px (now west) is not in west"
has_row "$A" t pe r1 && fail "B's write with px (now west) went to east"
cbtr "$A" deleteappprofile i px >/dev/null || fail "delete px"
within 10 bash -c "! BIGTABLE_EMULATOR_HOST=$B $CBT -project p -instance i getappprofile i px \
  >/dev/null 2>&1" || fail "B still serves deleted profile px"
cbtr "$B" set t r2 f:c=v app-profile=px | grep -q NotFound || fail "deleted px still routes through B"
"$STRATA" chaos heal --dir "$DIR" >/dev/null || fail "heal"

echo "== tables created and deleted through one router, used through the other"
cbtr "$A" createtable t2 families=f >/dev/null || fail "createtable t2"
within 10 cbtr "$B" set t2 old f:c=v >/dev/null || fail "B never served t2"
cbtr "$A" deletetable t2 >/dev/null || fail "deletetable t2"
out=$(cbtr "$B" set t2 late f:c=v)
echo "$out" | grep -q NotFound || fail "write through B right after the delete: $out"
sleep 1.5
for r in "$A" "$B"; do
  cbtr "$r" ls | grep -qx t2 && fail "t2 came back through $r"
done
within 10 cbtr "$B" createtable t2 families=g >/dev/null || fail "recreate t2 through B"
within 10 bash -c "BIGTABLE_EMULATOR_HOST=$A $CBT -project p -instance i ls t2 2>/dev/null |
  cut -f1 | grep -qx g" || fail "A never saw the new t2"
fams=$(cbtr "$A" ls t2 | cut -f1 | grep -Ex '[a-z]+' | tr '\n' ' ')
[ "$fams" = "g " ] || fail "t2 recreated with family g has families: $fams"
rows=$(cbtr "$A" read t2 | grep -c '^[a-z]')
[ "$rows" -eq 0 ] || fail "recreated t2 holds $rows old row(s) through A"

echo "== failover away from a dead first cluster, which then comes back stale"
cbtr "$A" createappprofile i py d route-to=east >/dev/null || fail "create py"
within 10 routes_to "$B" py east || fail "B never saw profile py"
"$STRATA" chaos kill-cluster east --dir "$DIR" >/dev/null || fail "kill east"
within 20 "$STRATA" failover py west --dir "$DIR" >/dev/null || fail "strata failover py west"
# The cut is recorded and applied to east when it starts: its copy keeps py on east.
"$STRATA" chaos partition east west --dir "$DIR" >/dev/null 2>&1
"$STRATA" chaos restart-cluster east --dir "$DIR" >/dev/null || fail "restart east"
for i in 1 2 3 4 5 6; do
  for r in "$A" "$B"; do
    got=$(route "$r" py)
    [ "$got" = west ] || fail "after east came back, router $r routes py to '$got', not west"
  done
  sleep 0.5
done
"$STRATA" chaos heal --dir "$DIR" >/dev/null || fail "heal"
echo "two_routers_test: passed"
