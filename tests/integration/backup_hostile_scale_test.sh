#!/usr/bin/env bash
# backup_hostile_scale_test.sh — imports of exports with many pieces (docs/formats/backup-export.md
# allows 100,000) must not stop the router from serving everyone else (docs/backups.md, "Export
# and import"). One local instance (`strata up`, one cluster of one node), a one-piece export
# re-signed here into exports of N pieces that all list its one file:
#   1. 60,000 pieces: while the router checks BeginImport's pieces, every `strata backup list`
#      through the same router answers. The router compared every pair of piece ids (1.8e9
#      comparisons on its event loop: no call answered, not even the keepalive PING, for
#      seconds); the import is killed once its BeginImport is through;
#   2. 4,000 pieces: the import completes (FinishImport). FinishImport unpacked the node's whole
#      ListBackupPieces answer again for every piece (n^2: gigabytes parsed on the router's loop),
#      so the command's FinishImport call timed out on its keepalive and the router grew to 2 GB;
#   3. the 4,000-piece backup deleted: the node answers once the backup's directory is in its
#      trash and its reaper thread logs the 4,000 pieces removed (docs/backups.md, "On a node").
# Usage: backup_hostile_scale_test.sh PATH/TO/strata PATH/TO/bk_crc32c
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
CRC32C=$2
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init backup_hostile_scale_test
bk() { timeout 120 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
cbtq() {
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}

# manypieces SRC DST N: a copy of the one-piece export SRC whose manifest lists N pieces
# [-, k000001), [k000001, k000002), ... [k00N-1, -), each with SRC's file, re-signed (the first
# piece keeps SRC's piece id, which format 3's file lines name as the holder).
manypieces() {
  python3 - "$@" "$CRC32C" <<'PY'
import hashlib, shutil, subprocess, sys
src, dst, n, crctool = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
shutil.copytree(src, dst)
lines = [l for l in open(dst + "/MANIFEST").read().split("\n") if l and not l.startswith("end ")]
out = [l for l in lines if not l.startswith(("piece ", "file "))]
first = [l for l in lines if l.startswith("piece ")][0].split()
orig, frozen = first[1], first[4]
f = [l for l in lines if l.startswith("file ")][0]
for i in range(n):  # piece 0 keeps its id: format 3 file lines name the piece that holds the file
    s = "-" if i == 0 else ("k%06d" % i).encode().hex()
    e = "-" if i == n - 1 else ("k%06d" % (i + 1)).encode().hex()
    out += ["piece %s %s %s %s" % (orig if i == 0 else "p%d" % i, s, e, frozen), f]
text = ("\n".join(out) + "\n").encode()
open(dst + "/MANIFEST", "wb").write(text)
crc = subprocess.check_output([crctool, dst + "/MANIFEST"]).strip()
open(dst + "/MANIFEST", "ab").write(b"end %s %s\n" % (crc, hashlib.sha256(text).hexdigest().encode()))
PY
}

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >/dev/null || fail "strata up failed"
cbtq createtable t families=cf >/dev/null || fail "createtable t"
cbtq set t a cf:c=v >/dev/null || fail "set a"
bk create t --id src --wait >/dev/null || fail "create src"
bk export src "$TMPD/one" >/dev/null || fail "export src"
manypieces "$TMPD/one" "$TMPD/p60k" 60000 || fail "writing the 60,000-piece export"
manypieces "$TMPD/one" "$TMPD/p4k" 4000 || fail "writing the 4,000-piece export"
"$STRATA" backup verify "$TMPD/p4k" --quiet >/dev/null || fail "the re-signed export does not verify"

echo "== 1. the router answers while it checks a BeginImport of 60,000 pieces"
"$STRATA" backup --dir "$DIR" --quiet import "$TMPD/p60k" --as p60k >"$TMPD/1.out" 2>&1 &
IP=$!
PIDS+=("$IP")
lists=0
for _ in $(seq 1 3000); do # hang guard, not a timing assertion
  begun=$(grep -c 'p60k: begun' "$DIR/logs/router.log")
  timeout 60 "$STRATA" backup --dir "$DIR" list >"$TMPD/1.list" 2>&1 ||
    fail "ListBackups failed while BeginImport was checked: $(cat "$TMPD/1.list")"
  lists=$((lists + 1))
  [ "$begun" -gt 0 ] && break
  kill -0 $IP 2>/dev/null || fail "the import ended before its BeginImport was logged: $(cat "$TMPD/1.out")"
done
[ "$begun" -gt 0 ] || fail "BeginImport of 60,000 pieces never got through"
kill -9 $IP 2>/dev/null
wait $IP 2>/dev/null
echo "ok: $lists listings answered while BeginImport was checked"

echo "== 2. an import of 4,000 pieces completes"
bk import "$TMPD/p4k" --as p4k >/dev/null 2>"$TMPD/2.err" || fail "import of 4,000 pieces: $(cat "$TMPD/2.err")"
bk describe p4k | grep -q '^state: *READY' || fail "p4k not READY"
echo ok

echo "== 3. deleting the 4,000-piece backup: the node unlinks its files off its loop"
# The node renames the backup's directory into its trash and answers; its reaper thread unlinks
# the 4,000 pieces (it logs them). Unlinking them on the node's loop held every call to the node.
bk delete p4k >/dev/null 2>"$TMPD/3.err" || fail "delete p4k: $(cat "$TMPD/3.err")"
cbtq read t >"$TMPD/3.read" || fail "read t right after the delete: $(cat "$TMPD/3.read")"
reaped=
for _ in $(seq 1 600); do # hang guard, not a timing assertion
  reaped=$(grep -o 'event=trash_removed name=[^ ]*@p pieces=4000 .*on=reaper' "$DIR/logs/east-0.log")
  [ -n "$reaped" ] && break
  timeout 60 "$STRATA" backup --dir "$DIR" list >"$TMPD/3.list" 2>&1 ||
    fail "ListBackups failed while the node removed p4k: $(cat "$TMPD/3.list")"
  sleep 0.1
done
[ -n "$reaped" ] || fail "the node's reaper never logged the 4,000 pieces of p4k removed"
grep -q p4k "$TMPD/3.list" && fail "p4k still listed after its delete"
echo "ok: $reaped"
echo PASS
