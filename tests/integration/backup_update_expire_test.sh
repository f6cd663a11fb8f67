#!/usr/bin/env bash
# backup_update_expire_test.sh — UpdateBackup's expire_time is bounded from the backup's creation
# (6 hours to 90 days after it, as Cloud Bigtable documents), not from the moment of the update,
# on `strata up --clusters 1 --nodes 1` through `strata backup`:
#   1. a backup a few seconds old takes an expire_time 6 hours and 1 second after its start_time
#      (it was refused: under 6 hours from now);
#   2. it refuses 90 days and 1 second after its start_time (that was taken: under 90 days from
#      now), and takes 90 days minus 1 second.
# Skips (77) without python3.
# Usage: backup_update_expire_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
up_single backup_update_expire
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
"${BK[@]}" update b1 --expire "$(after $((6 * 3600 + 1)))" >/dev/null 2>"$TMPD/1.err" ||
  { cat "$TMPD/1.err"; fail "an expire_time 6 h 1 s after the backup's start was refused"; }

echo "== 2. 90 days and 1 second after the start"
"${BK[@]}" update b1 --expire "$(after $((90 * 86400 + 1)))" >/dev/null 2>"$TMPD/2.err"
rc=$?
[ $rc -eq 1 ] && grep -q INVALID_ARGUMENT "$TMPD/2.err" ||
  { cat "$TMPD/2.err"; fail "an expire_time 90 d 1 s after the backup's start was not refused (exit $rc)"; }
"${BK[@]}" update b1 --expire "$(after $((90 * 86400 - 1)))" >/dev/null 2>"$TMPD/2.err" ||
  { cat "$TMPD/2.err"; fail "an expire_time 90 d - 1 s after the backup's start was refused"; }
echo "PASS"
