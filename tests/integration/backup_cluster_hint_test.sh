#!/usr/bin/env bash
# backup_cluster_hint_test.sh — `strata backup` names --cluster where a backup of a cluster other
# than the first (the CLI's default) needs it, on `strata up --clusters 2 --nodes 1`:
#   1. an import into west left CREATING (BeginImport with no file sent, as an import cut short
#      leaves it): importing the same id again is ALREADY_EXISTS, advising
#      `strata backup --cluster west delete ki` (it advised `strata backup delete`, which answered
#      NOT_FOUND in east);
#   2. `restore ki` without --cluster is NOT_FOUND, saying that backup ki exists in cluster west
#      and giving the command with --cluster west; `describe`, `delete` and `export` likewise;
#   3. `--cluster west restore ki` is FAILED_PRECONDITION saying that an import cut short never
#      becomes READY and how to delete it (it said "restore it once it is READY", no more);
#   4. the advised delete works, and the id then imports and restores.
# Skips (77) without python3.
# Usage: backup_cluster_hint_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init backup_cluster_hint_test
FAIL_TAIL_LINES=10
bk() { timeout 120 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
# expect FILE CODE TEXT...: FILE holds CODE and every TEXT
expect() {
  local f=$1 t
  grep -q -- "$2" "$f" || fail "want $2: $(cat "$f")"
  for t in "${@:3}"; do grep -qF -- "$t" "$f" || fail "want '$t': $(cat "$f")"; done
  echo "ok: $(cut -c1-400 "$f")"
}

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  fail "strata up: $(cat "$TMPD/up.out")"
cs_py create t 0 || fail "creating table t"
cs_py write t a b c || fail "writing t"
bk create t --id src --wait >/dev/null 2>"$TMPD/c.err" || fail "create src: $(cat "$TMPD/c.err")"
bk export src "$TMPD/ex" >/dev/null 2>"$TMPD/e.err" || fail "export src: $(cat "$TMPD/e.err")"

echo "== 1. an unfinished import ki in west; importing ki again"
HOSTILE=$(cd "$(dirname "$0")" && pwd)/hostile python3 - "$PORT" <<'EOF' || fail "BeginImport ki"
import os, sys, time
sys.path.insert(0, os.environ["HOSTILE"])
from cslib import call, fld
port = int(sys.argv[1])
now = int(time.time() * 1e6)
ts = lambda us: fld(1, us // 10**6)
backup = fld(2, "projects/p/instances/i/tables/t") + fld(3, ts(now + 7 * 86400 * 10**6)) + \
    fld(4, ts(now - 10**6)) + fld(5, ts(now)) + fld(11, 1)
schema = fld(1, "projects/p/instances/i/tables/t") + fld(3, fld(1, "cf") + fld(2, b""))
piece = fld(2, "p0") + fld(6, fld(1, "000001.sst") + fld(2, 400) + fld(3, 1)) + fld(7, 400) + fld(8, now)
req = fld(1, "projects/p/instances/i/clusters/west") + fld(2, "ki") + fld(3, backup) + \
    fld(4, schema) + fld(5, piece)
data, st, why = call(port, "/strata.internal.v1.BackupAdmin/BeginImport", req)
sys.exit(0 if why == "end" else 1)
EOF
bk --cluster west describe ki >"$TMPD/1d.out" 2>&1 || fail "describe ki in west: $(cat "$TMPD/1d.out")"
grep -q 'state: *CREATING' "$TMPD/1d.out" || fail "ki is not CREATING: $(cat "$TMPD/1d.out")"
bk import "$TMPD/ex" --cluster west --as ki >/dev/null 2>"$TMPD/1.err" && fail "importing over ki succeeded"
expect "$TMPD/1.err" ALREADY_EXISTS 'strata backup --cluster west delete ki`' 'has not finished'

echo "== 2. ki named without --cluster: where it is"
bk restore ki --to r1 --wait >/dev/null 2>"$TMPD/2r.err" && fail "restore ki (east) succeeded"
expect "$TMPD/2r.err" NOT_FOUND 'backup ki exists in cluster west' \
  "strata backup --dir $DIR --cluster west restore ki --to r1 --wait"
for sub in describe delete; do
  bk "$sub" ki >/dev/null 2>"$TMPD/2$sub.err" && fail "$sub ki (east) succeeded"
  expect "$TMPD/2$sub.err" NOT_FOUND "strata backup --dir $DIR --cluster west $sub ki\`"
done
bk export ki "$TMPD/ex2" >/dev/null 2>"$TMPD/2e.err" && fail "export ki (east) succeeded"
expect "$TMPD/2e.err" NOT_FOUND "--cluster west export ki $TMPD/ex2"
bk restore nosuch --to r1 >/dev/null 2>"$TMPD/2n.err" && fail "restore nosuch succeeded"
grep -q 'exists in cluster' "$TMPD/2n.err" && fail "a backup no cluster holds was placed: $(cat "$TMPD/2n.err")"

echo "== 3. restoring the unfinished import"
bk --cluster west restore ki --to r1 --wait >/dev/null 2>"$TMPD/3.err" && fail "restore of CREATING ki succeeded"
expect "$TMPD/3.err" FAILED_PRECONDITION 'if it was cut short it never becomes READY' \
  'strata backup --cluster west delete ki`'

echo "== 4. the advised delete, then the import and a restore"
bk --cluster west delete ki >/dev/null 2>"$TMPD/4.err" || fail "delete ki in west: $(cat "$TMPD/4.err")"
bk import "$TMPD/ex" --cluster west --as ki >/dev/null 2>"$TMPD/4i.err" || fail "import ki: $(cat "$TMPD/4i.err")"
bk --cluster west restore ki --to r1 --wait >/dev/null 2>"$TMPD/4r.err" || fail "restore ki: $(cat "$TMPD/4r.err")"
echo PASS
