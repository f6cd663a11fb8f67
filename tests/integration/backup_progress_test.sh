#!/usr/bin/env bash
# backup_progress_test.sh — the progress of `strata backup export`, `verify` and `import` counts
# the bytes they move, as their summary line does (docs/operations.md, "Progress"): a table split
# while it loads leaves pieces that list the same SSTables (a split's halves keep their parent's
# files whole), which the export reads once, verify checks once and the import sends once per
# node. Every progress line's total is then the summary's "stored once" figure, not the bytes
# the pieces list (those had made the bar start at a fraction, read 900 GiB/s and give an ETA
# several times too long). Run on a terminal (`script`, when installed) so the bar is redrawn
# every 0.2 s, as an operator sees it; without `script`, the plain lines. Then an export past a
# file-size limit (`ulimit -f`): it fails with "File too large" and removes its directory (the
# CLI was killed by SIGXFSZ, leaving a half-written directory).
# Usage: backup_progress_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
instance_init backup_progress_test
FAIL_TAIL_LINES=20

bk() { timeout 120 "$STRATA" backup --dir "$DIR" "$@"; }
# on_tty CMD...: runs CMD with stdout and stderr on a terminal when `script` is there; the
# output, each redraw of the bar on a line of its own, into $TMPD/out
on_tty() {
  if command -v script >/dev/null; then
    timeout 120 script -qec "$(printf '%q ' "$@")" /dev/null >"$TMPD/raw" 2>&1
  else
    timeout 120 "$@" >"$TMPD/raw" 2>&1
  fi
  local rc=$?
  tr '\r' '\n' <"$TMPD/raw" | sed 's/\x1b\[K//g' | grep -v '^$' >"$TMPD/out"
  return $rc
}
# check_bar VERB LABEL: every "strata backup LABEL [...] A / TOTAL" line of $TMPD/out has the
# TOTAL the summary line ("VERB ... (S stored once)") gives as S; at least one such line
check_bar() {
  local verb=$1 label=$2 stored totals
  stored=$(sed -n "s/^$verb .*(\(.*\) stored once).*/\1/p" "$TMPD/out")
  [ -n "$stored" ] || fail "$label: no summary with a stored-once size: $(cat "$TMPD/out")"
  totals=$(sed -n "s/^strata backup $label \[[#.]*\] .* \/ \([0-9.]* [KMGT]*i*B\) .*/\1/p" "$TMPD/out" | sort -u)
  [ -n "$totals" ] || fail "$label: no progress line: $(cat "$TMPD/out")"
  [ "$totals" = "$stored" ] ||
    fail "$label: the bar counts $(echo "$totals" | tr '\n' ' ')where $stored move: $(cat "$TMPD/out")"
  echo "ok: $label's bar counts the $stored moved ($(grep -c "^strata backup $label \[" "$TMPD/out") lines)"
}

echo "== 1. a table split while loading, backed up with pieces that share files"
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 --split-bytes 262144 >/dev/null ||
  fail "strata up failed"
timeout 120 "$STRATA" bench --dir "$DIR" --project p --instance i --table sp --workload bulkwrite \
  --dist sequential --keys 96 --requests 1 --value-size 65536 --no-lag --quiet >"$TMPD/load.out" 2>&1 ||
  fail "loading sp: $(cat "$TMPD/load.out")"
for try in $(seq 1 60); do
  bk create sp --id s1 --expire 1d --wait --quiet >"$TMPD/c.out" 2>&1 || fail "create s1: $(cat "$TMPD/c.out")"
  rm -rf "$TMPD/exp"
  on_tty "$STRATA" backup --dir "$DIR" export s1 "$TMPD/exp" || fail "export s1: $(cat "$TMPD/out")"
  grep -q 'stored once' "$TMPD/out" && break
  bk delete s1 --quiet >/dev/null 2>&1 || fail "delete s1"
  sleep 1
done
grep -q 'stored once' "$TMPD/out" || fail "no piece shares a file after $try tries: sp did not split"
grep '^exported ' "$TMPD/out"

echo "== 2. the bars of export, verify and import count the bytes moved"
check_bar exported export
on_tty "$STRATA" backup verify "$TMPD/exp" || fail "verify: $(cat "$TMPD/out")"
check_bar verified verify
on_tty "$STRATA" backup --dir "$DIR" import "$TMPD/exp" --as s1i || fail "import: $(cat "$TMPD/out")"
check_bar imported import

echo "== 3. an export past a file-size limit (ulimit -f) fails and removes its directory"
# half the largest file of the export, in the 1 KiB blocks of `ulimit -f`
limit=$(($(find "$TMPD/exp/files" -type f -printf '%s\n' | sort -n | tail -1) / 2048 + 1))
(ulimit -f "$limit" && exec "$STRATA" backup --dir "$DIR" --quiet export s1 "$TMPD/exp2") \
  >"$TMPD/fz.out" 2>&1
rc=$?
[ "$rc" = 1 ] || fail "export under ulimit -f $limit exited $rc (153: killed by SIGXFSZ): $(cat "$TMPD/fz.out")"
grep -q "File too large (a file-size limit, \`ulimit -f\`, is set" "$TMPD/fz.out" ||
  fail "the limit is not named: $(cat "$TMPD/fz.out")"
[ ! -e "$TMPD/exp2" ] || fail "the failed export left $TMPD/exp2: $(ls -R "$TMPD/exp2")"
echo "ok: $(tail -1 "$TMPD/fz.out")"
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"
echo PASS
