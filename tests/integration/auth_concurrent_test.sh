#!/usr/bin/env bash
# auth_concurrent_test.sh — `strata auth` commands run at once on one auth file each keep their
# change: 20 add-principal (each prints a token, shown only once) with a remove of a principal
# holding admin, then 20 grants of one principal on 20 tables with a rotate. Each command loads,
# edits and saves the whole file; without a lock held from load to save the last save wins, so
# the revoked principal came back and most printed tokens were never saved.
# Usage: auth_concurrent_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
dir=$(make_tmp)
F=$dir/principals
bad() { echo "FAIL: $*" >&2; exit 1; }

for round in 1 2 3; do
  rm -f "$F" "$F".*
  "$STRATA" auth add-principal mallory --file "$F" >/dev/null || bad "add mallory"
  "$STRATA" auth grant mallory admin --file "$F" >/dev/null || bad "grant mallory"
  "$STRATA" auth remove mallory --file "$F" >"$dir/rm.out" 2>&1 &
  rm_pid=$!
  pids=()
  for i in $(seq 1 20); do
    "$STRATA" auth add-principal "p$i" --file "$F" >"$dir/ap$i.out" 2>&1 &
    pids+=($!)
  done
  wait "$rm_pid" || { cat "$dir/rm.out"; bad "round $round: remove failed"; }
  for i in $(seq 1 20); do
    wait "${pids[$((i - 1))]}" || { cat "$dir/ap$i.out"; bad "round $round: add-principal p$i failed"; }
    grep -q '^st1_' "$dir/ap$i.out" || { cat "$dir/ap$i.out"; bad "round $round: p$i printed no token"; }
  done
  "$STRATA" auth list --file "$F" >"$dir/list.out" || bad "list"
  kept=$(grep -cE '^p[0-9]+ ' "$dir/list.out")
  [ "$kept" = 20 ] || { cat "$dir/list.out"; bad "round $round: $kept of 20 new principals kept"; }
  ! grep -q '^mallory' "$dir/list.out" || { cat "$dir/list.out"; bad "round $round: removed mallory is back"; }
  echo "ok: round $round: 20 principals kept, mallory removed"
done

# Grants and a rotate at once on one principal: every grant kept.
"$STRATA" auth rotate p1 --file "$F" >"$dir/rot.out" 2>&1 &
rot_pid=$!
pids=()
for i in $(seq 1 20); do
  "$STRATA" auth grant p1 reader --table "t$i" --file "$F" >/dev/null 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || bad "a grant failed"; done
wait "$rot_pid" || { cat "$dir/rot.out"; bad "rotate failed"; }
grants=$("$STRATA" auth list --file "$F" | grep '^p1 ' | grep -o 'on table t[0-9]*' | sort -u | wc -l)
[ "$grants" = 20 ] || { "$STRATA" auth list --file "$F"; bad "$grants of 20 grants kept"; }
echo "ok: 20 grants kept beside a rotate"
echo PASS
