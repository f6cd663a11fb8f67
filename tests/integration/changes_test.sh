#!/usr/bin/env bash
# changes_test.sh — change streams from the consumer's side, on a real local instance (`strata
# up`: clusters east and west, one node each, and a router), driven by `strata changes` and cbt:
#   1. `strata changes --enable 1d` turns streams on (UpdateTable); rows r01..r05 written
#      through the single-cluster profile oneast come back as JSON lines (type USER, cluster
#      east, the SetCell with its value), each once, from --from to the start of the command;
#   2. --until: changes after it are not printed;
#   3. replication: read through onwest (the second cluster), the same rows carry cluster east;
#   4. --checkpoint: a --follow run killed with kill -9 is resumed from its checkpoint and prints
#      the rows written meanwhile, without starting over (at least once, no gap);
#   5. kill -9 of the node serving the partition under a --follow run: the run retries, and
#      rows written after the node is back (`strata up` restarts it) are printed; SIGTERM ends
#      it with status 0;
#   6. garbage collection: three versions of a cell, `cbt setgcpolicy ... maxversions=1`, then
#      east-0 with 1 MiB memtables and 6 MB of writes (flushes, compactions): a
#      GARBAGE_COLLECTION record for the row, with a delete_column per dropped version whose range
#      is [ts, ts + 1 ms) (a mutation a copy of the table can apply).
#   7. `strata bench --workload changes --cs-compare --rounds 2`: the streams-on and -off writes
#      alternate; both sides wrote, and every live write came out of the stream.
# Every step is bounded (timeouts, polling with a hang guard) and fails with what was expected.
# Usage: changes_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }

instance_init changes_test
BG=()
finish() {
  for p in "${BG[@]}"; do kill -9 "$p" 2>/dev/null; done
  instance_teardown
}
trap finish EXIT
FAIL_TAIL_LINES=20

export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT
C=("$CBT" -project p -instance i)
cbtq() { timeout 60 "${C[@]}" "$@" 2>&1 | grep -v 'creds flag unset'; return "${PIPESTATUS[0]}"; }
# changes ARGS...: `strata changes` on table cs, bounded.
changes() { timeout 120 "$STRATA" changes --dir "$DIR" --table cs --quiet "$@"; }
now() { date -u +%Y-%m-%dT%H:%M:%S.%6NZ; }
# wait_for WHAT COMMAND...: polls (hang guard: 600 x 0.2 s).
wait_for() {
  local what=$1 i
  shift
  for i in $(seq 1 600); do
    if "$@"; then return 0; fi
    sleep 0.2
  done
  fail "gave up waiting for $what"
}
# rows FILE...: the distinct row keys of JSON lines, sorted, space-separated.
rows() { python3 - "$@" <<'EOF'
import json, sys
rows = set()
for f in sys.argv[1:]:
    for line in open(f):
        if line.strip():
            rows.add(json.loads(line).get("row", "<binary>"))
print(" ".join(sorted(rows)))
EOF
}
count() { grep -c . "$1"; }
has_rows() { local f=$1 r; shift; for r in "$@"; do grep -q "\"row\":\"$r\"" "$f" || return 1; done; }
lines_at_least() { [ "$(grep -c . "$1" 2>/dev/null || echo 0)" -ge "$2" ]; }

echo "== strata up --clusters 2 --nodes 1"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 || fail "strata up failed"
cbtq createtable cs "families=cf:maxversions=5" || fail "cbt createtable"
cbtq createappprofile i oneast "east only" route-to=east >/dev/null || fail "createappprofile oneast"
cbtq createappprofile i onwest "west only" route-to=west >/dev/null || fail "createappprofile onwest"

echo "== 1. --enable, then rows r01..r05 as JSON lines"
out=$("$STRATA" changes --dir "$DIR" --table cs --enable 1d 2>&1) ||
  fail "strata changes --enable 1d (UpdateTable change_stream_config through the router): $out"
echo "$out"
T0=$(now)
for i in 01 02 03 04 05; do cbtq set cs "r$i" app-profile=oneast "cf:c=v$i" || fail "set r$i"; done
changes --app-profile oneast --from "$T0" >"$TMPD/1.out" 2>"$TMPD/1.err" ||
  fail "strata changes --from: $(cat "$TMPD/1.err")"
python3 - "$TMPD/1.out" <<'EOF' || fail "JSON lines of step 1 are wrong: $(cat "$TMPD/1.out")"
import json, re, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [l["row"] for l in lines]
assert sorted(rows) == ["r01", "r02", "r03", "r04", "r05"], rows
for l in lines:
    assert l["type"] == "USER" and l["cluster"] == "east", l
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", l["commit_time"]), l
    assert isinstance(l["tiebreaker"], int), l
    m = l["mods"]
    assert len(m) == 1 and m[0]["op"] == "set" and m[0]["family"] == "cf", l
    assert m[0]["qualifier"] == "c" and m[0]["value"] == "v" + l["row"][1:], l
    assert isinstance(m[0]["timestamp"], int), l
EOF
echo "ok: $(count "$TMPD/1.out") changes, rows $(rows "$TMPD/1.out")"

echo "== 2. --until"
T1=$(now)
for i in 06 07; do cbtq set cs "r$i" app-profile=oneast "cf:c=v$i" || fail "set r$i"; done
changes --app-profile oneast --from "$T0" --until "$T1" >"$TMPD/2.out" 2>"$TMPD/2.err" ||
  fail "strata changes --until: $(cat "$TMPD/2.err")"
[ "$(rows "$TMPD/2.out")" = "r01 r02 r03 r04 r05" ] ||
  fail "--until $T1 printed rows $(rows "$TMPD/2.out"), expected r01..r05 only"
echo "ok: rows $(rows "$TMPD/2.out")"

echo "== 3. the second cluster's stream has east's writes"
cbtq waitforreplication cs >/dev/null || fail "waitforreplication"
changes --app-profile onwest --from "$T0" >"$TMPD/3.out" 2>"$TMPD/3.err" ||
  fail "strata changes through onwest: $(cat "$TMPD/3.err")"
[ "$(rows "$TMPD/3.out")" = "r01 r02 r03 r04 r05 r06 r07" ] ||
  fail "west's stream has rows $(rows "$TMPD/3.out"), expected r01..r07"
python3 -c '
import json, sys
for l in open(sys.argv[1]):
    c = json.loads(l)
    assert c["cluster"] == "east", c' "$TMPD/3.out" ||
  fail "west's stream names another source cluster than east: $(cat "$TMPD/3.out")"
echo "ok: west's stream has r01..r07 from cluster east"

echo "== 4. --checkpoint resumes a --follow run killed with kill -9"
CK=$TMPD/ck
"$STRATA" changes --dir "$DIR" --table cs --quiet --app-profile oneast --from "$T0" --follow \
  --checkpoint "$CK" --heartbeat-s 1 >"$TMPD/4a.out" 2>"$TMPD/4a.err" &
CLI=$!
BG+=("$CLI")
wait_for "the --follow run to print r01..r07" lines_at_least "$TMPD/4a.out" 7
wait_for "a checkpoint" test -s "$CK"
snap=$(cat "$CK")
ck_changed() { [ "$(cat "$CK")" != "$snap" ]; }
wait_for "the checkpoint to move past what was printed (a heartbeat's token)" ck_changed
kill -9 "$CLI"
wait "$CLI" 2>/dev/null
for i in 08 09; do cbtq set cs "r$i" app-profile=oneast "cf:c=v$i" || fail "set r$i"; done
changes --app-profile oneast --checkpoint "$CK" >"$TMPD/4b.out" 2>"$TMPD/4b.err" ||
  fail "strata changes --checkpoint (resume): $(cat "$TMPD/4b.err")"
has_rows "$TMPD/4b.out" r08 r09 || fail "the resumed run lacks r08/r09: $(rows "$TMPD/4b.out")"
[ "$(count "$TMPD/4b.out")" -lt 9 ] ||
  fail "the resumed run printed $(count "$TMPD/4b.out") changes: it started over instead of resuming"
[ "$(rows "$TMPD/4a.out" "$TMPD/4b.out")" = "r01 r02 r03 r04 r05 r06 r07 r08 r09" ] ||
  fail "before + after the kill: $(rows "$TMPD/4a.out" "$TMPD/4b.out"), expected r01..r09"
echo "ok: resumed run printed $(rows "$TMPD/4b.out")"

echo "== 5. kill -9 of the node serving the partition under --follow"
"$STRATA" changes --dir "$DIR" --table cs --app-profile oneast --from "$T0" --follow \
  --heartbeat-s 1 >"$TMPD/5.out" 2>"$TMPD/5.err" &
CLI=$!
BG+=("$CLI")
wait_for "the --follow run to print r01..r09" lines_at_least "$TMPD/5.out" 9
pid=$(cat "$DIR/run/east-0.pid")
kill -9 "$pid" || fail "could not kill east-0"
"$STRATA" up --dir "$DIR" >/dev/null 2>&1 || fail "strata up did not restart east-0"
for i in 10 11; do
  ok=0
  for _ in $(seq 1 30); do cbtq set cs "r$i" app-profile=oneast "cf:c=v$i" >/dev/null && { ok=1; break; }; sleep 0.5; done
  [ $ok = 1 ] || fail "set r$i after the restart"
done
has_r10_r11() { has_rows "$TMPD/5.out" r10 r11; }
FAIL_EXTRA_LOGS=("$TMPD/5.err")
wait_for "r10 and r11 in the --follow run after east-0 came back" has_r10_r11
kill -TERM "$CLI"
wait "$CLI"
rc=$?
[ $rc -eq 0 ] || fail "strata changes --follow exited $rc after SIGTERM"
echo "ok: rows $(rows "$TMPD/5.out"); stderr: $(grep -c 'retrying' "$TMPD/5.err") retry line(s)"

echo "== 6. GARBAGE_COLLECTION records after setgcpolicy maxversions=1"
T2=$(now)
for ts in 1000 2000 3000; do cbtq set cs g app-profile=oneast "cf:c=x$ts@$ts" || fail "set g@$ts"; done
cbtq setgcpolicy cs cf maxversions=1 >/dev/null || fail "setgcpolicy"
# GC records come from compactions. A node keeps its memtable across restarts (the commit log is
# replayed), so east-0 is restarted by hand with its own command line plus --memtable-mb 1 (its
# pid file updated, so `strata down` stops it), and 6 MB of bulk writes into family f flush
# several sorted runs: the compactions that follow drop g's old versions.
pid=$(cat "$DIR/run/east-0.pid")
mapfile -d '' -t CMD <"/proc/$pid/cmdline"
kill -TERM "$pid"
for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
"${CMD[@]}" --memtable-mb 1 >>"$DIR/logs/east-0.log" 2>&1 &
BG+=("$!")
echo "$!" >"$DIR/run/east-0.pid"
for _ in $(seq 1 100); do cbtq ls >/dev/null && break; sleep 0.2; done
cbtq createfamily cs f >/dev/null || fail "createfamily f"
timeout 300 "$STRATA" bench --dir "$DIR" --table cs --workload bulkwrite --requests 60 --no-lag \
  --quiet >"$TMPD/6.bench" 2>&1 || fail "bulk writes for the flushes: $(tail -3 "$TMPD/6.bench")"
gc_seen() {
  changes --app-profile oneast --from "$T2" >"$TMPD/6.out" 2>"$TMPD/6.err" || return 1
  grep -q '"type":"GARBAGE_COLLECTION"' "$TMPD/6.out"
}
FAIL_EXTRA_LOGS=("$TMPD/6.out" "$TMPD/6.err")
for i in $(seq 1 60); do gc_seen && break; sleep 1; done
gc_seen || fail "no GARBAGE_COLLECTION record for row g after setgcpolicy maxversions=1 and 6 MB of writes through 1 MiB memtables (no compaction dropped the old versions, or GC records are not written)"
python3 -c '
import json, sys
for l in open(sys.argv[1]):
    c = json.loads(l)
    if c["type"] == "GARBAGE_COLLECTION":
        assert c["row"] == "g" and c["cluster"] == "", c
        assert all(m["op"] == "delete_column" for m in c["mods"]), c
        # each range is one cell and a valid mutation (milliseconds), so a copy can apply it
        assert all(m.get("start_timestamp", 0) % 1000 == 0 and
                   m["end_timestamp"] == m.get("start_timestamp", 0) + 1000 for m in c["mods"]), c' "$TMPD/6.out" ||
  fail "GC records are malformed: $(grep GARBAGE "$TMPD/6.out")"
echo "ok: $(grep -c GARBAGE_COLLECTION "$TMPD/6.out") GC record(s)"

echo "== 7. strata bench --workload changes --cs-compare --rounds 2: on and off alternate"
timeout 300 "$STRATA" bench --dir "$DIR" --table csb --workload changes --cs-profile oneast \
  --duration 2 --rounds 2 --cs-compare --cs-backlog 0 --conns 1 --streams 4 --no-lag --quiet \
  >"$TMPD/7.bench" 2>&1 || fail "bench with alternating phases: $(tail -3 "$TMPD/7.bench")"
kv=$(grep '^strata-bench ' "$TMPD/7.bench")
for want in changes.strata.cs.lost=0 changes.strata.errors=0 rounds=2; do
  echo "$kv" | grep -q " $want " || fail "bench with alternating phases: expected $want in: $kv"
done
python3 -c '
import sys
kv = dict(w.split("=", 1) for w in sys.argv[1].split() if "=" in w)
on, off = int(kv["changes.strata.calls"]), float(kv["changes.strata.cs.off_ops_s"])
assert on > 0 and off > 0 and float(kv["changes.strata.cs.write_cost_ratio"]) > 0, kv
assert int(kv["changes.strata.cs.samples"]) == on, kv' "$kv" ||
  fail "bench with alternating phases: a side wrote nothing or changes went missing: $kv"
echo "ok: $(grep -E '^writes:' "$TMPD/7.bench")"
echo "PASS"
