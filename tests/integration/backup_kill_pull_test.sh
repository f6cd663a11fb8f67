#!/usr/bin/env bash
# backup_kill_pull_test.sh — the router killed with -9 while a node pulls a piece for it, then
# restarted (docs/backups.md, "Operations" and "Restore"): its operation ends ABORTED with its
# partial work removed. On `strata up --clusters 2 --nodes 1` with a 48 MiB table in east:
#   1. CopyBackup east -> west, the router killed as soon as west's node has begun pulling the
#      piece (its `<piece>.in` directory exists);
#   2. RestoreTable, killed the same way while west pulls the piece under its temporary name
#      (`restore-<n>`).
# After the restart the sweep deletes the operation's pieces while the pull still runs on the
# node. The node used to answer that delete OK and then seal the pull anyway: a piece of 48 MiB
# stayed on west with no record pointing to it, which no delete and no restart ever removed.
# Each case waits until the operation reads ABORTED and the node has no pull left (no `.in`
# directory, no removal under way), then no piece of the copy or the restore may be left on west.
# Usage: backup_kill_pull_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
instance_init backup_kill_pull_test
bk() { timeout 120 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
WEST=$DIR/west-0/backups/i/west

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 >/dev/null || fail "strata up failed"
"$STRATA" bench --dir "$DIR" --project p --instance i --table big --workload bulkwrite \
  --dist sequential --keys 768 --requests 8 --value-size 65536 --no-lag --quiet >"$TMPD/load" 2>&1 ||
  fail "load: $(tail -3 "$TMPD/load")"
bk create big --id b1 --wait >/dev/null || fail "create b1"
RCMD=$(grep -o 'strata up starts router: .*' "$DIR/logs/router.log" | tail -1 | sed 's/^strata up starts router: //')

# killed_while_pulling GLOB OPERATION_PREFIX: once a directory matching GLOB exists (the pull
# began) stops east's node, the source of the pull, so the pull cannot end before the router is
# killed (-9), however slow the machine; restarts the router, then lets east go on. Prints whether
# the kill came during the pull and the outcome to expect: "done" only when the router had
# already logged the operation OK (the pull ended in the instant between its start being seen and
# east being stopped, or before its start was seen at all), else "aborted".
killed_while_pulling() {
  local glob=$1 during=no outcome=aborted east
  east=$(cat "$DIR/run/east-0.pid")
  for _ in $(seq 1 1000); do # hang guard
    compgen -G "$glob" >/dev/null && { during=yes; break; }
    sleep 0.01
  done
  kill -STOP "$east"
  local rpid
  rpid=$(cat "$DIR/run/router.pid")
  kill -9 "$rpid"
  # The port is free only once the killed router is gone (an ASan process takes a while to be
  # torn down): a restart before that fails "Address already in use". A zombie holds no port.
  for _ in $(seq 1 1200); do # hang guard
    if [ ! -r "/proc/$rpid/stat" ] || grep -q '^[0-9]* (.*) Z' "/proc/$rpid/stat" 2>/dev/null; then
      break
    fi
    sleep 0.05
  done
  grep -q "operation $2/[0-9]*: OK" "$DIR/logs/router.log" && outcome="done"
  # shellcheck disable=SC2086 # the logged command line is split into its words on purpose
  setsid $RCMD >>"$DIR/logs/router.log" 2>&1 </dev/null &
  echo $! >"$DIR/run/router.pid"
  kill -CONT "$east"
  echo "$during $outcome"
}

# settled OPERATION_PREFIX OUTCOME DONE_CHECK LEFT: waits until the operation reached its outcome
# (aborted: the router logs it ABORTED, the sweep finished it; done: the command DONE_CHECK
# succeeds), west holds no `.in` directory (no pull left) and its node's trash is empty (no
# removal under way), and the command LEFT, given the outcome reached, prints nothing (what must be gone is
# gone: a pull or seal that ends after the sweep removes its piece then, so the piece may exist a
# moment before its removal starts). An operation the router logged OK whose record was not yet
# written when it was killed is still swept and ends ABORTED: prints the outcome reached.
settled() {
  local got left=
  for _ in $(seq 1 1200); do # hang guard
    got=
    grep -q "operation $1/[0-9]*: ABORTED" "$DIR/logs/router.log" && got=aborted
    [ -z "$got" ] && [ "$2" = "done" ] && $3 >/dev/null 2>&1 && got="done"
    if [ -n "$got" ]; then
      left=$($4 "$got")
      if [ -z "$left" ] && ! compgen -G "$WEST/*/*.in" >/dev/null &&
        ! compgen -G "$WEST/../../.trash/*" >/dev/null; then
        echo "$got"
        return 0
      fi
    fi
    sleep 0.1
  done
  echo "operation $1 did not end ${2^^} (reached: ${got:-nothing}), or a pull never ended, or pieces were left on west: ${left:-none} ($(find "$WEST"))" >&2
  return 1
}

echo "== 1. CopyBackup east -> west, the router killed during the pull"
bk copy b1 --to west --as c1 >/dev/null || fail "copy c1"
PFX1=operations/projects/p/instances/i/clusters/west/backups/c1
read -r during outcome < <(killed_while_pulling "$WEST/c1/*.in" "$PFX1")
c1_ready() { bk describe c1 --json | grep -q "\"state\":\"READY\""; }
c1_left() { [ "$1" = aborted ] && find "$WEST/c1" -mindepth 1 -maxdepth 1 2>/dev/null; }
got=$(settled "$PFX1" "$outcome" c1_ready c1_left) || fail "copy c1 did not settle (see above)"
if [ "$got" = aborted ]; then
  echo "ok: killed during the pull: $during; nothing of c1 left on west"
else
  echo "ok: the pull ended before the kill (killed during it: $during); c1 READY on west"
fi

echo "== 2. RestoreTable, the router killed while west pulls the piece"
for _ in $(seq 1 300); do # the restarted router answers
  bk describe b1 >/dev/null 2>&1 && break
  sleep 0.1
done
bk restore b1 --to rt1 >/dev/null || fail "restore rt1"
PFX2=operations/projects/p/instances/i/tables/rt1
read -r during outcome < <(killed_while_pulling "$WEST/restore-*/*.in" "$PFX2")
rt_left() { find "$WEST" -mindepth 2 -maxdepth 2 -path "$WEST/restore-*" 2>/dev/null; }
got=$(settled "$PFX2" "$outcome" true rt_left) || fail "restore rt1 did not settle (see above)"
echo "ok: killed during the pull: $during; outcome $got; no temporary piece left on west"
echo PASS
