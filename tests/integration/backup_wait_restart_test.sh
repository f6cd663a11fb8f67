#!/usr/bin/env bash
# backup_wait_restart_test.sh — `strata backup create --wait` rides out a router restart
# (docs/backups.md): the operation lives in the instance's metadata, so while the router is
# gone the CLI keeps polling (UNAVAILABLE for up to a minute) and then reports the operation's
# own outcome — READY, or the error the restarted router gave it — never the restart itself.
# The router is killed as soon as the backup exists, before the CLI's first poll (every 500 ms):
# its polls then meet a closed port until the router is back.
# Skips (77) without cbt (the table is made with it).
# Usage: backup_wait_restart_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
instance_init backup_wait_restart_test
FAIL_TAIL_LINES=20
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up"; }
cbtl() { BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>&1; }
cbtl createtable t families=cf >/dev/null || fail "cbt createtable: $(cbtl createtable t families=cf)"
cbtl set t r1 cf:c=one >/dev/null || fail "cbt set r1"

RPID=$(cat "$DIR/run/router.pid") || fail "no router pid"
timeout 180 "$STRATA" backup --dir "$DIR" --quiet create t --id w1 --expire 1d --wait \
  >"$TMPD/create.out" 2>&1 &
CPID=$!
for _ in $(seq 1 400); do # the backup's record exists once CreateBackup has answered
  "$STRATA" backup --dir "$DIR" --quiet describe w1 >/dev/null 2>&1 && break
  sleep 0.02
done
kill -9 "$RPID"
for _ in $(seq 1 100); do kill -0 "$RPID" 2>/dev/null || break; sleep 0.1; done
sleep 1.5 # the CLI meets a closed port at least once
"$STRATA" up --dir "$DIR" >/dev/null 2>&1 || fail "strata up did not restart the router"
wait "$CPID"
rc=$?
out=$(cat "$TMPD/create.out")
echo "create --wait exited $rc: $out"
[ $rc -ne 124 ] || fail "create --wait still waiting after 180 s"
if printf '%s' "$out" | grep -q 'UNAVAILABLE'; then
  fail "create --wait gave up on the restarting router instead of waiting for its operation"
fi
printf '%s' "$out" | grep -Eq 'READY|operation .* failed' || fail "no outcome reported: $out"
echo "PASS"
