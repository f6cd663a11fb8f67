#!/usr/bin/env bash
# backup_cli_fake_test.sh — `strata backup` against backup_fake_server (router and node in one
# process, pieces as plain files), so the CLI is tested apart from the real router and node:
#   1. create --wait, list (--json, across pages), describe, delete, restore --wait;
#   2. export b1 -> verify OK; the export's files equal the backup's, byte for byte, although the
#      fake drops the first stream of 000001.sst after 1 MiB (the export resumes at the offset);
#      the file p0 and p1 share is one file of files/ (format 3, files/<piece>.<name>); format 2
#      (files/<sha256>) and format 1 (pieces/) exports (STRATA_BACKUP_EXPORT_FORMAT) still verify;
#   3. a flipped byte (in the shared file), a truncated file, a missing file: verify refuses,
#      naming the piece's file;
#   4. import of the intact export as b2: the server's files equal the originals, the shared file
#      sent once and linked, b2 READY; an import over a sealed piece an earlier failed import
#      left clears it; the format 1 and 2 exports import too;
#   5. import of a damaged export (format 3, and format 2): refused naming the file, and the
#      backup does not stay behind;
#   6. export into a directory that is not empty: refused, the directory untouched;
#   7. import pipelined (a second fake, --window): a file bigger than the CLI's window of chunks
#      and several files arrive whole with several chunks in flight at once; a node error in the
#      middle of a window is reported (naming the file and offset) and the import leaves nothing.
# Usage: backup_cli_fake_test.sh PATH/TO/strata PATH/TO/backup_fake_server
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
FAKE=$2
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
tmp=$(make_tmp)
bad() { echo "FAIL: $*" >&2; exit 1; }

"$FAKE" "$tmp/root" --drop-once >"$tmp/fake.log" 2>&1 &
PIDS+=("$!")
ADDR=$(wait_line "$tmp/fake.log" '127\.0\.0\.1:[0-9]+') || bad "the fake server did not start"
BK=(timeout 120 "$STRATA" backup --endpoint "$ADDR" --cluster c1 --quiet)

echo "== 1. create, list, describe, delete, restore"
"${BK[@]}" create t --id made --expire 2d --wait >"$tmp/1.out" 2>&1 || bad "create: $(cat "$tmp/1.out")"
grep -q '^state: *READY' "$tmp/1.out" || bad "create --wait did not print a READY backup: $(cat "$tmp/1.out")"
"${BK[@]}" list --json >"$tmp/1.json" 2>&1 || bad "list: $(cat "$tmp/1.json")"
python3 -c '
import json, sys
ids = sorted(b["id"] for b in json.load(open(sys.argv[1])))
assert ids == ["b1", "made"], ids' "$tmp/1.json" || bad "list --json: $(cat "$tmp/1.json")"
"${BK[@]}" list | grep -q '^made ' || bad "list: no row for made"
"${BK[@]}" describe b1 --json | python3 -c '
import json, sys
b = json.load(sys.stdin)
assert b["state"] == "READY" and b["source_table"].endswith("/tables/t"), b
assert b["size_bytes"] == 2 * (3 * 2**20 + 17) + 100 * 1024, b' || bad "describe b1"
"${BK[@]}" delete made >/dev/null || bad "delete made"
"${BK[@]}" describe made >/dev/null 2>&1 && bad "describe of a deleted backup succeeded"
"${BK[@]}" restore b1 --to t2 --wait >"$tmp/1r.out" 2>&1 || bad "restore: $(cat "$tmp/1r.out")"
grep -q 'restored .*backups/b1 into projects/p/instances/i/tables/t2' "$tmp/1r.out" ||
  bad "restore output: $(cat "$tmp/1r.out")"
"${BK[@]}" restore b1 >/dev/null 2>&1; [ $? -eq 2 ] || bad "restore without --to is not bad usage"
echo ok

echo "== 2. export, verify"
timeout 120 "$STRATA" backup --endpoint "$ADDR" --cluster c1 export b1 "$tmp/exp" >"$tmp/2.out" \
  2>"$tmp/2.err" || bad "export: $(cat "$tmp/2.err")"
grep -q 'retrying from byte 1048576' "$tmp/2.err" || bad "no resumed stream: $(cat "$tmp/2.err")"
grep -q 'exported .*b1 into' "$tmp/2.out" || bad "export output: $(cat "$tmp/2.out")"
# where piece/file is: files/<piece that holds it>.<name>, from the manifest's `file` line
at() {
  awk -v p="${1%%/*}" -v f="${1#*/}" '$1 == "piece" { cur = $2 }
    $1 == "file" && cur == p && $2 == f { print "files/" $5 "." $2 }' "$tmp/exp/MANIFEST"
}
[ "$(at p1/000001.sst)" = files/p0.000001.sst ] || bad "p1's 000001.sst is not p0's: $(at p1/000001.sst)"
for f in p0/000001.sst p0/000002.sst p1/000003.sst p1/000001.sst; do
  cmp "$tmp/root/b1/$f" "$tmp/exp/$(at "$f")" || bad "exported $f differs from the backup's"
done
# each content once: the file both pieces hold is one file (4 listed, 3 distinct), no pieces/
[ "$(ls "$tmp/exp/files" | wc -l)" -eq 3 ] || bad "files/ holds $(ls "$tmp/exp/files")"
[ ! -e "$tmp/exp/pieces" ] || bad "a version 3 export has pieces/"
grep -q '^strata-backup-export 3$' "$tmp/exp/MANIFEST" || bad "the export is not format 3"
[ -z "$(find "$tmp/exp" -name '*.tmp')" ] || bad "temporary files left in the export"
"$STRATA" backup verify "$tmp/exp" --quiet >"$tmp/2v.out" 2>&1 || bad "verify: $(cat "$tmp/2v.out")"
grep -q '^verified ' "$tmp/2v.out" || bad "verify output: $(cat "$tmp/2v.out")"
grep -q '^schema 0a' "$tmp/exp/MANIFEST" || bad "no schema in the manifest"
# the earlier layout (format 1, pieces/<piece>/<file>, shared files hard-linked) still verifies
STRATA_BACKUP_EXPORT_FORMAT=1 timeout 120 "$STRATA" backup --endpoint "$ADDR" --cluster c1 \
  --quiet export b1 "$tmp/exp1" >/dev/null 2>"$tmp/2o.err" || bad "format 1 export: $(cat "$tmp/2o.err")"
grep -q '^strata-backup-export 1$' "$tmp/exp1/MANIFEST" || bad "the legacy export is not format 1"
for f in p0/000001.sst p0/000002.sst p1/000003.sst p1/000001.sst; do
  cmp "$tmp/root/b1/$f" "$tmp/exp1/pieces/$f" || bad "format 1: exported $f differs"
done
"$STRATA" backup verify "$tmp/exp1" --quiet >/dev/null 2>"$tmp/2o.err" || bad "verify format 1: $(cat "$tmp/2o.err")"
# format 2 (files/<sha256>, SHA-256 per file) still verifies
STRATA_BACKUP_EXPORT_FORMAT=2 timeout 120 "$STRATA" backup --endpoint "$ADDR" --cluster c1 \
  --quiet export b1 "$tmp/exp2v" >/dev/null 2>"$tmp/2t.err" || bad "format 2 export: $(cat "$tmp/2t.err")"
grep -q '^strata-backup-export 2$' "$tmp/exp2v/MANIFEST" || bad "the legacy export is not format 2"
for f in p0/000001.sst p0/000002.sst p1/000003.sst p1/000001.sst; do
  sha=$(sha256sum "$tmp/root/b1/$f" | cut -c1-64)
  cmp "$tmp/root/b1/$f" "$tmp/exp2v/files/$sha" || bad "format 2: exported $f differs"
done
"$STRATA" backup verify "$tmp/exp2v" --quiet >/dev/null 2>"$tmp/2t.err" || bad "verify format 2: $(cat "$tmp/2t.err")"
echo ok

echo "== 3. damaged exports refused, naming the file"
damaged() { rm -rf "$tmp/dmg"; cp -r "$tmp/exp" "$tmp/dmg"; } # cp -r: links become copies
damaged
python3 -c '
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read()); b[123457] ^= 1; open(p, "wb").write(b)' "$tmp/dmg/$(at p0/000001.sst)"
"$STRATA" backup verify "$tmp/dmg" --quiet 2>"$tmp/3a.err" && bad "verify accepted a flipped byte"
grep -q "file 000001.sst of piece p0: .*$(at p0/000001.sst): checksum mismatch" "$tmp/3a.err" ||
  bad "flipped byte: $(cat "$tmp/3a.err")"
cp -r "$tmp/dmg" "$tmp/dmg-flipped"
damaged; truncate -s 1000 "$tmp/dmg/$(at p1/000003.sst)"
"$STRATA" backup verify "$tmp/dmg" --quiet 2>"$tmp/3b.err" && bad "verify accepted a truncated file"
grep -q 'file 000003.sst of piece p1: .* has 1000 bytes' "$tmp/3b.err" || bad "truncated: $(cat "$tmp/3b.err")"
damaged; rm "$tmp/dmg/$(at p0/000002.sst)"
"$STRATA" backup verify "$tmp/dmg" --quiet 2>"$tmp/3c.err" && bad "verify accepted a missing file"
grep -q 'file 000002.sst of piece p0: .* is missing' "$tmp/3c.err" || bad "missing: $(cat "$tmp/3c.err")"
damaged; rm "$tmp/dmg/MANIFEST"
"$STRATA" backup verify "$tmp/dmg" --quiet 2>"$tmp/3d.err" && bad "verify accepted no manifest"
grep -q 'MANIFEST is missing' "$tmp/3d.err" || bad "no manifest: $(cat "$tmp/3d.err")"
echo ok

echo "== 4. import as b2"
"${BK[@]}" import "$tmp/exp" --as b2 >"$tmp/4.out" 2>&1 || bad "import: $(cat "$tmp/4.out")"
grep -q 'imported .*backups/b2 from' "$tmp/4.out" || bad "import output: $(cat "$tmp/4.out")"
for f in p0/000001.sst p0/000002.sst p1/000003.sst p1/000001.sst; do
  cmp "$tmp/root/b1/$f" "$tmp/root/b2/$f" || bad "imported $f differs"
done
"${BK[@]}" describe b2 | grep -q '^state: *READY' || bad "b2 is not READY"
# the file p0 and p1 share went over the wire once: the server linked it into p1
[ "$(stat -c %i "$tmp/root/b2/p0/000001.sst")" = "$(stat -c %i "$tmp/root/b2/p1/000001.sst")" ] ||
  bad "the file shared by p0 and p1 was sent twice instead of linked"
"${BK[@]}" import "$tmp/exp" --as b2 >/dev/null 2>"$tmp/4b.err" && bad "import over b2 succeeded"
grep -q 'ALREADY_EXISTS' "$tmp/4b.err" || bad "import over b2: $(cat "$tmp/4b.err")"
# a sealed piece of b6 left on the node by an earlier import of b6 that failed while the node was
# down: the import clears it instead of failing ALREADY_EXISTS
mkdir -p "$tmp/root/b6/p0" && touch "$tmp/root/b6/p0/SEALED"
"${BK[@]}" import "$tmp/exp" --as b6 >"$tmp/4d.out" 2>&1 || bad "import over a leftover: $(cat "$tmp/4d.out")"
"${BK[@]}" import "$tmp/exp1" --as b4 >"$tmp/4c.out" 2>&1 || bad "import of format 1: $(cat "$tmp/4c.out")"
for f in p0/000001.sst p0/000002.sst p1/000003.sst p1/000001.sst; do
  cmp "$tmp/root/b1/$f" "$tmp/root/b4/$f" || bad "imported (format 1) $f differs"
done
"${BK[@]}" import "$tmp/exp2v" --as b5 >"$tmp/4e.out" 2>&1 || bad "import of format 2: $(cat "$tmp/4e.out")"
for f in p0/000001.sst p0/000002.sst p1/000003.sst p1/000001.sst; do
  cmp "$tmp/root/b1/$f" "$tmp/root/b5/$f" || bad "imported (format 2) $f differs"
done
echo ok

echo "== 5. a damaged import leaves nothing"
"${BK[@]}" import "$tmp/dmg-flipped" --as b3 >/dev/null 2>"$tmp/5.err" && bad "damaged import succeeded"
grep -q "file 000001.sst of piece p0: .*checksum mismatch" "$tmp/5.err" || bad "damaged import: $(cat "$tmp/5.err")"
[ ! -e "$tmp/root/b3" ] || bad "the failed import left files: $(find "$tmp/root/b3")"
grep -q 'was deleted' "$tmp/5.err" || bad "damaged import did not say it deleted b3: $(cat "$tmp/5.err")"
"${BK[@]}" describe b3 >/dev/null 2>&1 && bad "b3 stayed after a failed import"
# format 2: the SHA-256 tells
rm -rf "$tmp/dmg2" && cp -r "$tmp/exp2v" "$tmp/dmg2"
f2="$tmp/dmg2/files/$(sha256sum "$tmp/root/b1/p1/000003.sst" | cut -c1-64)"
python3 -c '
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read()); b[4321] ^= 4; open(p, "wb").write(b)' "$f2"
"$STRATA" backup verify "$tmp/dmg2" --quiet 2>"$tmp/5b.err" && bad "verify accepted a flipped byte (format 2)"
grep -q "file 000003.sst of piece p1: .*checksum mismatch" "$tmp/5b.err" || bad "flipped byte (format 2): $(cat "$tmp/5b.err")"
"${BK[@]}" import "$tmp/dmg2" --as b7 >/dev/null 2>"$tmp/5c.err" && bad "damaged import (format 2) succeeded"
grep -q "file 000003.sst of piece p1: .*SHA-256 differs" "$tmp/5c.err" || bad "damaged import (format 2): $(cat "$tmp/5c.err")"
"${BK[@]}" describe b7 >/dev/null 2>&1 && bad "b7 stayed after a failed import"
echo ok

echo "== 6. export into a non-empty directory"
mkdir -p "$tmp/full" && echo keep >"$tmp/full/x"
"${BK[@]}" export b1 "$tmp/full" >/dev/null 2>"$tmp/6.err" && bad "export into a full directory succeeded"
grep -q 'not empty' "$tmp/6.err" || bad "full dir: $(cat "$tmp/6.err")"
[ "$(ls "$tmp/full")" = x ] || bad "the non-empty directory was changed"
echo ok

echo "== 7. import pipelined; a node error in the middle of the window"
"$FAKE" "$tmp/root2" --window >"$tmp/fake2.log" 2>&1 &
PIDS+=("$!")
ADDR2=$(wait_line "$tmp/fake2.log" '127\.0\.0\.1:[0-9]+') || bad "the second fake server did not start"
BK2=(timeout 120 "$STRATA" backup --endpoint "$ADDR2" --cluster c1 --quiet)
"${BK2[@]}" export b1 "$tmp/exp2" >/dev/null 2>"$tmp/7a.err" || bad "export (--window): $(cat "$tmp/7a.err")"
"${BK2[@]}" import "$tmp/exp2" --as b2 >"$tmp/7b.out" 2>&1 || bad "import (--window): $(cat "$tmp/7b.out")"
for f in p0/000001.sst p0/000002.sst p1/000003.sst p1/000001.sst; do
  cmp "$tmp/root2/b1/$f" "$tmp/root2/b2/$f" || bad "imported (--window) $f differs"
done
most=$(sed -n 's/^fake: chunks in flight //p' "$tmp/fake2.log" | tail -n1)
[ "${most:-0}" -ge 4 ] || bad "at most ${most:-0} chunks were in flight at once: the import does not pipeline"
"${BK2[@]}" import "$tmp/exp2" --as fail1 >/dev/null 2>"$tmp/7c.err" && bad "import through a failing node succeeded"
grep -q "WriteBackupFile 000001.sst (offset 5242880) at .*RESOURCE_EXHAUSTED.*no space left" "$tmp/7c.err" ||
  bad "failing node: $(cat "$tmp/7c.err")"
grep -q 'was deleted' "$tmp/7c.err" || bad "failing node: did not say it deleted fail1: $(cat "$tmp/7c.err")"
[ ! -e "$tmp/root2/fail1" ] || bad "the failed import left files: $(find "$tmp/root2/fail1")"
"${BK2[@]}" describe fail1 >/dev/null 2>&1 && bad "fail1 stayed after a failed import"
echo "PASS"
