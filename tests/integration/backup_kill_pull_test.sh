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

# killed_while_pulling GLOB: kills the router (-9) once a directory matching GLOB exists (the
# pull began), restarts it; prints whether the kill came during the pull.
killed_while_pulling() {
  local glob=$1 during=no
  for _ in $(seq 1 1000); do # hang guard
    compgen -G "$glob" >/dev/null && { during=yes; break; }
    sleep 0.01
  done
  kill -9 "$(cat "$DIR/run/router.pid")"
  # shellcheck disable=SC2086 # the logged command line is split into its words on purpose
  setsid $RCMD >>"$DIR/logs/router.log" 2>&1 </dev/null &
  echo $! >"$DIR/run/router.pid"
  echo "$during"
}

# settled OPERATION_PREFIX: waits until the router logs the operation ABORTED (the sweep
# finished it) and west holds no `.in` directory (no pull left) and no `.del` one (no removal
# under way).
settled() {
  for _ in $(seq 1 600); do # hang guard
    if grep -q "operation $1/[0-9]*: ABORTED" "$DIR/logs/router.log" &&
      ! compgen -G "$WEST/*/*.in" >/dev/null && ! compgen -G "$WEST/*/*.del" >/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  fail "operation $1 did not end ABORTED, or a pull never ended: $(find "$WEST")"
}

echo "== 1. CopyBackup east -> west, the router killed during the pull"
bk copy b1 --to west --as c1 >/dev/null || fail "copy c1"
during=$(killed_while_pulling "$WEST/c1/*.in")
settled "operations/projects/p/instances/i/clusters/west/backups/c1"
left=$(find "$WEST/c1" -mindepth 1 -maxdepth 1 2>/dev/null)
[ -z "$left" ] || fail "pieces of the aborted copy left on west: $left ($(du -sh "$WEST/c1" | cut -f1))"
echo "ok: killed during the pull: $during; nothing of c1 left on west"

echo "== 2. RestoreTable, the router killed while west pulls the piece"
for _ in $(seq 1 300); do # the restarted router answers
  bk describe b1 >/dev/null 2>&1 && break
  sleep 0.1
done
bk restore b1 --to rt1 >/dev/null || fail "restore rt1"
during=$(killed_while_pulling "$WEST/restore-*/*.in")
settled "operations/projects/p/instances/i/tables/rt1"
left=$(find "$WEST" -mindepth 2 -maxdepth 2 -path "$WEST/restore-*" 2>/dev/null)
[ -z "$left" ] || fail "temporary pieces of the aborted restore left on west: $left ($(du -sh "$WEST"/restore-* | cut -f1))"
echo "ok: killed during the pull: $during; no temporary piece left on west"
echo PASS
