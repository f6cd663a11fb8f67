#!/usr/bin/env bash
# backup_cli_test.sh — `strata backup` end to end on real instances (`strata up`), with cbt:
#   1. instance A (one cluster, two nodes), table bk split at "m", rows on both sides;
#      `create --wait` makes b1 READY; list and describe show it;
#   2. export b1 -> verify OK; a copy with one flipped byte -> verify refuses, naming the file;
#   3. instance B (another deployment): import of the damaged copy is refused naming the file and
#      leaves no backup; import of the intact export -> b1 READY on B;
#   4. restore b1 on B into bk2 -> `cbt read` of bk2 on B equals `cbt read` of bk on A;
#   5. table sp loaded on A with a 256 KiB split threshold splits while it loads, so its pieces
#      share files: the export stores each distinct file once (files/ holds fewer files than the
#      manifest lists), verifies, imports into B and restores there with identical rows.
# Skips (77) without cbt, or while the router answers CreateBackup UNIMPLEMENTED.
# Usage: backup_cli_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }

instance_init backup_cli_test
DIRB=$TMPD/instb
PORTB=$(free_port)
finish() {
  "$STRATA" down --dir "$DIRB" >/dev/null 2>&1
  instance_teardown
}
trap finish EXIT
FAIL_TAIL_LINES=20
EXP=$TMPD/export

cbtat() { # cbtat PORT ARGS...
  local port=$1
  shift
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$port timeout 60 "$CBT" -project p -instance i "$@" 2>&1 |
    grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}
bka() { timeout 300 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
bkb() { timeout 300 "$STRATA" backup --dir "$DIRB" --quiet "$@"; }

echo "== 1. instance A, table bk, create --wait"
# a 256 KiB split threshold: table sp (section 5) splits while it loads, bk (10 rows) does not
"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 2 --split-bytes 262144 ||
  fail "strata up (A) failed"
cbtat "$PORT" createtable bk "families=cf:maxversions=2" splits=m || fail "createtable bk"
for r in apple banana cherry kiwi lemon mango nectarine orange peach zucchini; do
  cbtat "$PORT" set bk "$r" "cf:name=$r" "cf:len=${#r}" >/dev/null || fail "set $r"
done
cbtat "$PORT" read bk >"$TMPD/a.read" || fail "cbt read bk on A"
[ "$(grep -c '^----' "$TMPD/a.read")" -eq 10 ] || fail "A has not 10 rows: $(cat "$TMPD/a.read")"
out=$(bka create bk --id b1 --expire 1d --wait 2>&1)
if echo "$out" | grep -q 'UNIMPLEMENTED'; then
  echo "the router has no backup API (CreateBackup UNIMPLEMENTED): skipping"
  exit 77
fi
echo "$out" | grep -q '^state: *READY' || fail "create --wait: $out"
bka list --json | python3 -c '
import json, sys
bs = json.load(sys.stdin)
assert [b["id"] for b in bs] == ["b1"], bs
assert bs[0]["source_table"] == "projects/p/instances/i/tables/bk", bs' || fail "list --json"
bka describe b1 --json | python3 -c '
import json, sys
b = json.load(sys.stdin)
assert b["state"] == "READY" and b["size_bytes"] > 0, b' || fail "describe b1: $(bka describe b1)"
echo ok

echo "== 2. export, verify, a flipped byte refused"
bka export b1 "$EXP" >"$TMPD/2.out" 2>&1 || fail "export: $(cat "$TMPD/2.out")"
"$STRATA" backup verify "$EXP" --quiet >"$TMPD/2v.out" 2>&1 || fail "verify: $(cat "$TMPD/2v.out")"
cp -r "$EXP" "$TMPD/flipped"
victim=$(find "$TMPD/flipped/files" -type f -size +0 | sort | head -n1)
[ -n "$victim" ] || fail "the export has no non-empty file: $(find "$EXP")"
python3 -c '
import os, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 0x40; open(p, "wb").write(b)' "$victim"
rel=${victim#"$TMPD/flipped/"}
"$STRATA" backup verify "$TMPD/flipped" --quiet 2>"$TMPD/2f.err" && fail "verify accepted a flipped byte"
grep -qF "$rel: checksum mismatch" "$TMPD/2f.err" || fail "flipped byte: $(cat "$TMPD/2f.err")"
echo "ok: $(cat "$TMPD/2.out")"

echo "== 3. instance B: damaged import refused, intact import READY"
"$STRATA" up --dir "$DIRB" --port "$PORTB" --clusters 1 --nodes 1 || fail "strata up (B) failed"
bkb import "$TMPD/flipped" --as b9 >/dev/null 2>"$TMPD/3f.err" && fail "damaged import succeeded"
grep -qF "$rel: checksum mismatch" "$TMPD/3f.err" || fail "damaged import: $(cat "$TMPD/3f.err")"
bkb describe b9 >/dev/null 2>&1 && fail "b9 stayed on B after a failed import"
bkb import "$EXP" >"$TMPD/3.out" 2>&1 || fail "import: $(cat "$TMPD/3.out")"
bkb describe b1 | grep -q '^state: *READY' || fail "b1 on B is not READY: $(bkb describe b1)"
echo "ok: $(cat "$TMPD/3.out")"

echo "== 4. restore on B, same rows as A"
bkb restore b1 --to bk2 --wait >"$TMPD/4.out" 2>&1 || fail "restore: $(cat "$TMPD/4.out")"
cbtat "$PORTB" read bk2 >"$TMPD/b.read" || fail "cbt read bk2 on B"
diff "$TMPD/a.read" "$TMPD/b.read" >"$TMPD/4.diff" || fail "bk2 on B differs from bk on A: $(cat "$TMPD/4.diff")"
echo "ok: $(grep -c '^----' "$TMPD/b.read") rows identical"

echo "== 5. a table split while loading: its pieces share files, exported once, imported once"
timeout 120 "$STRATA" bench --dir "$DIR" --project p --instance i --table sp --workload bulkwrite \
  --dist sequential --keys 48 --requests 1 --value-size 65536 --no-lag --quiet >"$TMPD/5l.out" 2>&1 ||
  fail "loading sp: $(cat "$TMPD/5l.out")"
# the splits run in the background: back up until the pieces share a file (at most 60 tries)
for try in $(seq 1 60); do
  bka create sp --id s1 --expire 1d --wait >"$TMPD/5c.out" 2>&1 || fail "create s1: $(cat "$TMPD/5c.out")"
  rm -rf "$TMPD/sp-exp"
  bka export s1 "$TMPD/sp-exp" >"$TMPD/5e.out" 2>&1 || fail "export s1: $(cat "$TMPD/5e.out")"
  listed=$(grep -c '^file ' "$TMPD/sp-exp/MANIFEST")
  distinct=$(awk '$1 == "file" { print $5 "." $2 }' "$TMPD/sp-exp/MANIFEST" | sort -u | wc -l)
  [ "$listed" -gt "$distinct" ] && break
  bka delete s1 >/dev/null 2>&1 || fail "delete s1"
  sleep 1
done
stored=$(ls "$TMPD/sp-exp/files" | wc -l)
[ "$stored" -eq "$distinct" ] || fail "files/ holds $stored files for $distinct distinct contents"
[ "$listed" -gt "$distinct" ] || fail "no piece shares a file after $try tries ($listed listed, $distinct distinct): sp did not split"
"$STRATA" backup verify "$TMPD/sp-exp" --quiet --json >"$TMPD/5v.json" 2>"$TMPD/5v.err" || fail "verify s1: $(cat "$TMPD/5v.err")"
# the summary gives the bytes stored once (what was moved and what DIR holds) beside the listed
on_disk=$(find "$TMPD/sp-exp/files" -type f -printf '%s\n' | awk '{ n += $1 } END { print n }')
python3 -c 'import json, sys; v = json.load(open(sys.argv[1])); sys.exit(not (v["stored_bytes"] == int(sys.argv[2]) < v["bytes"]))' \
  "$TMPD/5v.json" "$on_disk" || fail "verify's summary: $(cat "$TMPD/5v.json"), files/ holds $on_disk bytes"
# the backup's size_bytes is what it stores (each shared file once), not the pieces' sum
bka describe s1 --json >"$TMPD/5d.json" || fail "describe s1"
python3 -c 'import json, sys; v = json.load(open(sys.argv[1])); sys.exit(int(v.get("sizeBytes", v.get("size_bytes", -1))) != int(sys.argv[2]))' \
  "$TMPD/5d.json" "$on_disk" || fail "size_bytes of s1: $(cat "$TMPD/5d.json"), its distinct files hold $on_disk bytes"
bkb import "$TMPD/sp-exp" >"$TMPD/5i.out" 2>&1 || fail "import s1: $(cat "$TMPD/5i.out")"
inodes=$(find "$DIRB"/*-0/backups/i/*/s1 -name '*.sst' -printf '%i\n' | sort -u | wc -l)
[ "$inodes" -eq "$distinct" ] ||
  fail "B's node holds $inodes files of s1 for $distinct distinct contents: a shared file was sent again"
bkb restore s1 --to sp2 --wait >"$TMPD/5r.out" 2>&1 || fail "restore s1: $(cat "$TMPD/5r.out")"
cbtat "$PORT" read sp >"$TMPD/sp.a" || fail "cbt read sp on A"
cbtat "$PORTB" read sp2 >"$TMPD/sp.b" || fail "cbt read sp2 on B"
[ "$(grep -c '^----' "$TMPD/sp.a")" -gt 0 ] || fail "sp on A is empty"
cmp -s "$TMPD/sp.a" "$TMPD/sp.b" || fail "sp2 on B differs from sp on A"
echo "ok: $listed files listed, $distinct distinct, each stored and sent once; $(grep -c '^----' "$TMPD/sp.b") rows identical"
echo PASS
