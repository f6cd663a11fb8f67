#!/usr/bin/env bash
# backup_finish_delete_test.sh — DeleteBackup of an import while its FinishImport runs, on a real
# instance (`strata up`, one cluster of two nodes). FinishImport lists the pieces on every node
# of the cluster, then writes the record READY. The second node is stopped (SIGSTOP; it holds
# no piece), so the listing waits for it; meanwhile `strata backup delete` of the backup answers.
# Then the node resumes. Before, FinishImport wrote its record READY after the delete: a READY
# backup whose pieces the delete had removed, which every restore then failed on after 30 s.
# Now FinishImport holds the backup's gate (as UpdateBackup and DeleteBackup do), so the delete
# waits for it and removes the finished backup: in the end the backup is gone and so are its
# pieces, or, if it is still listed, it is READY with its piece on the node and restores.
# The second node's empty listing (no piece there) also made FinishImport qsort a NULL array,
# which the sanitizer build stops the router for.
# Usage: backup_finish_delete_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
instance_init backup_finish_delete_test
bk() { timeout 60 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
cbtq() {
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}
N1_PID=
fail_cont() { [ -n "$N1_PID" ] && kill -CONT "$N1_PID" 2>/dev/null; fail "$@"; }

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 >/dev/null || fail "strata up failed"
CL=$(sed -n 's/^\[cluster \(.*\)\]$/\1/p' "$DIR/topology" | head -n1)
cbtq createtable one families=cf >/dev/null || fail "createtable"
cbtq set one k1 cf:a=1 >/dev/null || fail "set"
bk create one --id src --wait >/dev/null || fail "create src"
bk export src "$TMPD/exp" >/dev/null || fail "export src"

echo "== an import's FinishImport waits for a stopped node; its backup is deleted meanwhile"
N1_PID=$(cat "$DIR/run/$CL-1.pid") || fail "no pid file for $CL-1"
kill -STOP "$N1_PID"
bk import "$TMPD/exp" --as race1 >"$TMPD/imp.out" 2>&1 &
IMP=$!
# the piece goes to the cluster's first node; once it is sealed there, FinishImport follows
for i in $(seq 1 100); do
  ls "$DIR/$CL-0/backups/i/$CL/race1/"*/PIECE >/dev/null 2>&1 && break
  sleep 0.1
done
[ "$i" -lt 100 ] || fail_cont "the piece was never sealed: $(cat "$TMPD/imp.out")"
sleep 0.5
(sleep 2; kill -CONT "$N1_PID") &
bk delete race1 >"$TMPD/del.out" 2>&1 || echo "delete: $(cat "$TMPD/del.out")"
wait "$IMP"
echo "import: $(cat "$TMPD/imp.out")"
wait
N1_PID=
if bk describe race1 >"$TMPD/desc.out" 2>&1; then
  grep -q 'READY' "$TMPD/desc.out" || fail "race1 listed but not READY: $(cat "$TMPD/desc.out")"
  ls "$DIR/$CL-0/backups/i/$CL/race1/"*/PIECE >/dev/null 2>&1 ||
    fail "race1 is READY but its piece is gone from the node: every restore of it fails"
  bk restore race1 --to back --wait >/dev/null || fail "restore of the READY race1"
  [ "$(cbtq count back | tail -1)" = 1 ] || fail "restored table: $(cbtq count back)"
  echo "ok: race1 READY with its piece, restored"
else
  grep -q NOT_FOUND "$TMPD/desc.out" || fail "describe race1: $(cat "$TMPD/desc.out")"
  sleep 0.5
  left=$(ls -d "$DIR"/$CL-*/backups/i/$CL/race1/* 2>/dev/null)
  [ -z "$left" ] || fail "race1 deleted, but its pieces stay: $left"
  echo "ok: race1 deleted, no piece left"
fi
echo "PASS"
