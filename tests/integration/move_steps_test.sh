#!/usr/bin/env bash
# move_steps_test.sh CASE NODE_BIN ROUTER_BIN — a tablet move stopped at one exact step through the
# nodes' test-only fault settings (STRATA_TEST_MOVE): a DropRowRange during the move (drop), the
# source killed between the target's activation and its own drop (activated), the target killed
# right after creating its copy (created), a copy abandoned by a dead source (idle). The cases
# are described in hostile/move_steps.py. Skips (77) without python3.
set -u
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "python3 missing: skipped"; exit 77; }
D=$(make_tmp)
timeout 240 python3 "$(dirname "$0")/hostile/move_steps.py" "$1" "$2" "$3" "$D"
rc=$?
[ "$rc" = 0 ] || { tail -n 30 "$D"/a.log "$D"/b.log; exit 1; }
# Every process stopped cleanly at the end (a sanitizer build reports leaks and errors at exit).
if grep -l "Sanitizer" "$D"/*.log; then
  grep -h -A 30 "Sanitizer" "$D"/*.log | head -n 60
  exit 1
fi
echo PASS
