#!/usr/bin/env bash
# stdout_error_test.sh — `strata` commands whose stdout fails to write (a full disk: /dev/full
# answers every write with ENOSPC), on `strata up --clusters 1 --nodes 1`; first `strata changes`:
#   1. a run without --checkpoint exits 1 naming the write error (it used to exit 0, the changes
#      lost);
#   2. a --checkpoint run leaves no checkpoint, and one resumed from a checkpoint leaves it as
#      it was: the next run to a good file prints the changes the failed run lost (the failed
#      run used to write a checkpoint past them, so they were skipped for good);
#   3. a --follow run ends with exit 1 instead of following with its output going nowhere;
#   4. `strata backup list`, `describe` and `strata status` exit 1 (they exited 0, so a script
#      writing `strata backup list --json >FILE` on a full disk took a cut file for the list),
#      while `| head -1` is still a normal end.
# Skips (77) without python3.
# Usage: stdout_error_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
[ -w /dev/full ] || { echo "/dev/full missing: skipped"; exit 77; }
up_single stdout_error
cs_py create cs || fail "creating table cs"
FROM=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)
cs_py write cs a b c || fail "writing rows"
CH=("$STRATA" changes --dir "$DIR" --table cs --quiet)
CK=$TMPD/ck
rows() { python3 -c 'import json,sys; print(" ".join(json.loads(l)["row"] for l in sys.stdin))' <"$1"; }

echo "== 1. stdout on a full disk"
timeout 60 "${CH[@]}" --from "$FROM" --until now >/dev/full 2>"$TMPD/1.err"
rc=$?
[ $rc -eq 1 ] && grep -q "cannot write to stdout" "$TMPD/1.err" ||
  { cat "$TMPD/1.err"; fail "a run whose output failed exited $rc without naming the error"; }

echo "== 2. the checkpoint does not pass what was lost"
timeout 60 "${CH[@]}" --from "$FROM" --until now --checkpoint "$CK" >/dev/full 2>"$TMPD/2.err"
rc=$?
[ $rc -eq 1 ] || { cat "$TMPD/2.err"; fail "a --checkpoint run whose output failed exited $rc"; }
[ ! -e "$CK" ] || fail "a run that printed nothing left a checkpoint: $(cat "$CK")"
timeout 60 "${CH[@]}" --from "$FROM" --until now --checkpoint "$CK" >"$TMPD/2a.out" 2>"$TMPD/2a.err" ||
  { cat "$TMPD/2a.err"; fail "the run to a file failed"; }
[ "$(rows "$TMPD/2a.out")" = "a b c" ] || fail "the run to a file printed $(rows "$TMPD/2a.out")"
cp "$CK" "$TMPD/ck.before"
cs_py write cs d e || fail "writing rows d e"
timeout 60 "${CH[@]}" --until now --checkpoint "$CK" >/dev/full 2>"$TMPD/2b.err"
rc=$?
[ $rc -eq 1 ] || { cat "$TMPD/2b.err"; fail "a resumed run whose output failed exited $rc"; }
cmp -s "$CK" "$TMPD/ck.before" || fail "the failed run moved the checkpoint past d and e"
timeout 60 "${CH[@]}" --until now --checkpoint "$CK" >"$TMPD/2c.out" 2>"$TMPD/2c.err" ||
  { cat "$TMPD/2c.err"; fail "the resumed run to a file failed"; }
[ "$(rows "$TMPD/2c.out")" = "d e" ] || fail "the resumed run printed $(rows "$TMPD/2c.out"), not d e"

echo "== 3. --follow to a full disk ends"
"${CH[@]}" --from "$FROM" --follow --checkpoint "$TMPD/ck3" >/dev/full 2>"$TMPD/3.err" &
F=$!
PIDS+=("$F")
for _ in $(seq 1 300); do kill -0 "$F" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$F" 2>/dev/null; then
  kill "$F"
  fail "strata changes --follow went on following with its output failing"
fi
wait "$F"
rc=$?
[ $rc -eq 1 ] || { cat "$TMPD/3.err"; fail "--follow whose output failed exited $rc"; }
[ ! -e "$TMPD/ck3" ] || fail "--follow whose output failed left a checkpoint"

echo "== 4. backup list, describe and status"
"$STRATA" backup create cs --dir "$DIR" --id b1 --wait --quiet >/dev/null 2>"$TMPD/4.err" ||
  { cat "$TMPD/4.err"; fail "strata backup create"; }
for cmd in "backup list" "backup list --json" "backup describe b1" "status"; do
  # shellcheck disable=SC2086 # cmd holds the subcommand and its flags
  timeout 60 "$STRATA" $cmd --dir "$DIR" >/dev/full 2>"$TMPD/4.err"
  rc=$?
  [ $rc -eq 1 ] && grep -q "cannot write to stdout" "$TMPD/4.err" ||
    { cat "$TMPD/4.err"; fail "strata $cmd to a full disk exited $rc without naming the error"; }
done
timeout 60 "$STRATA" backup list --dir "$DIR" 2>"$TMPD/4.err" | head -1 >/dev/null
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { cat "$TMPD/4.err"; fail "strata backup list | head -1 exited $rc"; }
echo "PASS"
