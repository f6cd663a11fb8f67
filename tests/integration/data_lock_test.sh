#!/usr/bin/env bash
# data_lock_test.sh — one strata-node per data directory (docs/operations.md, "A node's data
# directory"): a second strata-node started on the --data of a running one exits non-zero with
# "data directory ... is in use by another strata-node (pid N)" and touches nothing, while the
# first keeps serving; so is a node started after the LOCK files were removed (the directory is
# locked too); after kill -9 of the first, a new node opens the directory (the lock goes with
# the process) and has every acknowledged row. Data files are owner-only (0600, dirs 0700).
# The reads and writes use cbt; without it they are skipped, the lock checks still run.
# Usage: data_lock_test.sh PATH/TO/strata-node
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1

fail=0
check() { # WHAT CONDITION...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fail=1; fi
}
cbtq() { # ARGS... (against NODE_ADDR)
  BIGTABLE_EMULATOR_HOST=$NODE_ADDR timeout 60 "$CBT" -project p -instance i "$@" 2>&1 |
    grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}

DATA=$(make_tmp)/data
start_node "$NODE_BIN" "$DATA" || { echo "FAIL: first node did not start"; exit 1; }
FIRST=$NODE_PID
if [ -n "$CBT" ]; then
  check "create table" cbtq createtable t families=f
  check "write through the first node" cbtq set t r1 f:q=one
fi

# The second node on the same directory: refused, with the holder's pid.
LOG2=$DATA.second.log
timeout 60 "$NODE_BIN" --data "$DATA" --listen 127.0.0.1:0 >"$LOG2" 2>&1
rc=$?
check "second node exits non-zero (rc=$rc)" test "$rc" -ne 0 -a "$rc" -ne 124
check "second node says the directory is in use" \
  grep -q "data directory $DATA is in use by another strata-node (pid $FIRST); stop it or use another --data" "$LOG2"
[ "$fail" = 0 ] || cat "$LOG2"
check "first node still running" kill -0 "$FIRST"

# LOCK files removed as "stale": the directory itself is still locked, so still refused.
rm -f "$DATA/LOCK" "$DATA/storage/LOCK"
LOG3=$DATA.third.log
timeout 60 "$NODE_BIN" --data "$DATA" --listen 127.0.0.1:0 >"$LOG3" 2>&1
rc=$?
check "node after rm LOCK exits non-zero (rc=$rc)" test "$rc" -ne 0 -a "$rc" -ne 124
check "node after rm LOCK says the directory is in use" \
  grep -q "data directory $DATA is in use by another strata-node (pid unknown: its LOCK file was removed)" "$LOG3"
check "node after rm LOCK created no LOCK" test ! -e "$DATA/LOCK" -a ! -e "$DATA/storage/LOCK"
[ "$fail" = 0 ] || cat "$LOG3"
check "first node still running after rm LOCK" kill -0 "$FIRST"
if [ -n "$CBT" ]; then
  check "first node still serves writes" cbtq set t r2 f:q=two
  out=$(cbtq read t)
  check "first node reads both rows" grep -q "r2" <<<"$out"
  check "first node reads r1" grep -q "r1" <<<"$out"
fi

# Owner-only files and directories (LOCK is checked after the restart below wrote it again).
bad=$(find "$DATA" -mindepth 1 \( -type f ! -perm 600 -o -type d ! -perm 700 \) ! -name '*.sock' -print)
check "data files 0600, directories 0700${bad:+ (not: $bad)}" test -z "$bad"

# kill -9 frees the directory; the acknowledged rows are there.
kill -9 "$FIRST"
wait "$FIRST" 2>/dev/null
start_node "$NODE_BIN" "$DATA" || { echo "FAIL: node did not start after kill -9"; exit 1; }
check "a node opens the directory after kill -9" kill -0 "$NODE_PID"
check "LOCK is 0600" test "$(stat -c %a "$DATA/LOCK")" = 600
if [ -n "$CBT" ]; then
  out=$(cbtq read t)
  check "r1 survived" grep -q "r1" <<<"$out"
  check "r2 survived" grep -q "r2" <<<"$out"
fi
stop_node
exit "$fail"
