#!/usr/bin/env bash
# restore_kill_test.sh — a restore whose router is killed (kill -9) mid-way leaves its claim on the
# table id (row bkclaim/<table> of the first cluster's metadata) and its running operation. After
# the router restarts, RestoreTable into the same table id must work (the restarted router's
# sweep finishes the dead run's operation, removes its tablets and gives the claim back; a retry
# meanwhile is ALREADY_EXISTS, never a mixed table), the table then holds the backup's rows, and
# no claim row is left once the restore is done.
# The restore is held mid-way by stopping (SIGSTOP) the second node, which its first step (drop
# the name's tablets on every node) waits for.
# A CreateTable killed mid-way leaves a claim too: one naming this router's earlier run is taken
# over at once, one older than RTR_BK_CREATE_CLAIM_TTL_US by any router, a live one is kept.
# Skips (77) without cbt.
# Usage: restore_kill_test.sh strata-node strata-router strata
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
STRATA=$3
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi

dir=$(make_tmp)
N2_PID=
fail() {
  echo "FAIL: $*" >&2
  [ -n "$N2_PID" ] && kill -CONT "$N2_PID" 2>/dev/null
  tail -n 30 "$dir"/r*.log >&2
  exit 1
}
start_member "$dir/n1" 1; N1=$NODE_ADDR
start_member "$dir/n2" 2; N2=$NODE_ADDR; N2_PID=$NODE_PID
cat >"$dir/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = $N1 $dir/n1
node = $N2 $dir/n2
TOPO
PORT=$(free_port)
R=127.0.0.1:$PORT
router() { # router LOG: a strata-router on PORT
  "$ROUTER_BIN" --config "$dir/topology" --listen "$R" >"$1" 2>&1 &
  RPID=$!
  PIDS+=("$RPID")
  wait_line "$1" "listening on $R" >/dev/null || fail "the router did not listen on $R"
}
router "$dir/r1.log"
bk() { timeout 120 "$STRATA" backup --endpoint "$R" --quiet "$@"; }
claims() { # rows bkclaim/... in the first node's metadata table
  BIGTABLE_EMULATOR_HOST=$N1 timeout 60 "$CBT" -project _strata -instance _strata \
    read metadata prefix=bkclaim/ 2>&1 | grep -c '^bkclaim/'
}

cbtr "$R" createtable t "families=cf" splits=m >/dev/null || fail "createtable t"
for k in apple kiwi zebra; do cbtr "$R" set t "$k" "cf:c=$k" >/dev/null || fail "set $k"; done
bk create t --cluster east --id b0 --expire 1d --wait >"$dir/b0.out" 2>&1 || fail "create b0: $(cat "$dir/b0.out")"

echo "== 1. a restore held mid-way, its router killed"
kill -STOP "$N2_PID"
bk restore b0 --cluster east --to t2 >"$dir/1.out" 2>&1 || fail "restore t2: $(cat "$dir/1.out")"
[ "$(claims)" = 1 ] || fail "no claim row while the restore runs: $(claims)"
kill -9 "$RPID"
wait "$RPID" 2>/dev/null
kill -CONT "$N2_PID"
[ "$(claims)" = 1 ] || fail "the killed restore's claim is not there"
echo ok

echo "== 2. router restarted: the restore into t2 works again"
router "$dir/r2.log"
ok=
for i in $(seq 1 240); do
  bk restore b0 --cluster east --to t2 --wait >"$dir/2.out" 2>&1 && { ok=1; break; }
  grep -q 'ALREADY_EXISTS' "$dir/2.out" || fail "retry: $(cat "$dir/2.out")"
  sleep 0.5
done
[ -n "$ok" ] || fail "restore into t2 still refused after the restart: $(cat "$dir/2.out")"
echo "accepted after $i attempts"
rows=$(cbtr "$R" read t2 | grep -c '^----')
[ "$rows" = 3 ] || fail "t2 has $rows rows, want 3: $(cbtr "$R" read t2)"
grep -q 'its router is gone; finishing it' "$dir/r2.log" || fail "the dead run's operation was not finished"
for i in $(seq 1 100); do [ "$(claims)" = 0 ] && break; sleep 0.1; done
[ "$(claims)" = 0 ] || fail "claim rows left after the restore: $(claims)"
echo ok

echo "== 3. CreateTable claims left by dead routers"
# A CreateTable that died mid-way leaves "tablecreate/<us>/<router>" in bkclaim/<table>; written
# here directly, as the metadata node holds it: one of an earlier run of this router (taken over
# at once), one older than the time-to-live (taken over), one of a live router elsewhere (kept).
setclaim() { # setclaim TABLE VALUE
  BIGTABLE_EMULATOR_HOST=$N1 timeout 60 "$CBT" -project _strata -instance _strata \
    set metadata "bkclaim/projects/p/instances/i/tables/$1" "m:v=$2" >/dev/null 2>&1 ||
    fail "cannot write the claim of $1"
}
now=$(($(date +%s) * 1000000))
setclaim t3 "tablecreate/$now/$R/1"
setclaim t4 "tablecreate/1000000/10.9.9.9:1/1"
setclaim t5 "tablecreate/$now/10.9.9.9:1/1"
out=$(cbtr "$R" createtable t3 "families=cf") || fail "createtable t3 (claim of this router's earlier run): $out"
out=$(cbtr "$R" createtable t4 "families=cf") || fail "createtable t4 (claim past its time): $out"
out=$(cbtr "$R" createtable t5 "families=cf") && fail "createtable t5 took a live router's claim"
echo "$out" | grep -q 'AlreadyExists' || fail "createtable t5: $out"
out=$(bk restore b0 --cluster east --to t5 2>&1) && fail "restore into t5 took a live router's claim"
echo "$out" | grep -q 'ALREADY_EXISTS' || fail "restore into t5: $out"
cbtr "$R" set t3 k cf:c=v >/dev/null || fail "set t3"
[ "$(claims)" = 1 ] || fail "want only t5's claim left, have $(claims) claim rows"
echo ok

if grep -l 'Sanitizer' "$dir"/r*.log "$dir"/n*.log; then echo "FAIL: sanitizer report"; exit 1; fi
echo PASS
