#!/usr/bin/env bash
# backup_hostile_import_test.sh — `strata backup import` and `export` cut short or raced, on a
# real instance (`strata up`, one cluster of one node), docs/backups.md "Export and import":
#   1. an export killed with -9 has no MANIFEST: verify and import refuse it ("not a finished
#      export"); a new export succeeds;
#   2. an import killed with -9 after BeginImport leaves the backup CREATING: a retry is refused
#      ALREADY_EXISTS saying how long ago it began and how to get out (delete it, or --as); after `delete` no piece
#      directory is left on the node and the retry imports it READY;
#   3. two imports of one id at once: exactly one succeeds, the other is ALREADY_EXISTS (never
#      told to delete the winner without its age), and the winner is READY and restores to the
#      source's rows;
#   4. an import while the node is down fails with an error (no hang); once the node is back a
#      retry (after deleting what the failure left, if anything) succeeds, and no piece
#      directory other than the imported backup's is left on the node;
#   5. the node killed with -9 while an import sends: the import fails; once the node is back the
#      retry (after a delete if asked) is READY and restores the rows; no dotted (unsealed or
#      half-deleted) piece directory stays on the node.
# Usage: backup_hostile_import_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init backup_hostile_import_test
bk() { timeout 120 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
cbtq() {
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}
BKD=$DIR/east-0/backups/i/east

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >/dev/null || fail "strata up failed"
# 24 MiB in one table: the import takes long enough to be killed half way
"$STRATA" bench --dir "$DIR" --project p --instance i --table big --workload bulkwrite \
  --dist sequential --keys 384 --requests 4 --value-size 65536 --no-lag --quiet >"$TMPD/load" 2>&1 ||
  fail "load: $(tail -3 "$TMPD/load")"
bk create big --id src --wait >/dev/null || fail "create src"
ROWS=$(cbtq count big | tail -1)
[ "$ROWS" -gt 0 ] 2>/dev/null || fail "count big: $ROWS"

echo "== 1. an export killed with -9"
"$STRATA" backup --dir "$DIR" --quiet export src "$TMPD/cut" >/dev/null 2>&1 & # $! is strata itself
EP=$!
for _ in $(seq 1 500); do [ -n "$(find "$TMPD/cut/pieces" -type f 2>/dev/null)" ] && break; sleep 0.01; done
kill -9 $EP 2>/dev/null
wait $EP 2>/dev/null
if [ ! -e "$TMPD/cut/MANIFEST" ]; then
  "$STRATA" backup verify "$TMPD/cut" --quiet 2>"$TMPD/1.err" && fail "verify accepted a cut export"
  grep -q 'not a finished export' "$TMPD/1.err" || fail "cut export: $(cat "$TMPD/1.err")"
  bk import "$TMPD/cut" --as cut 2>"$TMPD/1i.err" && fail "import accepted a cut export"
  grep -q 'not a finished export' "$TMPD/1i.err" || fail "cut import: $(cat "$TMPD/1i.err")"
  echo "ok: refused: $(cat "$TMPD/1.err")"
else
  echo "ok: the export finished before the kill"
fi
bk export src "$TMPD/exp" >/dev/null || fail "export src"

echo "== 2. an import killed with -9 after BeginImport"
"$STRATA" backup --dir "$DIR" --quiet import "$TMPD/exp" --as imp1 >/dev/null 2>&1 &
IP=$!
for _ in $(seq 1 1000); do compgen -G "$BKD/imp1/*.in" >/dev/null && break; sleep 0.01; done
kill -9 $IP 2>/dev/null
wait $IP 2>/dev/null
if [ $? -eq 137 ]; then
  bk describe imp1 2>/dev/null | grep -q '^state: *CREATING' || fail "imp1 after kill: $(bk describe imp1 2>&1)"
  bk import "$TMPD/exp" --as imp1 >/dev/null 2>"$TMPD/2.err" && fail "import over a CREATING imp1 succeeded"
  grep -q 'ALREADY_EXISTS' "$TMPD/2.err" && grep -q 'strata backup delete' "$TMPD/2.err" ||
    fail "the retry does not say how to get out: $(cat "$TMPD/2.err")"
  grep -q 'an import of it began [0-9]* s ago' "$TMPD/2.err" ||
    fail "the retry does not say when the unfinished import began: $(cat "$TMPD/2.err")"
  bk delete imp1 >/dev/null || fail "delete of the CREATING imp1"
  [ -z "$(ls -A "$BKD/imp1" 2>/dev/null)" ] || fail "pieces left after delete: $(find "$BKD/imp1")"
  echo "ok: $(cat "$TMPD/2.err")"
else
  echo "ok: the import finished before the kill"
  bk delete imp1 >/dev/null || fail "delete imp1"
fi
bk import "$TMPD/exp" --as imp1 >/dev/null || fail "import imp1 again"
bk describe imp1 | grep -q '^state: *READY' || fail "imp1 not READY"

echo "== 3. two imports of one id at once (three rounds)"
for k in 1 2 3; do
  bk import "$TMPD/exp" --as "twin$k" >"$TMPD/3a" 2>&1 &
  A=$!
  bk import "$TMPD/exp" --as "twin$k" >"$TMPD/3b" 2>&1 &
  B=$!
  wait $A
  ra=$?
  wait $B
  rb=$?
  [ $((ra + rb)) -eq 1 ] || fail "two imports of twin$k: rc $ra $rb: $(cat "$TMPD/3a" "$TMPD/3b")"
  grep -q ALREADY_EXISTS "$TMPD/3a" "$TMPD/3b" || fail "the loser: $(cat "$TMPD/3a" "$TMPD/3b")"
  # the loser is not told to delete the winner's running (or finished) import
  grep -q 'strata backup delete' "$TMPD/3a" "$TMPD/3b" &&
    ! grep -q 'began [0-9]* s ago' "$TMPD/3a" "$TMPD/3b" &&
    fail "the loser is told to delete the winner: $(cat "$TMPD/3a" "$TMPD/3b")"
  bk describe "twin$k" | grep -q '^state: *READY' || fail "twin$k not READY: $(bk describe "twin$k" 2>&1)"
done
bk restore twin1 --to twint --wait >/dev/null || fail "restore twin1"
[ "$(cbtq count twint | tail -1)" = "$ROWS" ] || fail "twint has $(cbtq count twint) rows, big $ROWS"
echo "ok: one READY, one ALREADY_EXISTS each time; restored $ROWS rows"

echo "== 4. an import while the node is down"
NODE_CMD=$(grep -o 'strata up starts east-0: .*' "$DIR/logs/east-0.log" | tail -1 | sed 's/^strata up starts east-0: //')
kill -9 "$(cat "$DIR/run/east-0.pid")"
timeout -s KILL 150 "$STRATA" backup --dir "$DIR" --quiet import "$TMPD/exp" --as down1 >/dev/null 2>"$TMPD/4.err"
rc=$?
[ $rc -ne 137 ] || fail "import hung while the node was down"
[ $rc -ne 0 ] || fail "import succeeded with the node down"
echo "ok: refused: $(head -c 400 "$TMPD/4.err")"
# shellcheck disable=SC2086 # the logged command line is split into its words on purpose
setsid $NODE_CMD >>"$DIR/logs/east-0.log" 2>&1 </dev/null &
echo $! >"$DIR/run/east-0.pid"
for _ in $(seq 1 300); do cbtq count big >/dev/null 2>&1 && break; sleep 0.1; done
if ! bk import "$TMPD/exp" --as down1 >/dev/null 2>"$TMPD/4r.err"; then
  grep -q 'strata backup delete' "$TMPD/4r.err" || fail "retry after the node came back: $(cat "$TMPD/4r.err")"
  bk delete down1 >/dev/null || fail "delete down1"
  bk import "$TMPD/exp" --as down1 >/dev/null || fail "import down1 after delete"
fi
bk describe down1 | grep -q '^state: *READY' || fail "down1 not READY"
echo "ok: down1 READY after the node came back"

echo "== 5. the node killed with -9 half way through an import"
"$STRATA" backup --dir "$DIR" --quiet import "$TMPD/exp" --as mid >/dev/null 2>"$TMPD/5.err" &
IP=$!
for _ in $(seq 1 1000); do compgen -G "$BKD/mid/*.in/*" >/dev/null && break; sleep 0.01; done
kill -9 "$(cat "$DIR/run/east-0.pid")"
wait $IP && echo "(the import finished before the kill)"
echo "import: $(head -c 400 "$TMPD/5.err")"
# shellcheck disable=SC2086
setsid $NODE_CMD >>"$DIR/logs/east-0.log" 2>&1 </dev/null &
echo $! >"$DIR/run/east-0.pid"
for _ in $(seq 1 300); do cbtq count big >/dev/null 2>&1 && break; sleep 0.1; done
if ! bk import "$TMPD/exp" --as mid >/dev/null 2>"$TMPD/5r.err"; then
  grep -q 'strata backup delete' "$TMPD/5r.err" || fail "retry after the node came back: $(cat "$TMPD/5r.err")"
  bk delete mid >/dev/null || fail "delete mid"
  bk import "$TMPD/exp" --as mid >/dev/null || fail "import mid after delete"
fi
bk describe mid | grep -q '^state: *READY' || fail "mid not READY"
bk restore mid --to midt --wait >/dev/null || fail "restore mid"
[ "$(cbtq count midt | tail -1)" = "$ROWS" ] || fail "midt has $(cbtq count midt) rows, big $ROWS"
left=$(find "$BKD" -mindepth 2 -maxdepth 2 -name '*.*')
[ -z "$left" ] || fail "dotted piece directories left: $left"
echo "ok: $(ls "$BKD" | tr '\n' ' ')"
echo PASS
