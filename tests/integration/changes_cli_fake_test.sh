#!/usr/bin/env bash
# changes_cli_fake_test.sh — the consumer side of change streams against changes_fake_server (an
# in-memory endpoint whose streams end UNAVAILABLE after every 50 records, like a node going
# away), so `strata changes` and `strata bench --workload changes` are tested apart from the
# real node and router:
#   1. bench: 300 backlog changes all caught up, 400 live writes all seen (lost=0), the failed
#      stream calls counted under UNAVAILABLE (so the run reports errors), a write cost ratio;
#   2. strata changes from an hour ago: the 700 changes, each exactly once, despite the drops;
#   3. --until: only the changes before it;
#   4. --follow --checkpoint killed with kill -9, 50 more writes, resumed from the checkpoint:
#      the 50 new changes, not a restart from the beginning; SIGTERM ends --follow with 0;
#   5. a table without streams: exit 1 with what to do (`strata changes --enable 1d`, not the
#      UpdateTable field it used to name);
#   6. --until at the epoch (1970-01-01T00:00:00Z) with --follow, or with a checkpoint: refused
#      (it used to be taken for no --until at all: --follow then ran forever);
#   7. --enable 8d: exit 2 in the CLI's words (the router's named change_stream_config);
#   8. appending (>>) to a file a killed run left in the middle of a line: the first change
#      printed starts a line of its own (it used to be glued to the fragment: no JSON).
# Usage: changes_cli_fake_test.sh PATH/TO/strata PATH/TO/changes_fake_server
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
FAKE=$2
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
tmp=$(make_tmp)
bad() { echo "FAIL: $*" >&2; exit 1; }

"$FAKE" --drop-every 50 >"$tmp/fake.log" 2>&1 &
PIDS+=("$!")
ADDR=$(wait_line "$tmp/fake.log" '127\.0\.0\.1:[0-9]+') || bad "the fake server did not start"
TABLE=projects/strata/instances/bench/tables/bench-cs
CH=(timeout 120 "$STRATA" changes --endpoint "$ADDR" --table "$TABLE" --quiet)
count() { grep -c . "$1"; }
distinct() { python3 -c '
import json, sys
print(len({json.loads(l)["row"] for l in open(sys.argv[1]) if l.strip()}))' "$1"; }

echo "== 1. strata bench --workload changes"
T0=$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)
timeout 120 "$STRATA" bench --target "$ADDR" --workload changes --cs-backlog 300 --requests 400 \
  --cs-profile p1 --cs-compare --conns 2 --streams 4 --value-size 100 --quiet >"$tmp/bench.out" 2>&1
rc=$?
kv=$(grep '^strata-bench ' "$tmp/bench.out")
[ -n "$kv" ] || { cat "$tmp/bench.out"; bad "no key=value line (exit $rc)"; }
for want in changes.target.cs.lost=0 changes.target.cs.backlog=300 \
            changes.target.cs.backlog_received=300 changes.target.calls=400; do
  echo "$kv" | grep -q " $want " || { cat "$tmp/bench.out"; bad "bench: expected $want"; }
done
echo "$kv" | grep -q ' changes.target.cs.write_cost_ratio=' || bad "bench: no write cost ratio"
echo "$kv" | grep -q ' changes.target.err.UNAVAILABLE=' ||
  bad "bench: the dropped streams were not counted as failed calls"
[ $rc -eq 1 ] || bad "bench exited $rc with failed stream calls (expected 1)"
grep -q '^change stream (target): ' "$tmp/bench.out" || bad "bench: no change stream summary"
echo "ok: $(grep -E '^(change stream|backlog|writes):' "$tmp/bench.out" | tr '\n' ' ')"

echo "== 2. strata changes --from -1h: every change once, across the drops"
"${CH[@]}" --from -1h >"$tmp/2.out" 2>"$tmp/2.err" || bad "strata changes: $(cat "$tmp/2.err")"
[ "$(count "$tmp/2.out")" -eq 700 ] || bad "printed $(count "$tmp/2.out") changes, expected 700"
[ "$(distinct "$tmp/2.out")" -eq 700 ] || bad "$(distinct "$tmp/2.out") distinct rows, expected 700"
python3 -c '
import json, sys
for l in open(sys.argv[1]):
    c = json.loads(l)
    assert c["type"] == "USER" and c["cluster"] == "fake", c
    m = c["mods"][0]
    assert m["op"] == "set" and m["family"] == "f" and m["qualifier"] == "q", c
    assert "value_b64" in m and len(m["value_b64"]) == 136, c  # 100 random bytes' "$tmp/2.out" ||
  bad "malformed JSON lines: $(head -2 "$tmp/2.out")"
echo "ok: 700 changes, each once"

echo "== 3. --until"
"${CH[@]}" --from -1h --until "$T0" >"$tmp/3.out" 2>"$tmp/3.err" || bad "--until: $(cat "$tmp/3.err")"
[ "$(count "$tmp/3.out")" -eq 0 ] || bad "--until before the writes printed $(count "$tmp/3.out")"
echo "ok"

echo "== 4. --follow --checkpoint, kill -9, resume"
CK=$tmp/ck
timeout 300 "$STRATA" changes --endpoint "$ADDR" --table "$TABLE" --quiet --from -1h --follow \
  --checkpoint "$CK" >"$tmp/4a.out" 2>"$tmp/4a.err" &
CLI=$!
PIDS+=("$CLI")
for _ in $(seq 1 600); do [ "$(count "$tmp/4a.out")" -ge 700 ] && [ -s "$CK" ] && break; sleep 0.1; done
[ "$(count "$tmp/4a.out")" -ge 700 ] || bad "--follow printed $(count "$tmp/4a.out") of 700"
snap=$(cat "$CK")
for _ in $(seq 1 600); do [ "$(cat "$CK")" != "$snap" ] && break; sleep 0.1; done
[ "$(cat "$CK")" != "$snap" ] || bad "the checkpoint never moved"
# $CLI is timeout's pid: its child, the strata process, is the one to kill -9 (killing only
# timeout would leave it following the stream after the test).
kill -9 $(pgrep -P "$CLI") "$CLI" 2>/dev/null
wait "$CLI" 2>/dev/null
timeout 120 "$STRATA" bench --target "$ADDR" --workload changes --cs-backlog 50 --requests 1 \
  --cs-profile p1 --quiet >"$tmp/bench2.out" 2>&1
"${CH[@]}" --checkpoint "$CK" >"$tmp/4b.out" 2>"$tmp/4b.err" || bad "resume: $(cat "$tmp/4b.err")"
n=$(count "$tmp/4b.out")
[ "$n" -ge 51 ] && [ "$n" -lt 700 ] ||
  bad "the resumed run printed $n changes: expected the 51 new ones (and no restart from the beginning)"
echo "ok: the resumed run printed $n changes"
timeout 60 "$STRATA" changes --endpoint "$ADDR" --table "$TABLE" --quiet --follow \
  --checkpoint "$tmp/ck2" >"$tmp/4c.out" 2>&1 &
CLI=$!
for _ in $(seq 1 600); do [ -s "$tmp/ck2" ] && break; sleep 0.1; done # running: it checkpointed
kill -TERM "$CLI"
wait "$CLI"
rc=$?
[ $rc -eq 0 ] || bad "--follow exited $rc after SIGTERM: $(cat "$tmp/4c.out")"
echo "ok: SIGTERM ends --follow with 0"

echo "== 5. a table without change streams"
timeout 60 "$STRATA" changes --endpoint "$ADDR" --table projects/strata/instances/bench/tables/off \
  --from -1h >"$tmp/5.out" 2>&1
rc=$?
[ $rc -eq 1 ] || bad "streams off: exit $rc, expected 1"
grep -q 'turn change streams on for the table: `strata changes --table TABLE --enable 1d`' "$tmp/5.out" ||
  bad "streams off: no hint naming --enable: $(cat "$tmp/5.out")"
echo "ok: $(tail -1 "$tmp/5.out")"

echo "== 6. --until at the epoch"
for extra in --follow "--checkpoint $CK"; do
  # shellcheck disable=SC2086 # two words on purpose
  timeout 10 "$STRATA" changes --endpoint "$ADDR" --table "$TABLE" --quiet $extra \
    --until 1970-01-01T00:00:00Z >"$tmp/6.out" 2>"$tmp/6.err"
  rc=$?
  [ $rc -eq 2 ] && grep -q -- "--until" "$tmp/6.err" ||
    bad "--until at the epoch with $extra: exit $rc, $(count "$tmp/6.out") changes: $(cat "$tmp/6.err")"
done
echo "ok: $(cat "$tmp/6.err")"

echo "== 7. --enable out of range"
timeout 10 "$STRATA" changes --endpoint "$ADDR" --table "$TABLE" --enable 8d >"$tmp/7.out" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q -- "--enable 8d: change streams keep 1d to 7d of changes" "$tmp/7.out" &&
  ! grep -q change_stream_config "$tmp/7.out" ||
  bad "--enable 8d: exit $rc, not the CLI's words: $(cat "$tmp/7.out")"
echo "ok: $(cat "$tmp/7.out")"

echo "== 8. appending after a cut line"
printf '{"row":"cut in the mid' >"$tmp/8.out"
"${CH[@]}" --from -1h >>"$tmp/8.out" 2>"$tmp/8.err" || bad "append: $(cat "$tmp/8.err")"
python3 -c '
import json, sys
lines = open(sys.argv[1]).read().split("\n")
assert lines[0] == "{\"row\":\"cut in the mid", lines[0][:80]
assert lines[-1] == "", "no newline at the end"
for l in lines[1:-1]:
    json.loads(l)
print(len(lines) - 2)' "$tmp/8.out" >"$tmp/8.n" || bad "appended changes not on lines of their own: $(head -c 300 "$tmp/8.out")"
[ "$(cat "$tmp/8.n")" -ge 700 ] || bad "appended $(cat "$tmp/8.n") changes, expected at least 700"
echo "ok: the fragment ended, $(cat "$tmp/8.n") whole changes after it"
echo "PASS"
