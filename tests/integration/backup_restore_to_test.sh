#!/usr/bin/env bash
# backup_restore_to_test.sh — `strata backup restore ID --to TABLE` restores into the table named,
# or refuses, on `strata up --clusters 1 --nodes 1`:
#   1. `--to a/b` (neither a table id nor a full table name) is refused (exit 2), and no table b
#      is made (the CLI took the part after the last '/' and restored into table b);
#   2. `--to projects/p/instances/other/tables/t2` (another instance) is refused, naming
#      `--target`, and no table t2 is made here (it restored into this instance's t2);
#   3. `--to projects/p/instances/i/tables/t3` restores into t3, `--to t4` into t4.
# Skips (77) without python3.
# Usage: backup_restore_to_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
up_single backup_restore_to
cs_py create t 0 || fail "creating table t"
BK=("$STRATA" backup --dir "$DIR" --quiet)
"${BK[@]}" create t --id b1 --wait >/dev/null 2>"$TMPD/c.err" || { cat "$TMPD/c.err"; fail "backup create"; }

echo "== 1. --to a/b"
"${BK[@]}" restore b1 --to a/b --wait >/dev/null 2>"$TMPD/1.err"
rc=$?
[ $rc -eq 2 ] || { cat "$TMPD/1.err"; fail "restore --to a/b exited $rc, not 2"; }
[ "$(cs_py exists b)" = 0 ] || fail "restore --to a/b made table b"

echo "== 2. --to a table of another instance"
"${BK[@]}" restore b1 --to projects/p/instances/other/tables/t2 --wait >/dev/null 2>"$TMPD/2.err"
rc=$?
[ $rc -ne 0 ] && grep -q -- --target "$TMPD/2.err" ||
  { cat "$TMPD/2.err"; fail "restore --to another instance's table exited $rc without naming --target"; }
[ "$(cs_py exists t2)" = 0 ] || fail "restore --to projects/p/instances/other/tables/t2 made t2 here"

echo "== 3. a full table name of this instance, and a table id"
"${BK[@]}" restore b1 --to projects/p/instances/i/tables/t3 --wait >/dev/null 2>"$TMPD/3.err" ||
  { cat "$TMPD/3.err"; fail "restore --to projects/p/instances/i/tables/t3"; }
"${BK[@]}" restore b1 --to t4 --wait >/dev/null 2>"$TMPD/3.err" || { cat "$TMPD/3.err"; fail "restore --to t4"; }
[ "$(cs_py exists t3)$(cs_py exists t4)" = 11 ] || fail "t3 or t4 was not restored"
echo "PASS"
