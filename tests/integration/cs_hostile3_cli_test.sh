#!/usr/bin/env bash
# cs_hostile3_cli_test.sh — `strata changes` against hostile checkpoints, pipes and times, on
# `strata up --clusters 1 --nodes 1` (one table with change streams on and a few rows):
#   1. two commands with the same --checkpoint: the second is refused at once (it used to run,
#      both rewriting FILE.tmp, until one failed with "No such file or directory (disk full?)"
#      or renamed the other's half-written file), and runs once the first has exited;
#   2. a checkpoint that leaves rows out (a line removed) or names a partition twice: refused
#      (the first used to exit 0 having read nothing, the rows outside its partitions never read;
#      the second printed every change twice); a directory as --checkpoint: refused as such;
#   3. `--follow | head -1` on a table with no new changes: the command ends once head has
#      exited (it used to run forever, noticing the closed pipe only at the next change);
#   4. --from in the future: refused as such (it used to say that an end_time it made up was
#      before the start_time);
#   5. a checkpoint from before streams were turned off and on: the error says the checkpoint is
#      older than the table's history (it used to say it did not match the table's partitions);
#   6. stdout closed (>&-): refused before anything is opened (the checkpoint's lock file, or
#      the router connection, would otherwise take descriptor 1 and receive the changes);
#   7. a --from the server refuses (before the table's history) leaves no checkpoint, also when
#      the refusal comes after seconds of retries (the node killed with kill -9, then restarted):
#      it used to leave one holding that start, so every later run resumed from it and failed
#      alike, whatever --from said; a checkpoint whose start is refused is named as the cause; --until before
#      --from with a --checkpoint that does not exist yet is refused at once (it was sent);
#   8. --enable with --disable: refused (streams used to be turned on, --disable ignored);
#   9. an empty --checkpoint: refused (exit 2) before anything is locked or read;
#  10. a stale FILE.tmp that is a symbolic link (to a file kept as it is) or a FIFO (no hang): the
#      checkpoint is written as a new file;
#  11. streams turned off and on again under --follow: exit 1 advising to start over with --from
#      (it advised turning streams on, which they were).
# Skips (77) without python3.
# Usage: cs_hostile3_cli_test.sh PATH/TO/strata
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
up_single cs_hostile3_cli
cs_py create cs || fail "creating table cs"
FROM=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)
cs_py write cs a m z || fail "writing rows"
CH=("$STRATA" changes --dir "$DIR" --table cs --quiet)
CK=$TMPD/ck

echo "== 1. two commands, one checkpoint"
"${CH[@]}" --from "$FROM" --follow --checkpoint "$CK" >"$TMPD/a.out" 2>"$TMPD/a.err" &
A=$!
PIDS+=("$A")
for _ in $(seq 1 300); do [ -s "$CK" ] && break; sleep 0.1; done
[ -s "$CK" ] || { cat "$TMPD/a.err"; fail "the first command wrote no checkpoint"; }
timeout 20 "${CH[@]}" --follow --checkpoint "$CK" >"$TMPD/b.out" 2>"$TMPD/b.err"
rc=$?
[ $rc -eq 1 ] && grep -q "in use by another strata changes" "$TMPD/b.err" ||
  { cat "$TMPD/b.err"; fail "a second command on the same checkpoint was not refused (exit $rc)"; }
kill -INT "$A"
wait "$A" || { cat "$TMPD/a.err"; fail "the first command did not end cleanly on SIGINT"; }
[ "$(wc -l <"$TMPD/a.out")" -eq 3 ] || fail "the first command printed $(wc -l <"$TMPD/a.out") changes, not 3"
timeout 30 "${CH[@]}" --checkpoint "$CK" --until now >"$TMPD/b.out" 2>"$TMPD/b.err" ||
  { cat "$TMPD/b.err"; fail "the checkpoint was not usable once the first command ended"; }

echo "== 2. checkpoints with a gap, an overlap, a directory"
head -1 "$CK" >"$TMPD/gap"
sed -n 2p "$CK" | sed 's/^t - /t 6d /' >>"$TMPD/gap" # the partition [m, end) only
cp "$TMPD/gap" "$TMPD/ckgap"
timeout 30 "${CH[@]}" --checkpoint "$TMPD/ckgap" --until now >"$TMPD/c.out" 2>"$TMPD/c.err"
rc=$?
[ $rc -eq 1 ] && grep -q "does not cover the table's rows exactly once" "$TMPD/c.err" ||
  { cat "$TMPD/c.err"; fail "a checkpoint without the rows before m was used (exit $rc)"; }
(cat "$CK" && sed -n 2p "$CK") >"$TMPD/ckdup"
timeout 30 "${CH[@]}" --checkpoint "$TMPD/ckdup" --until now >"$TMPD/c.out" 2>"$TMPD/c.err"
rc=$?
[ $rc -eq 1 ] && grep -q "overlap" "$TMPD/c.err" ||
  { cat "$TMPD/c.err"; fail "a checkpoint naming the table twice was used (exit $rc)"; }
mkdir "$TMPD/ckdir"
timeout 30 "${CH[@]}" --checkpoint "$TMPD/ckdir" --until now >"$TMPD/c.out" 2>"$TMPD/c.err"
rc=$?
[ $rc -eq 1 ] && grep -q "not a regular file" "$TMPD/c.err" ||
  { cat "$TMPD/c.err"; fail "a directory as --checkpoint was not refused as such (exit $rc)"; }

echo "== 3. --follow | head -1 with no new changes"
timeout 60 "${CH[@]}" --from "$FROM" --follow 2>"$TMPD/d.err" | head -1 >"$TMPD/d.out"
rc=${PIPESTATUS[0]}
[ $rc -eq 0 ] || { cat "$TMPD/d.err"; fail "strata changes --follow | head -1 did not end (exit $rc)"; }
grep -q '"row":"a"' "$TMPD/d.out" || fail "head -1 did not get the first change: $(cat "$TMPD/d.out")"

echo "== 4. --from in the future"
"${CH[@]}" --from +1h >"$TMPD/e.out" 2>"$TMPD/e.err"
rc=$?
[ $rc -eq 2 ] && grep -q "is in the future" "$TMPD/e.err" ||
  { cat "$TMPD/e.err"; fail "--from +1h was not refused as a time in the future (exit $rc)"; }
echo "== 5. a checkpoint older than the table's history (streams turned off and on)"
"$STRATA" changes --dir "$DIR" --table cs --disable >/dev/null || fail "--disable"
"$STRATA" changes --dir "$DIR" --table cs --enable 1d >/dev/null || fail "--enable 1d"
timeout 30 "${CH[@]}" --checkpoint "$CK" --until now >"$TMPD/f.out" 2>"$TMPD/f.err"
rc=$?
[ $rc -eq 1 ] && grep -q "older than the table's history" "$TMPD/f.err" ||
  { cat "$TMPD/f.err"; fail "a checkpoint from before streams were turned on again was not explained (exit $rc)"; }
echo "== 6. stdout closed"
rm -f "$TMPD/ckc" "$TMPD/ckc.lock"
timeout 30 "${CH[@]}" --from "$FROM" --checkpoint "$TMPD/ckc" >&- 2>"$TMPD/g.err"
rc=$?
[ $rc -eq 2 ] && grep -q "stdout is closed" "$TMPD/g.err" && [ ! -e "$TMPD/ckc" ] ||
  { cat "$TMPD/g.err"; fail "strata changes with stdout closed was not refused (exit $rc)"; }
echo "== 7. a start the server refuses leaves no checkpoint; --until before --from"
# Streams were turned on again in 5, so an hour ago is before the table's history.
timeout 30 "${CH[@]}" --from -1h --checkpoint "$TMPD/ckr" >"$TMPD/h.out" 2>"$TMPD/h.err"
rc=$?
[ $rc -eq 1 ] && grep -q "the oldest change" "$TMPD/h.err" ||
  { cat "$TMPD/h.err"; fail "--from an hour ago, before the history, was not refused (exit $rc)"; }
# It used to write that start to the checkpoint, so the corrected --from below was ignored and
# every later run failed the same way.
[ ! -e "$TMPD/ckr" ] || fail "the refused run left a checkpoint: $(cat "$TMPD/ckr")"
FROM2=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)
cs_py write cs a m z || fail "writing rows after streams were turned on again"
# The same while the node is down: the command retries (UNAVAILABLE) for seconds before the
# refusal, and its periodic checkpoint (every second) used to write the start meanwhile.
kill -9 "$(cat "$DIR/run/east-0.pid")"
"$STRATA" changes --dir "$DIR" --table cs --from -1h --checkpoint "$TMPD/ckr" >"$TMPD/h.out" \
  2>"$TMPD/h.err" &
C=$!
PIDS+=("$C")
# Five retries: at least 0.1 + 0.2 + 0.4 + 0.8 s of backoff, past the first periodic checkpoint.
until [ "$(grep -c 'retrying' "$TMPD/h.err")" -ge 5 ]; do
  kill -0 "$C" 2>/dev/null || { cat "$TMPD/h.err"; fail "the command ended while the node was down"; }
  sleep 0.1
done
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >"$TMPD/up2.out" 2>&1 ||
  { cat "$TMPD/up2.out"; fail "strata up after kill -9"; }
wait "$C"
rc=$?
[ $rc -eq 1 ] && grep -q "the oldest change" "$TMPD/h.err" ||
  { cat "$TMPD/h.err"; fail "--from an hour ago was not refused once the node was back (exit $rc)"; }
[ ! -e "$TMPD/ckr" ] || fail "the run refused after retries left a checkpoint: $(cat "$TMPD/ckr")"
timeout 30 "${CH[@]}" --from "$FROM2" --checkpoint "$TMPD/ckr" >"$TMPD/h.out" 2>"$TMPD/h.err" &&
  [ "$(wc -l <"$TMPD/h.out")" -eq 3 ] ||
  { cat "$TMPD/h.err"; fail "the corrected --from did not read the 3 changes: $(cat "$TMPD/h.out")"; }
[ -s "$TMPD/ckr" ] || fail "the run that read wrote no checkpoint"
# A checkpoint whose start the server refuses names itself as the cause (--from is ignored).
(head -1 "$TMPD/ckr" && echo "s - - 1") >"$TMPD/ckold"
timeout 30 "${CH[@]}" --from "$FROM2" --checkpoint "$TMPD/ckold" >"$TMPD/h.out" 2>"$TMPD/h.err"
rc=$?
[ $rc -eq 1 ] && grep -q "the start came from the checkpoint" "$TMPD/h.err" ||
  { cat "$TMPD/h.err"; fail "a refused start from a checkpoint did not name the checkpoint (exit $rc)"; }
timeout 30 "${CH[@]}" --from -1m --until -2m --checkpoint "$TMPD/ckn" >"$TMPD/h.out" 2>"$TMPD/h.err"
rc=$?
# It used to be sent (the check was skipped with any --checkpoint), refused by the server, and
# its start kept in the new checkpoint.
[ $rc -eq 2 ] && grep -q -- "--until must be after --from" "$TMPD/h.err" && [ ! -e "$TMPD/ckn" ] ||
  { cat "$TMPD/h.err"; fail "--until before --from with a new --checkpoint was not refused (exit $rc)"; }
echo "== 8. --enable and --disable together"
"$STRATA" changes --dir "$DIR" --table cs --enable 1d --disable >"$TMPD/i.out" 2>"$TMPD/i.err"
rc=$?
# It used to turn streams on and ignore --disable.
[ $rc -eq 2 ] && grep -q "contradict" "$TMPD/i.err" ||
  { cat "$TMPD/i.err"; fail "--enable 1d --disable was not refused (exit $rc)"; }
echo "== 9. an empty --checkpoint"
ABS=$(cd "$(dirname "$STRATA")" && pwd)/$(basename "$STRATA")
(cd "$TMPD" && timeout 30 "$ABS" "${CH[@]:1}" --from "$FROM" --checkpoint "" >"$TMPD/j.out" 2>"$TMPD/j.err")
rc=$?
# It used to lock .lock in the working directory, read the stream, then fail to write "".
[ $rc -eq 2 ] && [ ! -e "$TMPD/.lock" ] ||
  { cat "$TMPD/j.err"; fail "--checkpoint '' was not refused (exit $rc)"; }
echo "== 10. a stale FILE.tmp that is a symbolic link or a FIFO"
echo precious >"$TMPD/victim"
ln -s "$TMPD/victim" "$TMPD/ckl.tmp"
timeout 30 "${CH[@]}" --from "$FROM2" --until now --checkpoint "$TMPD/ckl" >"$TMPD/k.out" 2>"$TMPD/k.err" ||
  { cat "$TMPD/k.err"; fail "a run with a symbolic link as FILE.tmp failed"; }
# It used to write the checkpoint through the link, over the file it points to.
[ "$(cat "$TMPD/victim")" = precious ] || fail "the checkpoint overwrote the file FILE.tmp links to"
grep -q strata-changes-checkpoint "$TMPD/ckl" || fail "no checkpoint written: $(cat "$TMPD/ckl")"
mkfifo "$TMPD/ckf.tmp"
timeout 30 "${CH[@]}" --from "$FROM2" --until now --checkpoint "$TMPD/ckf" >"$TMPD/k.out" 2>"$TMPD/k.err"
rc=$?
# It used to wait for a reader of the FIFO forever.
[ $rc -eq 0 ] && grep -q strata-changes-checkpoint "$TMPD/ckf" ||
  { cat "$TMPD/k.err"; fail "a run with a FIFO as FILE.tmp exited $rc without a checkpoint"; }
echo "== 11. streams turned off and on again under --follow"
timeout 60 "${CH[@]}" --follow --from now >"$TMPD/l.out" 2>"$TMPD/l.err" &
FOL=$!
sleep 2
"$STRATA" changes --dir "$DIR" --table cs --disable >/dev/null || fail "--disable under --follow"
"$STRATA" changes --dir "$DIR" --table cs --enable 1d >/dev/null || fail "--enable under --follow"
wait $FOL
rc=$?
# It used to advise turning streams on, which they were.
[ $rc -eq 1 ] && grep -q "start over with --from" "$TMPD/l.err" &&
  ! grep -q "turn change streams on for the table" "$TMPD/l.err" ||
  { cat "$TMPD/l.err"; fail "--follow across streams off and on again: exit $rc, advice above"; }
echo "PASS"
