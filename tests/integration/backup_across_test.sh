#!/usr/bin/env bash
# backup_across_test.sh — a backup restored into another instance (two `strata up` instances,
# each its own router), and a HOT backup's hot_to_standard_time through export and import:
#   1. instance A (one cluster, two nodes), table bk split at "m"; `create --hot-until 2d` makes
#      a HOT backup b1 with its hot_to_standard_time;
#   2. export b1: the manifest carries hot_to_standard_us; import into instance B as h1: B shows
#      the same backup_type and hot_to_standard_time;
#   3. `restore b1 --to bk2 --target DIR_B` and `--target HOST:PORT` of B's router (bk3): `cbt
#      read` of each on B equals `cbt read` of bk on A; no temporary backup stays on B, no
#      temporary directory in $TMPDIR;
#   4. refusals leave nothing behind: into an existing table (ALREADY_EXISTS, nothing copied),
#      from a backup that does not exist; RestoreTable through A's router naming another
#      instance is NOT_FOUND and names `--target`;
#   5. a backup with an empty piece (table em split at "m", one row "a", so tablet [m, -) has no
#      row): its export imports into B (the empty piece is sealed with no file) and it restores
#      there, through `import` + RestoreTable and through `restore --target HOST:PORT`.
# Skips (77) without cbt or python3.
# Usage: backup_across_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }

instance_init backup_across_test
DIRB=$TMPD/instb
PORTB=$(free_port)
finish() {
  "$STRATA" down --dir "$DIRB" >/dev/null 2>&1
  instance_teardown
}
trap finish EXIT
export TMPDIR=$TMPD/tmp
mkdir -p "$TMPDIR"

cbtat() { # cbtat PORT ARGS...
  local port=$1
  shift
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$port timeout 60 "$CBT" -project p -instance i "$@" 2>&1 |
    grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}
bka() { timeout 300 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
bkb() { timeout 300 "$STRATA" backup --dir "$DIRB" --quiet "$@"; }
no_leftovers() { # no temporary backup on B, no temporary directory
  bkb list --json | python3 -c '
import json, sys
ids = [b["id"] for b in json.load(sys.stdin)]
assert not [i for i in ids if i.startswith("xrestore-")], ids' || fail "$1: a temporary backup stayed on B: $(bkb list)"
  [ -z "$(ls -A "$TMPDIR")" ] || fail "$1: left in TMPDIR: $(ls -A "$TMPDIR")"
}

echo "== 1. instance A, HOT backup b1"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 || fail "strata up (A) failed"
"$STRATA" up --dir "$DIRB" --port "$PORTB" --clusters 1 --nodes 1 || fail "strata up (B) failed"
cbtat "$PORT" createtable bk "families=cf:maxversions=2" splits=m || fail "createtable bk"
{ # one cbt call for every row (each cbt start costs seconds on a loaded machine)
  echo ",name,len"
  for r in apple banana cherry kiwi lemon mango nectarine orange peach zucchini; do
    echo "$r,$r,${#r}"
  done
} >"$TMPD/rows.csv"
cbtat "$PORT" import bk "$TMPD/rows.csv" column-family=cf >"$TMPD/import.out" || fail "cbt import: $(cat "$TMPD/import.out")"
cbtat "$PORT" read bk >"$TMPD/a.read" || fail "cbt read bk on A"
[ "$(grep -c '^----' "$TMPD/a.read")" -eq 10 ] || fail "A has not 10 rows: $(cat "$TMPD/a.read")"
bka create bk --id b1 --expire 3d --hot-until 2d --wait >"$TMPD/1.out" 2>&1 || fail "create: $(cat "$TMPD/1.out")"
hot=$(bka describe b1 --json | python3 -c '
import json, sys
b = json.load(sys.stdin)
assert b["state"] == "READY" and b["backup_type"] == "HOT", b
print(b["hot_to_standard_time"])') || fail "describe b1: $(bka describe b1)"
echo "ok: HOT until $hot"

echo "== 2. hot_to_standard_time through export and import"
bka export b1 "$TMPD/exp" >"$TMPD/2.out" 2>&1 || fail "export: $(cat "$TMPD/2.out")"
grep -q '^hot_to_standard_us [1-9][0-9]*$' "$TMPD/exp/MANIFEST" || fail "no hot_to_standard_us in the manifest: $(head -n 12 "$TMPD/exp/MANIFEST")"
bkb import "$TMPD/exp" --as h1 >"$TMPD/2i.out" 2>&1 || fail "import: $(cat "$TMPD/2i.out")"
bkb describe h1 --json | python3 -c '
import json, sys
b = json.load(sys.stdin)
assert b["backup_type"] == "HOT" and b.get("hot_to_standard_time") == sys.argv[1], (b, sys.argv[1])' "$hot" ||
  fail "h1 on B lost its HOT time: $(bkb describe h1)"
echo ok

echo "== 3. restore into instance B, by directory and by router address"
bka restore b1 --to bk2 --target "$DIRB" >"$TMPD/3.out" 2>&1 || fail "restore --target DIR: $(cat "$TMPD/3.out")"
grep -q "restored .*/backups/b1 into projects/p/instances/i/tables/bk2" "$TMPD/3.out" || fail "restore said: $(cat "$TMPD/3.out")"
cbtat "$PORTB" read bk2 >"$TMPD/b2.read" || fail "cbt read bk2 on B"
diff "$TMPD/a.read" "$TMPD/b2.read" >"$TMPD/3.diff" || fail "bk2 on B differs from bk on A: $(cat "$TMPD/3.diff")"
no_leftovers "restore --target DIR"
# the copy a killed restore left (its pid is gone) is removed by the next restore; a running
# restore's (this shell's pid) is not
sh -c 'exit 0' & DEADPID=$!; wait $DEADPID
mkdir -p "$TMPDIR/strata-restore-$DEADPID-abcdef/x" "$TMPDIR/strata-restore-$$-ghijkl"
echo leftover >"$TMPDIR/strata-restore-$DEADPID-abcdef/x/piece"
bka restore b1 --to bk3 --target "127.0.0.1:$PORTB" --json >"$TMPD/3b.out" 2>&1 || fail "restore --target H:P: $(cat "$TMPD/3b.out")"
cbtat "$PORTB" read bk3 >"$TMPD/b3.read" || fail "cbt read bk3 on B"
diff "$TMPD/a.read" "$TMPD/b3.read" >"$TMPD/3b.diff" || fail "bk3 on B differs from bk on A: $(cat "$TMPD/3b.diff")"
[ -d "$TMPDIR/strata-restore-$$-ghijkl" ] || fail "a running restore's directory was removed"
grep -q "removed .*strata-restore-$DEADPID-abcdef" "$TMPD/3b.out" || fail "the leftover was not reported: $(cat "$TMPD/3b.out")"
rmdir "$TMPDIR/strata-restore-$$-ghijkl"
no_leftovers "restore --target H:P"
echo "ok: $(grep -c '^----' "$TMPD/b2.read") rows identical, twice"

echo "== 4. refusals leave nothing behind"
bka restore b1 --to bk2 --target "$DIRB" >"$TMPD/4a.out" 2>&1 && fail "restore into an existing table succeeded"
grep -q "already exists" "$TMPD/4a.out" || fail "existing table: $(cat "$TMPD/4a.out")"
no_leftovers "into an existing table"
bka restore nosuch --to bk4 --target "$DIRB" >"$TMPD/4b.out" 2>&1 && fail "restore of a missing backup succeeded"
grep -q "not found" "$TMPD/4b.out" || fail "missing backup: $(cat "$TMPD/4b.out")"
no_leftovers "a missing backup"
cbtat "$PORTB" ls >"$TMPD/4.ls"
grep -qx bk4 "$TMPD/4.ls" && fail "bk4 exists on B after a failed restore"
bka restore b1 --to bk5 --instance other --wait >"$TMPD/4c.out" 2>&1 && fail "RestoreTable into another instance through A succeeded"
grep -q "NOT_FOUND\|not served by this router" "$TMPD/4c.out" && grep -q -- "--target" "$TMPD/4c.out" ||
  fail "RestoreTable naming another instance: $(cat "$TMPD/4c.out")"
echo ok

echo "== 5. a backup with an empty piece imports and restores"
cbtat "$PORT" createtable em "families=cf" splits=m || fail "createtable em"
cbtat "$PORT" set em a cf:c=v1 >/dev/null || fail "cbt set em"
cbtat "$PORT" read em >"$TMPD/em.read" || fail "cbt read em on A"
bka create em --id e1 --wait >"$TMPD/5.out" 2>&1 || fail "create e1: $(cat "$TMPD/5.out")"
bka export e1 "$TMPD/exe" >"$TMPD/5x.out" 2>&1 || fail "export e1: $(cat "$TMPD/5x.out")"
[ "$(grep -c '^piece ' "$TMPD/exe/MANIFEST")" -eq 2 ] || fail "e1 has not 2 pieces: $(cat "$TMPD/exe/MANIFEST")"
bkb import "$TMPD/exe" --as e1 >"$TMPD/5i.out" 2>&1 || fail "import of a backup with an empty piece: $(cat "$TMPD/5i.out")"
bkb describe e1 --json | python3 -c '
import json, sys
b = json.load(sys.stdin)
assert b["state"] == "READY", b' || fail "e1 on B not READY: $(bkb describe e1)"
bkb restore e1 --to em2 --wait >"$TMPD/5r.out" 2>&1 || fail "restore e1 on B: $(cat "$TMPD/5r.out")"
cbtat "$PORTB" read em2 >"$TMPD/em2.read" || fail "cbt read em2 on B"
diff "$TMPD/em.read" "$TMPD/em2.read" >"$TMPD/5.diff" || fail "em2 on B differs from em on A: $(cat "$TMPD/5.diff")"
bka restore e1 --to em3 --target "127.0.0.1:$PORTB" >"$TMPD/5t.out" 2>&1 || fail "restore --target of e1: $(cat "$TMPD/5t.out")"
cbtat "$PORTB" read em3 >"$TMPD/em3.read" || fail "cbt read em3 on B"
diff "$TMPD/em.read" "$TMPD/em3.read" >"$TMPD/5t.diff" || fail "em3 on B differs from em on A: $(cat "$TMPD/5t.diff")"
no_leftovers "restore --target of a backup with an empty piece"
echo ok
if grep -l 'Sanitizer' "$TMPD"/*.out "$DIR"/logs/*.log "$DIRB"/logs/*.log 2>/dev/null; then fail "sanitizer report"; fi
echo PASS
