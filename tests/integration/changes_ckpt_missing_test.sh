#!/usr/bin/env bash
# changes_ckpt_missing_test.sh — `strata changes --checkpoint FILE` when FILE does not exist (a
# first run, a lost file), on `strata up --clusters 1 --nodes 1` with three rows written:
#   1. without --from or --follow (the cron line of a consumer): refused (exit 2) naming FILE and
#      --from, and no FILE written; it used to start at now without a word (exit 0, no record)
#      and write FILE there, so the three changes were never delivered;
#   2. with --follow alone: starts at now and says so on stderr (what is not read, and --from);
#   3. with --from: the three changes, FILE written; the next run without --from resumes from it.
# Skips (77) without python3.
# Usage: changes_ckpt_missing_test.sh PATH/TO/strata
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
up_single changes_ckpt_missing
cs_py create cs || fail "creating table cs"
FROM=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)
cs_py write cs a m z || fail "writing rows"
CH=("$STRATA" changes --dir "$DIR" --table cs)
CK=$TMPD/ck

echo "== 1. a missing checkpoint without --from or --follow"
timeout 60 "${CH[@]}" --checkpoint "$CK" >"$TMPD/a.out" 2>"$TMPD/a.err"
rc=$?
[ $rc -eq 2 ] && grep -q "checkpoint $CK does not exist" "$TMPD/a.err" &&
  grep -q -- "--from TIME" "$TMPD/a.err" ||
  { cat "$TMPD/a.err"; fail "a missing checkpoint without --from was not refused (exit $rc)"; }
[ ! -e "$CK" ] || fail "the refused run wrote the checkpoint: $(cat "$CK")"
[ ! -s "$TMPD/a.out" ] || fail "the refused run printed changes: $(cat "$TMPD/a.out")"

echo "== 2. a missing checkpoint with --follow alone"
timeout 60 "${CH[@]}" --follow --until +2s --checkpoint "$TMPD/ckf" >"$TMPD/b.out" 2>"$TMPD/b.err"
rc=$?
[ $rc -eq 0 ] && grep -q "checkpoint $TMPD/ckf does not exist: starting at now; changes before now are not read" \
  "$TMPD/b.err" && grep -q -- "--from TIME" "$TMPD/b.err" ||
  { cat "$TMPD/b.err"; fail "--follow from a missing checkpoint did not say it starts at now (exit $rc)"; }

echo "== 3. a missing checkpoint with --from, then resumed"
timeout 60 "${CH[@]}" --from "$FROM" --checkpoint "$CK" >"$TMPD/c.out" 2>"$TMPD/c.err" ||
  { cat "$TMPD/c.err"; fail "--from with a missing checkpoint failed"; }
n=$(grep -c '"row"' "$TMPD/c.out")
[ "$n" -eq 3 ] || { cat "$TMPD/c.out"; fail "--from read $n changes, not 3"; }
grep -q strata-changes-checkpoint "$CK" || fail "no checkpoint written"
cs_py write cs b || fail "writing row b"
timeout 60 "${CH[@]}" --checkpoint "$CK" >"$TMPD/d.out" 2>"$TMPD/d.err" ||
  { cat "$TMPD/d.err"; fail "the run resumed from the checkpoint failed"; }
grep -q '"row":"b"' "$TMPD/d.out" && [ "$(grep -c '"row"' "$TMPD/d.out")" -eq 1 ] ||
  { cat "$TMPD/d.out"; fail "the resumed run did not read just the new change"; }
echo "PASS"
