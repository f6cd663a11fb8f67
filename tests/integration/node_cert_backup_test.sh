#!/usr/bin/env bash
# node_cert_backup_test.sh — a node's certificate (OU=strata-node) reads no backup of another
# node (docs/security.md, Internal links), while backup copies and restores across clusters,
# whose pulls read another node's piece with that certificate, still work on `strata up
# --secure` (clusters east and west of one node each):
#   1. node_cert_backup.py on east's node with west's certificate: ListBackupPieces and
#      ReadBackupFile without a read ticket, with a forged one, or with one for another piece
#      are UNAUTHENTICATED and return no cell; GrantBackupRead and PullBackupPiece are refused;
#      a ticket the operator's certificate was granted opens that piece only; CopyRows writes no
#      rows into a serving tablet (a clock-only CopyRows still passes);
#   2. CopyBackup to west and RestoreTable (pulled into west) succeed, and the restored table
#      reads back the secret.
# Skips (77) without cbt, openssl or python3.
# Usage: node_cert_backup_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v openssl >/dev/null || { echo "openssl not installed: skipping"; exit 77; }
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init node_cert_backup
expect_match() { # WHAT REGEX GOT
  if printf '%s' "$3" | grep -Eq -- "$2"; then echo "ok: $1"; else fail "$1: want /$2/, got '$3'"; fi
}
bk() { timeout 120 "$STRATA" backup --dir "$DIR" --quiet "$@" 2>&1; }

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 2 --nodes 1 --secure >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up --secure"; }
S=$DIR/secure
line=$(grep -E '^  cbt ' "$TMPD/up.out" | sed 's/^  //; s/ ls$//')
read -r -a SECURE_CBT <<<"${line/#cbt/$CBT}"
EAST=$(grep -Eo 'east-0 +127\.0\.0\.1:[0-9]+' "$TMPD/up.out" | grep -Eo '[0-9]+$')
[ -n "$EAST" ] || fail "east-0's address is not in the output of strata up"

cbts createtable secret families=cf >/dev/null || fail "cbt createtable: $(cbts createtable secret families=cf)"
cbts set secret row1 cf:q=TOPSECRETVALUE42 >/dev/null || fail "cbt set"
expect_match "backup in east" '^state: *READY' "$(bk create secret --id b1 --cluster east --wait)"

echo "== 1. a node's certificate on east's node"
python3 "$HERE/node_cert_backup.py" "$EAST" "$S" west-0 \
  projects/p/instances/i/clusters/east/backups/b1 projects/p/instances/i/tables/secret \
  TOPSECRETVALUE42 || fail "node_cert_backup.py"

echo "== 2. pulls between nodes still work"
expect_match "copy to west" '^name: .*/clusters/west/backups/b1w' "$(bk copy b1 --to west --as b1w --wait)"
expect_match "the copy is READY" '^state: *READY' "$(bk describe b1w --cluster west)"
expect_match "restore (pulled into west)" 'restored .* into .*/tables/back' \
  "$(bk restore b1 --to back --wait)"
expect_match "the restored table reads back" 'TOPSECRETVALUE42' "$(cbts read back)"
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"
if grep -l 'Sanitizer' "$DIR"/logs/*.log; then fail "sanitizer report in a log"; fi
echo PASS
