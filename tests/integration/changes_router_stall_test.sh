#!/usr/bin/env bash
# changes_router_stall_test.sh — `strata changes` while the router does not answer, on `strata up
# --clusters 1 --nodes 1` with the bound shortened (STRATA_CHANGES_STALL_S=3, for tests; 60 s
# otherwise) and heartbeats every second:
#   1. one-shot (no --follow) with the router hung (SIGSTOP): exit 1 within seconds, naming the
#      router's address and what to do (strata status, strata restart router, run again), from
#      the start and after a checkpoint (then: run again, it resumes from it); it used to retry
#      every 5 s forever, and a router hung mid-run left it waiting without a word;
#   2. one-shot against an address where nothing listens: exit 1, "the router is not running",
#      advice about that address (--endpoint), with or without --dir; --heartbeat-s outside
#      1..3600 is refused naming the range;
#   3. --follow with the router hung, then continued: says once that the router does not answer,
#      keeps going, says it answers again and prints a change written after; SIGTERM ends it 0;
#   4. a healthy one-shot run with the short bound: every change, exit 0 (the bound never ends a
#      stream that makes progress), also when the command itself was stopped past the bound.
# Skips (77) without python3.
# Usage: changes_router_stall_test.sh PATH/TO/strata
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
up_single changes_router_stall
RPID=$(cat "$DIR/run/router.pid")
cont() { kill -CONT "$RPID" 2>/dev/null; }
trap 'cont; instance_teardown' EXIT
cs_py create cs || fail "creating table cs"
FROM=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)
cs_py write cs a m z || fail "writing rows"
export STRATA_CHANGES_STALL_S=3
CH=("$STRATA" changes --dir "$DIR" --table cs --heartbeat-s 1)

echo "== 1. one-shot, router hung"
kill -STOP "$RPID"
t0=$(date +%s)
timeout 60 "${CH[@]}" --from "$FROM" --checkpoint "$TMPD/ck" >"$TMPD/a.out" 2>"$TMPD/a.err"
rc=$?
dt=$(($(date +%s) - t0))
cont
[ $rc -eq 1 ] && [ $dt -lt 30 ] ||
  { cat "$TMPD/a.err"; fail "one-shot with the router hung: exit $rc after $dt s (1 within 30 s wanted)"; }
grep -q "no answer from the router at 127.0.0.1:$PORT for [0-9]* s" "$TMPD/a.err" &&
  grep -q "strata status --dir $DIR" "$TMPD/a.err" && grep -q "strata restart router --dir $DIR" "$TMPD/a.err" &&
  grep -q "run this command again" "$TMPD/a.err" ||
  { cat "$TMPD/a.err"; fail "the give-up message does not name the router and what to do"; }

# Hung in the middle of a run (an --until ahead keeps it reading), after a checkpoint.
timeout 90 "${CH[@]}" --from "$FROM" --until +60s --checkpoint "$TMPD/ck" >"$TMPD/e.out" 2>"$TMPD/e.err" &
EPID=$!
PIDS+=("$EPID")
for _ in $(seq 100); do [ -s "$TMPD/ck" ] && break; sleep 0.1; done
[ -s "$TMPD/ck" ] || { cat "$TMPD/e.err"; fail "the one-shot run wrote no checkpoint"; }
kill -STOP "$RPID"
t0=$(date +%s)
wait "$EPID"
rc=$?
dt=$(($(date +%s) - t0))
cont
[ $rc -eq 1 ] && [ $dt -lt 30 ] && grep -q "run this command again: it resumes from $TMPD/ck" "$TMPD/e.err" ||
  { cat "$TMPD/e.err"; fail "one-shot hung mid-run: exit $rc after $dt s, or no resume advice"; }

echo "== 2. one-shot, nothing listening"
NOPORT=$(free_port)
timeout 60 "$STRATA" changes --endpoint "127.0.0.1:$NOPORT" --table cs --from -1m >"$TMPD/b.out" 2>"$TMPD/b.err"
rc=$?
[ $rc -eq 1 ] && grep -q "no answer from the router at 127.0.0.1:$NOPORT" "$TMPD/b.err" &&
  grep -q "the router is not running" "$TMPD/b.err" ||
  { cat "$TMPD/b.err"; fail "one-shot against a closed port: exit $rc, or no clear message"; }
# --endpoint names the router: the advice is about that address, never a literal DIR command
# nor the --dir instance (whose router answers elsewhere).
timeout 60 "$STRATA" changes --endpoint "127.0.0.1:$NOPORT" --dir "$DIR" --table cs --from -1m \
  >"$TMPD/b2.out" 2>"$TMPD/b2.err"
for f in b b2; do
  grep -q "check that a router listens at 127.0.0.1:$NOPORT (--endpoint)" "$TMPD/$f.err" &&
    ! grep -q "strata status --dir $DIR" "$TMPD/$f.err" ||
    { cat "$TMPD/$f.err"; fail "the advice for --endpoint $NOPORT ($f) is not about that router"; }
done
for hb in 0 3601 1.5 abc; do
  "$STRATA" changes --dir "$DIR" --table cs --heartbeat-s "$hb" >/dev/null 2>"$TMPD/hb.err"
  rc=$?
  [ $rc -eq 2 ] && grep -q -- "--heartbeat-s $hb: give whole seconds from 1 to 3600" "$TMPD/hb.err" ||
    { cat "$TMPD/hb.err"; fail "--heartbeat-s $hb: exit $rc, or the range is not named"; }
done

echo "== 3. --follow, router hung then continued"
"${CH[@]}" --from "$FROM" --follow >"$TMPD/c.out" 2>"$TMPD/c.err" &
FPID=$!
PIDS+=("$FPID")
for _ in $(seq 100); do [ "$(grep -c '"row"' "$TMPD/c.out")" -ge 3 ] && break; sleep 0.1; done
[ "$(grep -c '"row"' "$TMPD/c.out")" -eq 3 ] || fail "--follow did not read the 3 changes"
kill -STOP "$RPID"
for _ in $(seq 200); do grep -q "no answer from the router" "$TMPD/c.err" && break; sleep 0.1; done
cont
grep -q "no answer from the router at 127.0.0.1:$PORT .*Still retrying" "$TMPD/c.err" ||
  { cat "$TMPD/c.err"; fail "--follow did not say the router does not answer"; }
kill -0 "$FPID" 2>/dev/null || { cat "$TMPD/c.err"; fail "--follow ended while the router hung"; }
for _ in $(seq 200); do grep -q "answers again" "$TMPD/c.err" && break; sleep 0.1; done
grep -q "the router at 127.0.0.1:$PORT answers again" "$TMPD/c.err" ||
  { cat "$TMPD/c.err"; fail "--follow did not say the router answers again"; }
cs_py write cs b || fail "writing row b"
for _ in $(seq 200); do grep -q '"row":"b"' "$TMPD/c.out" && break; sleep 0.1; done
grep -q '"row":"b"' "$TMPD/c.out" || { cat "$TMPD/c.err"; fail "--follow missed the change after"; }
[ "$(grep -c "no answer from the router" "$TMPD/c.err")" -eq 1 ] ||
  { cat "$TMPD/c.err"; fail "--follow said the stall more than once"; }
kill -TERM "$FPID"
wait "$FPID"
rc=$?
[ $rc -eq 0 ] || { cat "$TMPD/c.err"; fail "--follow ended with $rc on SIGTERM"; }

echo "== 4. a healthy one-shot run"
timeout 60 "${CH[@]}" --from "$FROM" >"$TMPD/d.out" 2>"$TMPD/d.err" ||
  { cat "$TMPD/d.err"; fail "a healthy one-shot run failed"; }
[ "$(grep -c '"row"' "$TMPD/d.out")" -eq 4 ] || { cat "$TMPD/d.out"; fail "not the 4 changes"; }
# The command itself stopped (Ctrl-Z) for longer than the bound: its own silence is no stall.
"${CH[@]}" --from "$FROM" --until +12s >"$TMPD/f.out" 2>"$TMPD/f.err" &
GPID=$!
PIDS+=("$GPID")
sleep 1
kill -STOP "$GPID"
sleep 6
kill -CONT "$GPID"
wait "$GPID" || { cat "$TMPD/f.err"; fail "a run stopped and continued failed"; }
[ "$(grep -c '"row"' "$TMPD/f.out")" -eq 4 ] || { cat "$TMPD/f.out"; fail "not the 4 changes after a stop"; }
echo "PASS"
