#!/usr/bin/env bash
# backup_router_down_test.sh — `strata backup` when the router of a plaintext instance is not
# running (docs/operations.md, "strata backup"): the message says so and what to do, and does not
# blame TLS (it used to add "a router that serves TLS only ... needs --dir DIR or --tls-ca" to
# every UNAVAILABLE, --dir given or not):
#   1. router killed: `backup list` (and `changes --enable`) say no router is listening and name
#      `strata up --dir DIR`; list prints nothing on stdout (it printed its header);
#   2. `restore --wait` whose router is killed while the CLI polls the operation: after a minute of
#      polling, the CLI says the router stopped answering, how the operation ends (the router's
#      sweep) and how to check.
# Skips (77) without cbt.
# Usage: backup_router_down_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
up_single backup_router_down_test
FAIL_TAIL_LINES=20
expect_match() { # WHAT REGEX GOT
  if printf '%s' "$3" | grep -Eq -- "$2"; then echo "ok: $1"; else fail "$1: want /$2/, got '$3'"; fi
}
expect_no() { # WHAT REGEX GOT
  if printf '%s' "$3" | grep -Eq -- "$2"; then fail "$1: did not want /$2/, got '$3'"; else echo "ok: $1"; fi
}
export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT
cbtq() { timeout 60 "$CBT" -project p -instance i "$@" 2>&1; }
bk() { timeout 200 "$STRATA" backup --dir "$DIR" "$@"; }
kill_router() { kill -9 "$(cat "$DIR/run/router.pid")" || fail "no router pid"; sleep 0.5; }
cbtq createtable t families=cf >/dev/null || fail "cbt createtable"
cbtq set t r1 cf:c=v1 >/dev/null || fail "cbt set"
bk create t --id b1 --wait --quiet >/dev/null 2>&1 || fail "backup create b1"

echo "== 1. the router killed"
kill_router
out=$(bk list 2>&1)
expect_match "list: connection refused, not running, start it" \
  "Connection refused.*not running.*strata up --dir $DIR" "$out"
expect_no "list: TLS is not blamed" 'TLS' "$out"
bk list >"$TMPD/list.out" 2>/dev/null && fail "backup list succeeded with the router killed"
[ ! -s "$TMPD/list.out" ] || fail "backup list printed on stdout although it failed: $(cat "$TMPD/list.out")"
echo "ok: list: nothing on stdout (no header alone to read as no backups)"
out=$(timeout 60 "$STRATA" changes --dir "$DIR" --table t --enable 1d 2>&1)
expect_match "changes --enable: not running" "not running.*strata up --dir $DIR" "$out"
expect_no "changes --enable: TLS is not blamed" 'TLS' "$out"
"$STRATA" up --dir "$DIR" >/dev/null 2>&1 || fail "strata up (the router again)"

echo "== 2. restore --wait, the router killed under it"
# The CLI prints its progress line when the operation has started, then polls every 500 ms: the
# router is killed as soon as the line is there, before the first poll could see the operation
# done. A loaded machine may still let a poll through first (the restore then ends 0): try again.
for try in 1 2 3; do
  bk restore b1 --to "t$try" --wait >"$TMPD/r.out" 2>"$TMPD/r.err" &
  CLI=$!
  PIDS+=("$CLI")
  wait_line "$TMPD/r.err" 'strata backup restore \[' >/dev/null ||
    fail "restore --wait never polled: $(cat "$TMPD/r.err")"
  kill_router
  wait "$CLI"
  rc=$?
  [ "$rc" = 0 ] || break
  "$STRATA" up --dir "$DIR" >/dev/null 2>&1 || fail "strata up (the router again)"
done
out=$(tr '\r' '\n' <"$TMPD/r.err")
[ "$rc" = 1 ] || fail "restore --wait without a router ended $rc: $out"
expect_match "restore --wait: how the operation ends" \
  'no answer from the router for 60 s.*ABORTED.*run the command again' "$out"
expect_match "restore --wait: not running" "Connection refused.*not running.*strata up --dir $DIR" "$out"
expect_no "restore --wait: TLS is not blamed" 'TLS' "$out"
echo PASS
