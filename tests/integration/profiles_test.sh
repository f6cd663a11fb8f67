#!/usr/bin/env bash
# profiles_test.sh — instance admin and app profiles through strata-router, driven by the official
# cbt CLI: two clusters (east, west) of one strata-node each behind a router. Proves listinstances
# and listclusters answer from the topology; the default profile exists (east, transactional);
# createappprofile / getappprofile / listappprofile / updateappprofile (which waits on the
# operation it returns) / deleteappprofile work, with Bigtable's validation and the
# ignore_warnings (force=true) check; requests follow their profile — a row written through a
# profile on east is not read through a profile on west (no replication yet: that proves the
# routing) — and follow an update at once; single-row transactions are refused with
# FAILED_PRECONDITION where the profile forbids them (profile_txn, since cbt cannot send them
# with a profile); unknown profiles are NOT_FOUND; a second router sees profiles created through
# the first, and follows changes made through the first after its metadata reload.
# Usage: profiles_test.sh PATH/TO/strata-node PATH/TO/strata-router PATH/TO/profile_txn
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
TXN_BIN=$3
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi

dir=$(make_tmp)
two_clusters "$dir"

start_router "$dir/topology" "$dir/r1.log"; R1=$ROUTER_ADDR

fail=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fail=1; }
expect() { # WHAT WANT GOT
  if [ "$2" != "$3" ]; then bad "$1: want '$2', got '$3'"; else ok "$1"; fi
}
has() { # WHAT PATTERN TEXT
  if echo "$3" | grep -Eq -- "$2"; then ok "$1"; else bad "$1: no '$2' in: $3"; fi
}
hasnt() { # WHAT PATTERN TEXT
  if echo "$3" | grep -Eq -- "$2"; then bad "$1: unexpected '$2' in: $3"; else ok "$1"; fi
}
rows() { grep -E '^r[0-9]+$' | tr '\n' ' ' | sed 's/ $//'; }

echo "== instances and clusters"
has "listinstances" '^i[[:space:]]' "$(cbtr "$R1" listinstances)"
OUT=$(cbtr "$R1" listclusters)
has "listclusters east" '^east[[:space:]]+zone-a[[:space:]]+READY \(1 serve nodes\)' "$OUT"
has "listclusters west" '^west[[:space:]]+zone-b[[:space:]]+READY \(1 serve nodes\)' "$OUT"

echo "== the default profile"
OUT=$(cbtr "$R1" getappprofile i default)
has "default routes to east" 'cluster_id:"east"' "$OUT"
has "default allows transactions" 'allow_transactional_writes:true' "$OUT"

echo "== create, get, list"
cbtr "$R1" createappprofile i txeast "east, transactional" route-to=east transactional-writes=true >/dev/null || bad "create txeast"
cbtr "$R1" createappprofile i pwest "west" route-to=west >/dev/null || bad "create pwest"
cbtr "$R1" createappprofile i pany "any cluster" route-any >/dev/null || bad "create pany"
OUT=$(cbtr "$R1" getappprofile i txeast)
has "get txeast" 'Name: projects/p/instances/i/appProfiles/txeast' "$OUT"
has "txeast routing" 'cluster_id:"east" +allow_transactional_writes:true' "$OUT"
has "txeast description" 'Description: east, transactional' "$OUT"
has "txeast etag" 'Etag: [0-9a-f]{16}' "$OUT"
expect "listappprofile" "default pany pwest txeast" \
  "$(cbtr "$R1" listappprofile i | grep -Eo 'appProfiles/[^[:space:]]+' | sed 's|appProfiles/||' | tr '\n' ' ' | sed 's/ $//')"

echo "== validation"
has "duplicate id" 'AlreadyExists' "$(cbtr "$R1" createappprofile i pwest "again" route-to=west)"
has "unknown cluster" 'InvalidArgument.*mars' "$(cbtr "$R1" createappprofile i pmars "x" route-to=mars)"
has "bad id" 'InvalidArgument' "$(cbtr "$R1" createappprofile i -bad "x" route-any)"
has "transactions on a second cluster need force" 'FailedPrecondition.*ignore_warnings' \
  "$(cbtr "$R1" createappprofile i txwest "x" route-to=west transactional-writes=true)"
cbtr "$R1" createappprofile i txwest "x" route-to=west transactional-writes=true force=true >/dev/null ||
  bad "create txwest with force=true"
cbtr "$R1" deleteappprofile i txwest >/dev/null || bad "delete txwest"
has "get unknown profile" 'NotFound' "$(cbtr "$R1" getappprofile i nosuch)"
has "default cannot be deleted" 'FailedPrecondition' "$(cbtr "$R1" deleteappprofile i default)"

echo "== requests follow their profile"
cbtr "$R1" createtable t families=cf >/dev/null || bad "createtable"
cbtr "$R1" set t r1 app-profile=txeast cf:c=east >/dev/null || bad "set through txeast"
cbtr "$R1" set t r2 app-profile=pwest cf:c=west >/dev/null || bad "set through pwest"
expect "read through txeast (east)" "r1" "$(cbtr "$R1" read t app-profile=txeast | rows)"
expect "read through pwest (west)" "r2" "$(cbtr "$R1" read t app-profile=pwest | rows)"
expect "read through default (east)" "r1" "$(cbtr "$R1" read t | rows)"
expect "read through pany (first healthy: east)" "r1" "$(cbtr "$R1" read t app-profile=pany | rows)"
has "unknown profile" 'NotFound.*nosuch' "$(cbtr "$R1" read t app-profile=nosuch)"

echo "== single-row transactions"
has "CheckAndMutate via pwest" '^FAILED_PRECONDITION Single-row transactions are not allowed by this app profile' \
  "$("$TXN_BIN" "$R1" t pwest cam r1)"
has "ReadModifyWrite via pwest" '^FAILED_PRECONDITION Single-row transactions are not allowed' \
  "$("$TXN_BIN" "$R1" t pwest rmw r1)"
has "ReadModifyWrite via pany" '^FAILED_PRECONDITION Single-row transactions are not allowed' \
  "$("$TXN_BIN" "$R1" t pany rmw r1)"
has "CheckAndMutate via txeast" '^OK' "$("$TXN_BIN" "$R1" t txeast cam r1)"
has "ReadModifyWrite via default" '^OK' "$("$TXN_BIN" "$R1" t "" rmw r1)"
has "transaction via unknown profile" '^NOT_FOUND' "$("$TXN_BIN" "$R1" t nosuch cam r1)"

echo "== a second router"
start_router "$dir/topology" "$dir/r2.log"; R2=$ROUTER_ADDR
expect "second router lists the profiles" "default pany pwest txeast" \
  "$(cbtr "$R2" listappprofile i | grep -Eo 'appProfiles/[^[:space:]]+' | sed 's|appProfiles/||' | tr '\n' ' ' | sed 's/ $//')"
expect "second router routes txeast to east" "r1" "$(cbtr "$R2" read t app-profile=txeast | rows)"

echo "== update: failover of txeast to west"
cbtr "$R1" updateappprofile i txeast "moved to west" route-to=west >/dev/null || bad "updateappprofile"
OUT=$(cbtr "$R1" getappprofile i txeast)
has "updated routing" 'cluster_id:"west"' "$OUT"
hasnt "transactions dropped by the update" 'allow_transactional_writes' "$OUT"
has "updated description" 'Description: moved to west' "$OUT"
expect "this router follows at once" "r2" "$(cbtr "$R1" read t app-profile=txeast | rows)"
has "txeast no longer allows transactions" '^FAILED_PRECONDITION' "$("$TXN_BIN" "$R1" t txeast cam r1)"
# The other router re-reads the metadata every second; bounded wait (hang guard, not a timing test).
got=""
for _ in $(seq 1 100); do
  got=$(cbtr "$R2" read t app-profile=txeast | rows)
  [ "$got" = "r2" ] && break
  sleep 0.1
done
expect "the second router follows after its reload" "r2" "$got"

echo "== etag and operations"
ETAG=$(cbtr "$R1" getappprofile i pwest | sed -n 's/^Etag: //p')
has "stale etag" '^ABORTED' "$("$TXN_BIN" "$R1" - pwest update 0123456789abcdef)"
OUT=$("$TXN_BIN" "$R1" - pwest update "$ETAG")
has "current etag" '^OK' "$OUT"
has "GetOperation returns the done operation" \
  '^GETOP OK done=1 type.googleapis.com/google.bigtable.admin.v2.AppProfile' "$OUT"
has "etag-checked update applied" 'Description: etag-test' "$(cbtr "$R1" getappprofile i pwest)"
OPNAME=$(echo "$OUT" | sed -n 's/^GETOP .* //p')
has "operation name" '^operations/projects/p/instances/i/appProfiles/pwest/[0-9]+$' "$OPNAME"
has "GetOperation again" '^GETOP OK done=1' "$("$TXN_BIN" "$R1" - "$OPNAME" getop -)"
has "operations are per router" '^GETOP NOT_FOUND' "$("$TXN_BIN" "$R2" - "$OPNAME" getop -)"

echo "== delete"
cbtr "$R1" deleteappprofile i pany >/dev/null || bad "deleteappprofile"
has "deleted profile is gone" 'NotFound' "$(cbtr "$R1" getappprofile i pany)"
has "requests with a deleted profile" 'NotFound' "$(cbtr "$R1" read t app-profile=pany)"
expect "list after delete" "default pwest txeast" \
  "$(cbtr "$R1" listappprofile i | grep -Eo 'appProfiles/[^[:space:]]+' | sed 's|appProfiles/||' | tr '\n' ' ' | sed 's/ $//')"

if [ $fail -eq 0 ]; then echo "profiles_test: passed"; else
  echo "profiles_test: FAILED"; tail -n 20 "$dir"/r1.log "$dir"/r2.log
fi
exit $fail
