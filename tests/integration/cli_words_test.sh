#!/usr/bin/env bash
# cli_words_test.sh — commands that had nothing to act on say what: `strata help nosuch` printed
# the general usage without naming the unknown command (as `strata nosuch` does), and `strata down
# --dir` of a directory that does not exist said "No Strata process is running" as if an
# instance were there (exit 0 stays: there is nothing to stop).
# Usage: cli_words_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
tmp=$(make_tmp)
bad() { echo "FAIL: $*" >&2; exit 1; }

"$STRATA" help nosuch >"$tmp/help.out" 2>&1
rc=$?
[ "$rc" = 2 ] && grep -q "unknown command 'nosuch'" "$tmp/help.out" ||
  bad "strata help nosuch: exit $rc: $(head -3 "$tmp/help.out")"
echo "ok: $(head -1 "$tmp/help.out")"

"$STRATA" down --dir "$tmp/none" >"$tmp/down.out" 2>&1
rc=$?
[ "$rc" = 0 ] && grep -q "There is no Strata instance in $tmp/none (no such directory)" "$tmp/down.out" ||
  bad "strata down of a missing directory: exit $rc: $(cat "$tmp/down.out")"
[ ! -e "$tmp/none" ] || bad "strata down made $tmp/none"
echo "ok: $(cat "$tmp/down.out")"
echo PASS
