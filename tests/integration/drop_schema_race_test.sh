#!/usr/bin/env bash
# drop_schema_race_test.sh — drops racing each other through the router, on `strata up --nodes 1`
# (two clusters), a table of 100,000 rows (docs/cluster.md, "Work off the loop"):
#  A. the same family dropped twice at once: one drop succeeds, the other answers NOT_FOUND (or
#     succeeds too), no cell of it is left, and the family created again keeps its new cell only;
#  B. a family dropped and the table deleted at once: the table is gone afterwards (not brought
#     back, without tablets, by the family drop's schema) and its name can be used again;
#  C. DropRowRange of the whole table and DeleteTable at once: the table is gone, and created
#     again it is empty.
# Skips without cbt or python3.
# Usage: drop_schema_race_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
[ -n "$CBT" ] || { echo "SKIP: cbt not installed"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
instance_init drop_schema_race
"$STRATA" up --dir "$DIR" --port "$PORT" --nodes 1 >"$TMPD/up.log" 2>&1 ||
  { cat "$TMPD/up.log"; fail "strata up failed"; }
A=127.0.0.1:$PORT
C() { cbtr "$A" "$@"; }
CSV=$TMPD/rows.csv
python3 - "$CSV" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    f.write(",f\nrow-key,q\n")
    for i in range(100000):
        f.write("r%06d,v\n" % i)
PY
load() { C import "$1" "$CSV" column-family=f batch-size=1000 workers=2 >/dev/null || fail "import $1"; }
both() { # OUT1 OUT2 -- CMD1 -- CMD2: runs both at once (the second 50 ms later); sets R1 R2
  local o1=$1 o2=$2 a=() b=() p1 p2
  shift 3
  while [ "$1" != -- ]; do a+=("$1"); shift; done
  shift
  b=("$@")
  C "${a[@]}" >"$o1" 2>&1 & p1=$!
  sleep 0.05
  C "${b[@]}" >"$o2" 2>&1 & p2=$!
  wait $p1; R1=$?
  wait $p2; R2=$?
}

# A. The same family dropped twice at once.
C createtable t families=f,g >/dev/null || fail "createtable t"
load t
both "$TMPD/a1" "$TMPD/a2" -- deletefamily t f -- deletefamily t f
echo "A: the drops answered $R1 $R2: $(cat "$TMPD/a1" "$TMPD/a2" | tr '\n' ' ')"
# Schema changes of a table run one at a time: the drop that runs first succeeds, the other
# then finds no family f (NOT_FOUND), whichever of the two cbt calls reached the router first.
[ "$R1" = 0 ] || [ "$R2" = 0 ] || fail "A: neither drop succeeded"
if [ "$R1" != 0 ] || [ "$R2" != 0 ]; then
  grep -qi "NotFound" "$TMPD/a1" "$TMPD/a2" || fail "A: the second drop failed otherwise than NOT_FOUND"
fi
[ "$(C count t | tail -n1)" = 0 ] || fail "A: cells of the dropped family are left"
C createfamily t f >/dev/null || fail "A: createfamily"
C set t r000001 f:q=new >/dev/null || fail "A: write to the family created again"
[ "$(C read t | grep -c 'f:q')" = 1 ] || fail "A: the family created again shows old cells"

# B. A family dropped while the table is deleted.
load t
both "$TMPD/b1" "$TMPD/b2" -- deletefamily t f -- deletetable t
echo "B: drop family $R1, delete table $R2: $(cat "$TMPD/b1" "$TMPD/b2" | tr '\n' ' ')"
[ "$R2" = 0 ] || fail "B: DeleteTable failed"
C ls | grep -qx t && fail "B: the deleted table is listed again"
C createtable t families=f >/dev/null || fail "B: the deleted table's name cannot be used again"
[ "$(C count t | tail -n1)" = 0 ] || fail "B: the table created again is not empty"

# C. DropRowRange while the table is deleted.
load t
both "$TMPD/c1" "$TMPD/c2" -- deleteallrows t -- deletetable t
echo "C: drop rows $R1, delete table $R2: $(cat "$TMPD/c1" "$TMPD/c2" | tr '\n' ' ')"
[ "$R2" = 0 ] || fail "C: DeleteTable failed"
C ls | grep -qx t && fail "C: the deleted table is listed again"
C createtable t families=f >/dev/null || fail "C: the deleted table's name cannot be used again"
[ "$(C count t | tail -n1)" = 0 ] || fail "C: the table created again is not empty"
"$STRATA" status --dir "$DIR" >"$TMPD/status" 2>&1 || { cat "$TMPD/status"; fail "an instance process is down"; }
# Every process stops cleanly (a sanitizer build reports leaks and errors at exit).
"$STRATA" down --dir "$DIR" >"$TMPD/down.log" 2>&1 || { cat "$TMPD/down.log"; fail "strata down failed"; }
grep -l "Sanitizer" "$DIR"/logs/*.log && fail "a sanitizer report"
echo "PASS"
