#!/usr/bin/env bash
# secure_move_test.sh — tablet moves work under mutual TLS (docs/security.md, Internal links).
# A move's source makes its copy on the target with PutTable, CreateTablet and CopyRows and drops
# a failed copy with DropTablet, as a client whose certificate names strata-node. The target
# served PutTable, CreateTablet and DropTablet only to routers and operators, so on an instance
# started with `strata up --secure` every move failed PERMISSION_DENIED and the balancer never
# spread a node's split halves. Nodes now take those calls from a node only for a move's
# incoming copy (and a PutTable that drops no family): a node certificate still cannot turn a
# serving tablet off or create one.
# Usage: secure_move_test.sh STRATA MTLS_CALL (skips, 77, without cbt or openssl)
set -u
STRATA=$1
CALL=$2
. "$(dirname "$0")/lib.sh"
[ -n "$CBT" ] || { echo "cbt not installed: skipping"; exit 77; }
command -v openssl >/dev/null || { echo "openssl not installed: skipping"; exit 77; }
instance_init secure_move
up_secure_single --nodes 2 --split-bytes 100000
EAST0=$(grep -Eo 'east-0 +127\.0\.0\.1:[0-9]+' "$TMPD/up.out" | grep -Eo '127\.0\.0\.1:[0-9]+')
[ -n "$EAST0" ] || fail "node address not in the output of strata up"

echo "== a node certificate: no serving tablet created or dropped, no family dropped"
as_node() { "$CALL" "$EAST0" "/strata.internal.v1.Node/$1" --ca "$S/ca.pem" \
  --cert "$S/east-1.pem" --key "$S/east-1.key"; }
out=$(as_node CreateTablet)
echo "CreateTablet: $out"
grep -q "^PERMISSION_DENIED .*makes only a move's incoming copy" <<<"$out" ||
  fail "CreateTablet of a serving tablet from a node certificate: $out"

echo "== rows written to one node split there; the balancer moves halves to the other"
cbts createtable t families=cf >/dev/null || fail "createtable"
V=$(head -c 10000 /dev/zero | tr '\0' x)
for i in $(seq 1 40); do
  cbts set t "r$(printf %03d "$i")" "cf:q=$V" >/dev/null || fail "set r$i"
done
moved=""
for _ in $(seq 1 60); do
  moved=$(grep -E 'module=balance .*table=.*/tables/t tablet=.* -> .* in [0-9]+ ms' \
    "$DIR/logs/router.log" | head -1)
  [ -n "$moved" ] && break
  sleep 1
done
grep -E 'module=balance' "$DIR/logs/router.log" | tail -3
[ -n "$moved" ] || fail "no tablet moved within 60 s on a secure instance"
grep -q 'PERMISSION_DENIED' "$DIR/logs/router.log" "$DIR"/logs/east-*.log &&
  fail "a move was refused PERMISSION_DENIED"
rows=$(cbts count t | tail -1)
[ "$rows" = 40 ] || fail "after the move: $rows rows, want 40"
echo "secure_move_test: passed"
