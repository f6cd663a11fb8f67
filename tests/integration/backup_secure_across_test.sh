#!/usr/bin/env bash
# backup_secure_across_test.sh — `strata backup restore --target` with secure instances
# (docs/backups.md, "Restore into another instance"; `strata up --secure`: TLS-only routers with
# bearer tokens, nodes that accept only the instance's admin certificate). A is secure, B secure
# with its own CA, C plaintext:
#   1. A's backup into B with --target DIR_B: the rows read back on B; nothing left behind;
#   2. into B with --target HOST:PORT of B's router: refused before anything is copied, the
#      message naming --target DIR (the nodes' certificates are only in the directory);
#   3. A's backup into plaintext C with --target HOST:PORT: the calls to C carry none of A's
#      credentials; the rows read back on C;
#   4. C's backup into secure B with --target DIR_B from C's --dir.
# Skips (77) without cbt or openssl.
# Usage: backup_secure_across_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v openssl >/dev/null || { echo "openssl not installed: skipping"; exit 77; }
instance_init backup_secure_across_test
DIRB=$TMPD/instb
DIRC=$TMPD/instc
PORTB=$(free_port)
PORTC=$(free_port)
finish() {
  "$STRATA" down --dir "$DIRB" >/dev/null 2>&1
  "$STRATA" down --dir "$DIRC" >/dev/null 2>&1
  instance_teardown
}
trap finish EXIT
FAIL_TAIL_LINES=20
FAIL_EXTRA_LOGS=("$DIRB"/logs/router.log "$DIRC"/logs/router.log)
export TMPDIR=$TMPD/tmp
mkdir -p "$TMPDIR"

# secure_cbt DIR UPOUT: the cbt command line `strata up --secure` printed for DIR, into cbt_DIR
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 --secure >"$TMPD/upa.out" 2>&1 ||
  { cat "$TMPD/upa.out"; fail "strata up --secure (A)"; }
"$STRATA" up --dir "$DIRB" --port "$PORTB" --clusters 1 --nodes 1 --secure >"$TMPD/upb.out" 2>&1 ||
  { cat "$TMPD/upb.out"; fail "strata up --secure (B)"; }
"$STRATA" up --dir "$DIRC" --port "$PORTC" --clusters 1 --nodes 1 >"$TMPD/upc.out" 2>&1 ||
  { cat "$TMPD/upc.out"; fail "strata up (C)"; }
cbt_line() { grep -E '^  cbt ' "$1" | sed 's/^  //; s/ ls$//'; }
read -r -a cmda <<<"$(cbt_line "$TMPD/upa.out" | sed "s#^cbt#$CBT#")"
read -r -a cmdb <<<"$(cbt_line "$TMPD/upb.out" | sed "s#^cbt#$CBT#")"
cbta() { env -u BIGTABLE_EMULATOR_HOST timeout 60 "${cmda[@]}" "$@" 2>&1; }
cbtb() { env -u BIGTABLE_EMULATOR_HOST timeout 60 "${cmdb[@]}" "$@" 2>&1; }
cbtc() { BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORTC timeout 60 "$CBT" -project p -instance i "$@" 2>&1; }
bka() { timeout 300 "$STRATA" backup --dir "$DIR" --quiet "$@" 2>&1; }
bkb() { timeout 300 "$STRATA" backup --dir "$DIRB" --quiet "$@" 2>&1; }
bkc() { timeout 300 "$STRATA" backup --dir "$DIRC" --quiet "$@" 2>&1; }
no_leftovers() { # no temporary backup on B or C, nothing in TMPDIR
  local l
  l=$(bkb list; bkc list)
  if printf '%s' "$l" | grep -q 'xrestore-'; then fail "$1: a temporary backup stayed: $l"; fi
  [ -z "$(ls -A "$TMPDIR")" ] || fail "$1: left in TMPDIR: $(ls -A "$TMPDIR")"
}

cbta createtable t families=cf >/dev/null || fail "createtable t on A: $(cbta createtable t families=cf)"
cbta set t r1 cf:c=secure-one >/dev/null || fail "set r1 on A"
cbta set t r2 cf:c=secure-two >/dev/null || fail "set r2 on A"
out=$(bka create t --id b1 --expire 1d --wait) || fail "create b1 on A: $out"

echo "== 1. secure A into secure B by directory"
out=$(bka restore b1 --to t2 --target "$DIRB") || fail "restore --target DIR_B: $out"
echo "$out" | grep -q 'restored .*/backups/b1 into projects/p/instances/i/tables/t2' || fail "said: $out"
out=$(cbtb read t2)
echo "$out" | grep -q 'secure-two' || fail "t2 on B: $out"
no_leftovers "into B by directory"
echo ok

echo "== 2. secure B by HOST:PORT: refused up front, naming --target DIR"
out=$(bka restore b1 --to t3 --target "127.0.0.1:$PORTB") && fail "restore --target H:P of secure B succeeded: $out"
echo "$out" | grep -q -- '--target DIR\|--target <its directory>\|instance directory' ||
  fail "restore --target H:P of secure B: the message does not name --target DIR: $out"
no_leftovers "into B by address"
cbtb ls | grep -qx t3 && fail "t3 exists on B"
echo "ok: $out"

echo "== 3. secure A into plaintext C by HOST:PORT"
out=$(bka restore b1 --to t4 --target "127.0.0.1:$PORTC") || fail "restore --target H:P of C: $out"
out=$(cbtc read t4)
echo "$out" | grep -q 'secure-one' || fail "t4 on C: $out"
no_leftovers "into C by address"
echo ok

echo "== 4. plaintext C into secure B by directory"
out=$(bkc create t4 --id c1 --expire 1d --wait) || fail "create c1 on C: $out"
out=$(bkc restore c1 --to t5 --target "$DIRB") || fail "restore C into B: $out"
out=$(cbtb read t5)
echo "$out" | grep -q 'secure-one' || fail "t5 on B: $out"
no_leftovers "C into B"
echo ok
if grep -l 'Sanitizer' "$DIR"/logs/*.log "$DIRB"/logs/*.log "$DIRC"/logs/*.log 2>/dev/null; then
  fail "sanitizer report"
fi
echo PASS
