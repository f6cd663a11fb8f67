#!/usr/bin/env bash
# backup_lost_answer_test.sh — `strata backup create|restore|delete` whose request reached the
# router but whose answer never came (the router stopped with SIGSTOP right before, continued
# once the CLI gave up): the CLI says the outcome is unknown, how to check and when to run the
# command again, not a bare UNAVAILABLE that reads as "nothing happened" — the router carries the
# request out once it runs again (docs/operations.md, "strata backup", "Outcome unknown"). A read (`list`) against
# the stopped router says no such thing, and neither does a refused connection.
# Skips (77) without cbt.
# Usage: backup_lost_answer_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
up_single backup_lost_answer_test
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
ROUTER=$(cat "$DIR/run/router.pid")
# The router continues whatever happens to the test.
trap 'kill -CONT "$ROUTER" 2>/dev/null; instance_teardown' EXIT
cbtq createtable t families=cf >/dev/null || fail "cbt createtable"
cbtq set t r1 cf:c=v1 >/dev/null || fail "cbt set"
bk create t --id b1 --wait --quiet >/dev/null 2>&1 || fail "backup create b1"

# stopped CMD...: runs `strata backup CMD` while the router is stopped (the request goes out on a
# connection the kernel accepts, the answer never comes: the keepalive PING gives up), then
# continues the router. Sets rc and out.
stopped() {
  kill -STOP "$ROUTER" || fail "SIGSTOP router"
  out=$(bk "$@" 2>&1)
  rc=$?
  kill -CONT "$ROUTER" || fail "SIGCONT router"
}
# eventually WHAT CMD...: CMD succeeds within 30 s.
eventually() {
  local what=$1
  shift
  for _ in $(seq 60); do "$@" >/dev/null 2>&1 && { echo "ok: $what"; return; }; sleep 0.5; done
  fail "$what: never"
}
UNKNOWN='outcome unknown: %s was sent to the router.*Check with %s.*strata up --dir .*run the command again only if'

echo "== 1. create --wait, the router stopped"
stopped create t --id b2 --wait --quiet
[ "$rc" = 1 ] || fail "create with the router stopped ended $rc: $out"
expect_match "create: outcome unknown, how to check" \
  "$(printf "$UNKNOWN" CreateBackup '`strata backup list`')" "$out"
eventually "create: b2 was made after all" sh -c "'$STRATA' backup list --dir '$DIR' | grep -q '^b2 .*READY'"

echo "== 2. restore --wait, the router stopped"
stopped restore b1 --to r1 --wait --quiet
[ "$rc" = 1 ] || fail "restore with the router stopped ended $rc: $out"
expect_match "restore: outcome unknown, how to check" \
  "$(printf "$UNKNOWN" RestoreTable '`cbt ls`')" "$out"
eventually "restore: r1 was restored after all" sh -c "'$CBT' -project p -instance i read r1 2>/dev/null | grep -q '^r1$'"

echo "== 3. delete, the router stopped"
stopped delete b2
[ "$rc" = 1 ] || fail "delete with the router stopped ended $rc: $out"
expect_match "delete: outcome unknown, how to check" \
  "$(printf "$UNKNOWN" DeleteBackup '`strata backup describe b2`')" "$out"
eventually "delete: b2 was deleted after all" sh -c "! '$STRATA' backup list --dir '$DIR' | grep -q '^b2 '"

echo "== 4. a read, and a refused connection: no unknown outcome"
stopped list
[ "$rc" = 1 ] || fail "list with the router stopped ended $rc: $out"
expect_no "list: nothing to be unknown" 'outcome unknown' "$out"
kill -9 "$ROUTER"
sleep 0.5
out=$(bk create t --id b3 --wait 2>&1)
expect_no "create, router killed: refused, not unknown" 'outcome unknown' "$out"
expect_match "create, router killed: not running" "not running.*strata up --dir $DIR" "$out"
echo PASS
