#!/usr/bin/env bash
# cs_repl_delete_test.sh — a replicated delete that reaches a cluster after a newer write of its
# row is recorded with what it did there: applying each cluster's stream in order gives that
# cluster's table. `strata up --clusters 2 --nodes 1`, the links cut (`strata chaos partition`);
# east (the default profile's cluster, where DropRowRange goes too) deletes three rows
# (DropRowRange, DeleteFromRow, DeleteFromColumn), then west writes the same rows (newer commit times); after
# `strata chaos heal` west applies east's deletes, which cover only the older cells. The records
# of both clusters (`strata changes`) applied in order to a model must give the table read
# through that cluster's profile, and the table must hold west's newer cells. Before, west's
# records said "set the new cell, then delete the row": a consumer of west ended without the
# cells the table keeps. Usage: cs_repl_delete_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "SKIP: cbt not installed"; exit 77; fi
instance_init cs_repl_delete
export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT
cbtq() { timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'; return "${PIPESTATUS[0]}"; }

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
cbtq createtable t families=cf,cg >/dev/null || fail "cbt createtable"
cbtq createappprofile i pw "west" route-to=west >/dev/null || fail "createappprofile pw"
"$STRATA" changes --dir "$DIR" --table t --enable 1d >/dev/null || fail "strata changes --enable"
sleep 1.1 # --from has whole seconds and must not be before the streams were turned on
FROM=$(date -u +%FT%TZ)

# A consumer of west reading live (the ring) besides the reads from storage below; the 100-byte
# value of z1 is held by reference in the stored records.
"$STRATA" changes --dir "$DIR" --table t --app-profile pw --from "$FROM" --follow --quiet \
  >"$TMPD/live.jsonl" 2>"$TMPD/live.err" &
LIVE=$!
PIDS+=("$LIVE")
BIG=$(printf 'C3%.0s' $(seq 1 50))
echo "== the older cells, on both clusters"
cbtq set t x1 app-profile=pw cf:old=OLD cg:o=O >/dev/null || fail "set x1"
cbtq set t y1 app-profile=pw cf:a=A >/dev/null || fail "set y1"
cbtq set t z1 app-profile=pw cf:c=C1 cf:d=D >/dev/null || fail "set z1"
cbtq waitforreplication t >/dev/null || fail "waitforreplication"

echo "== links cut: east deletes, then west writes the same rows"
"$STRATA" chaos partition east west --dir "$DIR" >/dev/null || fail "chaos partition"
cbtq deleterow t y1 >/dev/null || fail "deleterow y1 on east"
cbtq deletecolumn t z1 cf c >/dev/null || fail "deletecolumn z1 on east"
cbtq deleteallrows t >/dev/null || fail "deleteallrows (DropRowRange, on east)"
sleep 0.2 # west's commit times come after east's deletes
cbtq set t x1 app-profile=pw cf:new=NEW >/dev/null || fail "set x1 on west"
cbtq set t y1 app-profile=pw cf:b=B >/dev/null || fail "set y1 on west"
cbtq set t z1 app-profile=pw cf:c=$BIG >/dev/null || fail "set z1 on west"
"$STRATA" chaos heal --dir "$DIR" >/dev/null || fail "chaos heal"
cbtq waitforreplication t >/dev/null || fail "waitforreplication after heal"

# The model applies a stream's records in order; the dump is `cbt read` of the profile's cluster.
check() {
  local p=$1 recs=$TMPD/$1.jsonl
  if [ "$p" = live ]; then p=pw; recs=$TMPD/live.jsonl; fi
  [ "$1" = live ] || "$STRATA" changes --dir "$DIR" --table t --app-profile "$p" --from "$FROM" \
    --quiet >"$recs" || fail "strata changes --app-profile $p"
  cbtq read t app-profile="$p" >"$TMPD/$p.read" || fail "cbt read app-profile=$p"
  python3 - "$recs" "$TMPD/$p.read" "$1" "$BIG" <<'EOF' || fail "applying $1's stream in order does not give its table"
import datetime, json, sys
recs, dump, prof, big = sys.argv[1:]
model = {}
for line in open(recs):
    r = json.loads(line)
    row = model.setdefault(r["row"], {})
    for m in r["mods"]:
        f, q = m.get("family"), m.get("qualifier")
        if m["op"] == "set":
            row[(f, q, m["timestamp"])] = m["value"]
        elif m["op"] == "delete_family":
            for k in [k for k in row if k[0] == f]: del row[k]
        elif m["op"] == "delete_row":
            row.clear()
        else:
            s, e = m.get("start_timestamp", 0), m.get("end_timestamp", 0)
            for k in [k for k in row if k[:2] == (f, q) and k[2] >= s and (e == 0 or k[2] < e)]:
                del row[k]
cells = set((r, *k, v) for r, c in model.items() for k, v in c.items())
table, row, cell = set(), None, None
epoch = datetime.datetime(1970, 1, 1)
for line in open(dump):
    if line.startswith("---") or not line.strip():
        continue
    if not line.startswith(" "):
        row = line.strip()
    elif line.startswith("    "):
        table.add((row, *cell, json.loads(line.strip())))
    else:
        col, ts = line.rsplit(" @ ", 1)
        f, q = col.strip().split(":", 1)
        t = datetime.datetime.strptime(ts.strip(), "%Y/%m/%d-%H:%M:%S.%f")
        cell = (f, q, (t - epoch) // datetime.timedelta(microseconds=1))
want = {("x1", "cf", "new", "NEW"), ("y1", "cf", "b", "B"), ("z1", "cf", "c", big)}
print(f"{prof}: {sum(1 for _ in open(recs))} records, table {sorted((r, f, q) for r, f, q, _, _ in table)}")
if set((r, f, q, v) for r, f, q, _, v in table) != want:
    sys.exit(f"{prof}: the table holds {sorted(table)}, expected {sorted(want)}")
if cells != table:
    sys.exit(f"{prof}: the stream applied in order gives {sorted(cells)}")
EOF
}
echo "== west: east's deletes arrived after west's newer writes"
check pw
echo "== west, read live"
sleep 3 # the follower has passed the last write
kill -INT "$LIVE"
wait "$LIVE"
check live
echo "== east: west's writes arrived after east's deletes"
check default
echo "PASS"
