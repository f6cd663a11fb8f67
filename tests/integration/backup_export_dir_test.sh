#!/usr/bin/env bash
# backup_export_dir_test.sh — what `strata backup` says about export directories and nodes that
# do not answer (docs/operations.md, "strata backup"; docs/formats/backup-export.md):
#   1. verify and import of a directory that does not exist say so (not "an interrupted export");
#   2. a directory an interrupted export left (files/, no MANIFEST): verify says to remove it
#      (`rm -r DIR`), and an export into it says it holds an unfinished export, with the same;
#   3. an export into a file system without room (a 64 KiB tmpfs; needs root, else skipped) says
#      to free space or export elsewhere, with the bytes needed;
#   4. a node killed: an export of a backup with a piece there and an import into its cluster
#      name the node as `strata status` does (east-1) and say to start it and retry, not only an
#      internal call at an address; the import does not claim its partial backup "was deleted"
#      while that node holds part of it.
# Skips (77) without cbt.
# Usage: backup_export_dir_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
up_single backup_export_dir_test --nodes 2
FAIL_TAIL_LINES=20
MNT=$TMPD/small
finish() {
  mountpoint -q "$MNT" 2>/dev/null && { umount "$MNT" 2>/dev/null || umount -l "$MNT"; }
  instance_teardown
}
trap finish EXIT
expect_match() { # WHAT REGEX GOT
  if printf '%s' "$3" | grep -Eq -- "$2"; then echo "ok: $1"; else fail "$1: want /$2/, got '$3'"; fi
}
expect_no() { # WHAT REGEX GOT
  if printf '%s' "$3" | grep -Eq -- "$2"; then fail "$1: did not want /$2/, got '$3'"; else echo "ok: $1"; fi
}
export BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT
cbtq() { timeout 60 "$CBT" -project p -instance i "$@" 2>&1; }
bk() { timeout 200 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
# A table split in four, with 100 KB of incompressible bytes per row: its pieces spread over both
# nodes, and the backup does not fit in 64 KiB.
cbtq createtable t families=cf splits=d,h,m >/dev/null || fail "cbt createtable"
for r in a e k p; do
  cbtq set t "$r" cf:c="$(head -c 75000 /dev/urandom | base64 -w0)" >/dev/null || fail "cbt set $r"
done
bk create t --id b1 --wait >/dev/null 2>&1 || fail "backup create b1"

echo "== 1. a directory that does not exist"
out=$(bk verify "$TMPD/nosuch" 2>&1) && fail "verify of a missing directory succeeded"
expect_match "verify: does not exist" "$TMPD/nosuch does not exist" "$out"
expect_no "verify: no interrupted export blamed" 'interrupted' "$out"
out=$(bk import "$TMPD/nosuch" --as i1 2>&1) && fail "import of a missing directory succeeded"
expect_match "import: does not exist" "$TMPD/nosuch does not exist" "$out"

echo "== 2. what an interrupted export leaves"
mkdir -p "$TMPD/cut/files" && echo x >"$TMPD/cut/files/n1-t1.00000000000000000001.sst.tmp"
out=$(bk verify "$TMPD/cut" 2>&1) && fail "verify of an unfinished export succeeded"
expect_match "verify: remove it and export again" "not a finished export.*rm -r $TMPD/cut.*export again" "$out"
out=$(bk export b1 "$TMPD/cut" 2>&1) && fail "export into an unfinished export succeeded"
expect_match "export: holds an unfinished export, remove it" \
  "$TMPD/cut holds an unfinished export.*rm -r $TMPD/cut.*new directory" "$out"
[ -e "$TMPD/cut/files/n1-t1.00000000000000000001.sst.tmp" ] || fail "export touched the leftover"
mkdir -p "$TMPD/other" && echo x >"$TMPD/other/notes"
out=$(bk export b1 "$TMPD/other" 2>&1) && fail "export into a non-empty directory succeeded"
expect_match "export: any other non-empty directory" "$TMPD/other exists and is not empty" "$out"

echo "== 3. no room for the export"
mkdir -p "$MNT"
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=64k tmpfs "$MNT" 2>/dev/null; then
  out=$(bk export b1 "$MNT/x" 2>&1) && fail "export into 64 KiB succeeded"
  expect_match "export: no room, free space or elsewhere, bytes needed" \
    "no room for the export: free space on the file system of $MNT/x, or export into a new directory on one with room for [0-9]{6,} bytes.*No space left on device" "$out"
  [ ! -e "$MNT/x" ] || fail "the partial export was left: $(ls -R "$MNT")"
else
  echo "skipped: not root or no tmpfs"
fi
echo "== 4. a node killed under an export and an import"
bk export b1 "$TMPD/ex" >/dev/null 2>&1 || fail "export b1"
NODE1=$(grep -o '^node = [^ ]*' "$DIR/topology" | sed -n 2p | cut -d' ' -f3)
[ -n "$NODE1" ] || fail "no second node in $DIR/topology"
kill -9 "$(cat "$DIR/run/east-1.pid")" || fail "kill east-1"
sleep 0.5
out=$(bk export b1 "$TMPD/ex2" 2>&1) && fail "export with east-1 killed succeeded (no piece there?)"
expect_match "export: names east-1, start it, export again" \
  "node east-1 \($NODE1\) does not answer: start it again \(\`strata status\` shows which nodes are down; \`strata up\` restarts those of a local instance\) and export again; the call that failed: .* at $NODE1: UNAVAILABLE" "$out"
# The router places the pieces over the cluster's nodes; right after the kill it still counts
# east-1 up, as an import that starts while a node goes down does.
out=$(bk import "$TMPD/ex" --as i2 2>&1) && fail "import with east-1 killed succeeded (no piece placed there?)"
expect_match "import: names east-1, what is left, start it, import again" \
  "import failed: node east-1 \($NODE1\) does not answer. The partly imported i2 was deleted except what it holds there, which the router removes once that node answers again: start it again .* and import again; the call that failed: .* at $NODE1: UNAVAILABLE" "$out"
expect_no "import: no bare 'was deleted:'" 'was deleted: ' "$out"
echo PASS
