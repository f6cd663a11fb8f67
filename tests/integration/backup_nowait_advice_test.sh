#!/usr/bin/env bash
# backup_nowait_advice_test.sh — `strata backup create|restore` without --wait print the
# operation and advice that works (docs/operations.md, "strata backup"): where the result shows
# (`strata backup list`, `cbt ls`), not "run again with --wait", which sends a second request
# that the first one's id refuses (ALREADY_EXISTS). Following the advice finds the result.
# Skips (77) without cbt.
# Usage: backup_nowait_advice_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
up_single backup_nowait_advice_test
FAIL_TAIL_LINES=20
export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT
cbtq() { timeout 60 "$CBT" -project p -instance i "$@" 2>&1; }
bk() { timeout 200 "$STRATA" backup --dir "$DIR" "$@"; }
cbtq createtable t families=cf >/dev/null || fail "cbt createtable"
cbtq set t r1 cf:c=v1 >/dev/null || fail "cbt set"
# eventually WHAT CMD...: CMD succeeds within 30 s.
eventually() {
  local what=$1
  shift
  for _ in $(seq 60); do "$@" >/dev/null 2>&1 && { echo "ok: $what"; return; }; sleep 0.5; done
  fail "$what: never"
}
advice() { # WHAT OUT WANT
  case "$2" in
    *"--wait"*) fail "$1: still advises --wait: $2" ;;
    *"started: operation operations/"*"; follow it with $3"*) echo "ok: $1: $2" ;;
    *) fail "$1: want 'started: operation ...; follow it with $3', got '$2'" ;;
  esac
}

out=$(bk create t --id nw1 2>&1) || fail "create: $out"
advice "create" "$out" '`strata backup list`'
eventually "create: the advice finds the backup" sh -c "'$STRATA' backup list --dir '$DIR' | grep -q '^nw1 .*READY'"

out=$(bk restore nw1 --to r1 2>&1) || fail "restore: $out"
advice "restore" "$out" '`cbt ls`'
eventually "restore: the advice finds the table" sh -c "'$CBT' -project p -instance i ls 2>/dev/null | grep -qx r1"
echo PASS
