#!/usr/bin/env bash
# backup_cas_down_test.sh — new backup ids and restore targets are taken with a compare-and-set in
# the first cluster's metadata (docs/backups.md, "Several routers"). With that cluster's nodes
# hung (SIGSTOP: the call fails, it does not wait forever) and then killed, through a router of
# the instance:
#   1. CreateBackup in the second cluster fails UNAVAILABLE at once (no hang), the message naming
#      the first cluster; no backup of that id shows, in either cluster's metadata;
#   2. RestoreTable fails the same way and leaves no table; CreateTable also;
#   3. with the first cluster back, the same backup id is created once (READY) and the restore
#      works: nothing was left half-made.
# Skips (77) without cbt.
# Usage: backup_cas_down_test.sh strata-node strata-router strata
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
STRATA=$3
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }

dir=$(make_tmp)
fail() {
  echo "FAIL: $*" >&2
  tail -n 30 "$dir/r.log" >&2
  exit 1
}
two_clusters "$dir"; N1=$EAST; N1_PID=$EAST_PID
start_router "$dir/topology" "$dir/r.log"; R=$ROUTER_ADDR
bk() { timeout 120 "$STRATA" backup --endpoint "$R" --quiet "$@"; }

cbtr "$R" createtable t "families=cf" >/dev/null || fail "createtable t"
cbtr "$R" set t r1 cf:c=v1 >/dev/null || fail "set r1"
bk create t --cluster east --id b0 --expire 1d --wait >"$dir/b0.out" 2>&1 ||
  fail "create b0: $(cat "$dir/b0.out")"

echo "== 0. first cluster hung (SIGSTOP): CreateBackup fails UNAVAILABLE, it does not hang"
kill -STOP "$N1_PID"
t0=$(date +%s)
bk create t --cluster west --id b9 --expire 1d >"$dir/0.out" 2>&1 && {
  kill -CONT "$N1_PID"
  fail "create b9 succeeded with the first cluster hung: $(cat "$dir/0.out")"
}
kill -CONT "$N1_PID"
grep -q 'UNAVAILABLE\|DEADLINE_EXCEEDED' "$dir/0.out" ||
  fail "create b9 with the first cluster hung: $(cat "$dir/0.out")"
# The hung node may still run the compare-and-set it had received once it resumes: b9 may then
# stay CREATING (hidden, its operation gone) until the sweep deletes it, but never READY.
out=$(bk describe b9 --cluster west 2>&1) && fail "b9 exists after its creation failed: $out"
echo "ok: failed after $(($(date +%s) - t0)) s"

echo "== 1. first cluster down: CreateBackup UNAVAILABLE, nothing recorded"
kill -9 "$N1_PID"
wait "$N1_PID" 2>/dev/null
bk create t --cluster west --id b1 --expire 1d >"$dir/1.out" 2>&1 &&
  fail "create b1 succeeded with the first cluster down: $(cat "$dir/1.out")"
grep -q 'UNAVAILABLE' "$dir/1.out" && grep -q 'cluster east' "$dir/1.out" ||
  fail "create b1 did not say UNAVAILABLE naming cluster east: $(cat "$dir/1.out")"
bk describe b1 --cluster west >"$dir/1d.out" 2>&1 && fail "b1 exists: $(cat "$dir/1d.out")"
echo ok

echo "== 2. RestoreTable and CreateTable UNAVAILABLE too, no table left"
bk restore b0 --cluster east --to t2 --wait >"$dir/2.out" 2>&1 &&
  fail "restore into t2 succeeded with the first cluster down: $(cat "$dir/2.out")"
grep -q 'UNAVAILABLE' "$dir/2.out" || fail "restore: $(cat "$dir/2.out")"
out=$(cbtr "$R" createtable t3 "families=cf") && fail "createtable t3 succeeded: $out"
echo ok

echo "== 3. first cluster back: the same ids work, once"
start_member "$dir/east" 1 "$N1"
for i in $(seq 1 300); do # until the router reaches it again
  bk create t --cluster west --id b1 --expire 1d --wait >"$dir/3.out" 2>&1 && break
  grep -q 'UNAVAILABLE' "$dir/3.out" || fail "create b1 after the restart: $(cat "$dir/3.out")"
  sleep 0.2
done
grep -q 'READY' "$dir/3.out" || fail "b1 not READY: $(cat "$dir/3.out")"
bk create t --cluster west --id b1 --expire 1d >"$dir/3b.out" 2>&1 &&
  fail "b1 created twice: $(cat "$dir/3b.out")"
grep -q 'ALREADY_EXISTS' "$dir/3b.out" || fail "second b1: $(cat "$dir/3b.out")"
n=$(bk list --cluster - --json | python3 -c '
import json, sys
print(sum(1 for b in json.load(sys.stdin) if b["id"] == "b1"))') || fail "list"
[ "$n" = 1 ] || fail "$n backups b1 listed"
bk restore b0 --cluster east --to t2 --wait >"$dir/3r.out" 2>&1 || fail "restore t2: $(cat "$dir/3r.out")"
cbtr "$R" read t2 | grep -q 'v1' || fail "t2 does not hold r1: $(cbtr "$R" read t2)"
echo ok

if grep -l 'Sanitizer' "$dir"/r.log "$dir"/n*.log; then echo "FAIL: sanitizer report"; exit 1; fi
echo PASS
