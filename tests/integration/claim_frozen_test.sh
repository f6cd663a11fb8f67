#!/usr/bin/env bash
# claim_frozen_test.sh — a CreateTable that fails while the first cluster's metadata node is
# frozen (SIGSTOP) must not leave the table id unusable. Its claim on the id, written to the
# frozen node, lands when the node thaws; once the call has ended, the router releases such a
# claim of its own at the next CreateTable of the id instead of answering ALREADY_EXISTS ("is
# being created through another router") for a table that does not exist, for 15 minutes.
# Usage: claim_frozen_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "SKIP: cbt not installed"; exit 77; fi

instance_init claim_frozen
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
ADDR=127.0.0.1:$PORT
cbtr "$ADDR" createtable warm families=cf >/dev/null || fail "createtable warm"
META=$(cat "$DIR/run/east-0.pid") # the first cluster's only node holds its metadata

echo "== CreateTable with east-0 frozen fails"
kill -STOP "$META"
out=$(cbtr "$ADDR" createtable cl1 families=cf)
rc=$?
kill -CONT "$META"
[ $rc -ne 0 ] || fail "CreateTable succeeded with the metadata node frozen: $out"
echo "   $out" | cut -c1-200

echo "== after the thaw the same id can be created"
ok=0
for _ in $(seq 1 20); do
  sleep 1
  out=$(cbtr "$ADDR" createtable cl1 families=cf) && { ok=1; break; }
  # the router may still count east as down for a moment after the thaw: retry that only
  case "$out" in *AlreadyExists*) break ;; esac
done
[ $ok = 1 ] || fail "CreateTable of cl1 after the thaw: $out"
cbtr "$ADDR" ls | grep -qx cl1 || fail "cl1 not listed"
cbtr "$ADDR" set cl1 r cf:a=v >/dev/null || fail "write to cl1"
cbtr "$ADDR" createtable cl1 families=cf | grep -q AlreadyExists ||
  fail "a second CreateTable of the existing cl1 was not ALREADY_EXISTS"
echo "claim_frozen_test: passed"
