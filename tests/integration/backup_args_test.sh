#!/usr/bin/env bash
# backup_args_test.sh — what `strata backup` and the router take as a backup's expire time and a
# restore's table, on `strata up --clusters 1 --nodes 1` (table t, backup b1):
#   1. UpdateBackup bounds expire_time from the backup's creation (6 hours to 90 days after it,
#      as Cloud Bigtable documents), not from the update: a backup a few seconds old takes 6 h
#      1 s after its start_time (it was refused: under 6 hours from now), refuses 90 d 1 s (that
#      was taken: under 90 days from now) and takes 90 d - 1 s;
#   2. `restore --to a/b` (neither a table id nor a full table name) is refused (exit 2) and
#      makes no table b (the CLI took the part after the last '/' and restored into table b);
#   3. `restore --to projects/p/instances/other/tables/t2` (another instance) is refused,
#      naming `--target`, and makes no table t2 here (it restored into this instance's t2);
#   4. `--to projects/p/instances/i/tables/t3` restores into t3, `--to t4` into t4.
# Skips (77) without python3.
# Usage: backup_args_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
up_single backup_args
cs_py create t 0 || fail "creating table t"
BK=("$STRATA" backup --dir "$DIR" --quiet)
"${BK[@]}" create t --id b1 --wait >/dev/null 2>"$TMPD/c.err" || { cat "$TMPD/c.err"; fail "backup create"; }
START=$("${BK[@]}" describe b1 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["start_time"])')
# after START + SECONDS, as RFC 3339
after() {
  python3 -c '
import datetime, sys
t = datetime.datetime.strptime(sys.argv[1], "%Y-%m-%dT%H:%M:%S.%fZ") + datetime.timedelta(seconds=int(sys.argv[2]))
print(t.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))' "$START" "$1"
}
sleep 3 # the updates come well after the creation

echo "== 1. 6 hours and 1 second after the start"
"${BK[@]}" update b1 --expire "$(after $((6 * 3600 + 1)))" >/dev/null 2>"$TMPD/1a.err" ||
  { cat "$TMPD/1a.err"; fail "an expire_time 6 h 1 s after the backup's start was refused"; }

echo "== 1b. 90 days and 1 second after the start"
"${BK[@]}" update b1 --expire "$(after $((90 * 86400 + 1)))" >/dev/null 2>"$TMPD/1b.err"
rc=$?
[ $rc -eq 1 ] && grep -q INVALID_ARGUMENT "$TMPD/1b.err" ||
  { cat "$TMPD/1b.err"; fail "an expire_time 90 d 1 s after the backup's start was not refused (exit $rc)"; }
"${BK[@]}" update b1 --expire "$(after $((90 * 86400 - 1)))" >/dev/null 2>"$TMPD/1b.err" ||
  { cat "$TMPD/1b.err"; fail "an expire_time 90 d - 1 s after the backup's start was refused"; }

echo "== 2. --to a/b"
"${BK[@]}" restore b1 --to a/b --wait >/dev/null 2>"$TMPD/2.err"
rc=$?
[ $rc -eq 2 ] || { cat "$TMPD/2.err"; fail "restore --to a/b exited $rc, not 2"; }
[ "$(cs_py exists b)" = 0 ] || fail "restore --to a/b made table b"

echo "== 3. --to a table of another instance"
"${BK[@]}" restore b1 --to projects/p/instances/other/tables/t2 --wait >/dev/null 2>"$TMPD/3.err"
rc=$?
[ $rc -ne 0 ] && grep -q -- --target "$TMPD/3.err" ||
  { cat "$TMPD/3.err"; fail "restore --to another instance's table exited $rc without naming --target"; }
[ "$(cs_py exists t2)" = 0 ] || fail "restore --to projects/p/instances/other/tables/t2 made t2 here"

echo "== 4. a full table name of this instance, and a table id"
"${BK[@]}" restore b1 --to projects/p/instances/i/tables/t3 --wait >/dev/null 2>"$TMPD/4.err" ||
  { cat "$TMPD/4.err"; fail "restore --to projects/p/instances/i/tables/t3"; }
"${BK[@]}" restore b1 --to t4 --wait >/dev/null 2>"$TMPD/4.err" || { cat "$TMPD/4.err"; fail "restore --to t4"; }
[ "$(cs_py exists t3)$(cs_py exists t4)" = 11 ] || fail "t3 or t4 was not restored"
echo "PASS"
