#!/usr/bin/env bash
# restore_dest_kill_test.sh — a restore that fails because a node of another cluster died while
# it pulled pieces there leaves no temporary piece on that node once it is back:
#   1. instance of two clusters (east, west) of one node, 256 KiB split threshold; table sp of
#      some 30 tablets, its backup s1 in east;
#   2. `restore s1 --to r1`; as soon as west's node has sealed a piece of the restore's
#      temporary backup (backups/i/west/restore-<n>/), that node is killed (kill -9). The
#      restore fails after its 30 s without progress, saying to start the node again and
#      retry, not that it is reconnecting; its cleanup cannot reach the node;
#   3. `strata up` starts the node again: the router's sweep deletes the temporary pieces there
#      (a late delete, within a sweep or two), and the retried restore has every row. Before,
#      the pieces stayed for good, holding links to copies of the backup's files.
# The kill may come after the restore has finished; the test then tries again (3 times at most).
# Skips (77) without cbt.
# Usage: restore_dest_kill_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi

instance_init restore_dest_kill_test
FAIL_TAIL_LINES=20
bk() { timeout 300 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
W=$DIR/west-0/backups/i/west
sealed() { # a sealed piece of a restore's temporary backup on west's node
  find "$W" -mindepth 3 -maxdepth 3 -path "$W/restore-*/*/PIECE" ! -path '*/.*' 2>/dev/null | grep -q .
}
temps() { ls -d "$W"/restore-* 2>/dev/null; }
rows_of() { # rows_of TABLE
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i count "$1" 2>&1 | grep -v 'creds flag unset'
}

echo "== 1. two clusters of one node, table sp split while loading, backup s1 in east"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 --split-bytes 262144 >/dev/null ||
  fail "strata up failed"
timeout 120 "$STRATA" bench --dir "$DIR" --project p --instance i --table sp --workload bulkwrite \
  --dist sequential --keys 160 --requests 1 --value-size 65536 --no-lag --quiet >"$TMPD/1l.out" 2>&1 ||
  fail "loading sp: $(cat "$TMPD/1l.out")"
for try in $(seq 1 60); do # the splits follow the load
  bk create sp --id s1 --cluster east --expire 1d --wait >"$TMPD/1c.out" 2>&1 || fail "create s1: $(cat "$TMPD/1c.out")"
  pieces=$(find "$DIR"/east-*/backups/i/east/s1 -name PIECE | wc -l)
  [ "$pieces" -ge 24 ] && break
  bk delete s1 >/dev/null 2>&1 || fail "delete s1"
  sleep 1
done
[ "$pieces" -ge 24 ] || fail "s1 has $pieces pieces after $try tries"
want=$(rows_of sp)
echo "ok: s1 has $pieces pieces, $want rows"

echo "== 2. restore s1, west's node killed once it holds a temporary piece"
failed=
for try in 1 2 3; do
  bk restore s1 --cluster east --to "r$try" --wait >"$TMPD/2-$try.out" 2>&1 &
  rpid=$!
  for i in $(seq 1 2000); do sealed && break; kill -0 "$rpid" 2>/dev/null || break; sleep 0.01; done
  sealed && kill -9 "$(cat "$DIR/run/west-0.pid")"
  wait "$rpid" && { echo "the restore finished before the kill; again"; continue; }
  failed=$try
  break
done
[ -n "$failed" ] || fail "every restore finished before the node could be killed"
msg=$(cat "$TMPD/2-$failed.out")
[ -n "$(temps)" ] || fail "no temporary piece on west's node after the kill"
grep -q 'start that node again' <<<"$msg" || fail "the failure does not say to start the node again: $msg"
grep -q 'retry the restore' <<<"$msg" || fail "the failure does not say to retry: $msg"
! grep -q 'reconnecting in' <<<"$msg" || fail "the failure says the router is reconnecting: $msg"
echo "ok: r$failed failed: $msg"

echo "== 3. the node back: its temporary pieces go, the retry restores every row"
"$STRATA" up --dir "$DIR" --port "$PORT" >"$TMPD/3u.out" 2>&1 || fail "strata up again: $(cat "$TMPD/3u.out")"
for i in $(seq 1 60); do [ -z "$(temps)" ] && break; sleep 1; done
[ -z "$(temps)" ] || fail "temporary pieces left on west's node $i s after it came back: $(temps)"
grep -q "late delete of backup .*restore-" "$DIR"/logs/router*.log || fail "no late delete in the router's log"
echo "ok: gone $i s after the restart"
bk restore s1 --cluster east --to "r$failed" --wait >"$TMPD/3r.out" 2>&1 || fail "retry: $(cat "$TMPD/3r.out")"
rows=$(rows_of "r$failed")
[ "$rows" = "$want" ] || fail "r$failed has $rows rows, want $want"
[ -z "$(temps)" ] || fail "temporary pieces left after the retry: $(temps)"
echo "ok: $rows rows"
echo PASS
