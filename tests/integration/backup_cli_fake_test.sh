#!/usr/bin/env bash
# backup_cli_fake_test.sh — `strata backup` against backup_fake_server (router and node in one
# process, pieces as plain files), so the CLI is tested apart from the real router and node:
#   1. create --wait, list (--json, across pages), describe, delete, restore --wait;
#   2. export b1 -> verify OK; the export's files equal the backup's, byte for byte, although the
#      fake drops the first stream of 000001.sst after 1 MiB (the export resumes at the offset);
#   3. a flipped byte, a truncated file, a missing file: verify refuses, naming the file;
#   4. import of the intact export as b2: the server's files equal the originals, b2 READY;
#   5. import of a damaged export: refused naming the file, and b3 does not stay behind;
#   6. export into a directory that is not empty: refused, the directory untouched.
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
for f in p0/000001.sst p0/000002.sst p1/000003.sst p1/000001.sst; do
  cmp "$tmp/root/b1/$f" "$tmp/exp/pieces/$f" || bad "exported $f differs from the backup's"
done
# the file both pieces hold was read once and hard linked
[ "$(stat -c %i "$tmp/exp/pieces/p0/000001.sst")" = "$(stat -c %i "$tmp/exp/pieces/p1/000001.sst")" ] ||
  bad "the file shared by p0 and p1 was exported twice instead of linked"
[ -z "$(find "$tmp/exp" -name '*.tmp')" ] || bad "temporary files left in the export"
"$STRATA" backup verify "$tmp/exp" --quiet >"$tmp/2v.out" 2>&1 || bad "verify: $(cat "$tmp/2v.out")"
grep -q '^verified ' "$tmp/2v.out" || bad "verify output: $(cat "$tmp/2v.out")"
grep -q '^schema 0a' "$tmp/exp/MANIFEST" || bad "no schema in the manifest"
echo ok

echo "== 3. damaged exports refused, naming the file"
damaged() { rm -rf "$tmp/dmg"; cp -r "$tmp/exp" "$tmp/dmg"; } # cp -r: links become copies
damaged
python3 -c '
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read()); b[123457] ^= 1; open(p, "wb").write(b)' "$tmp/dmg/pieces/p0/000001.sst"
"$STRATA" backup verify "$tmp/dmg" --quiet 2>"$tmp/3a.err" && bad "verify accepted a flipped byte"
grep -q 'pieces/p0/000001.sst: checksum mismatch' "$tmp/3a.err" || bad "flipped byte: $(cat "$tmp/3a.err")"
cp -r "$tmp/dmg" "$tmp/dmg-flipped"
damaged; truncate -s 1000 "$tmp/dmg/pieces/p1/000003.sst"
"$STRATA" backup verify "$tmp/dmg" --quiet 2>"$tmp/3b.err" && bad "verify accepted a truncated file"
grep -q 'pieces/p1/000003.sst has 1000 bytes' "$tmp/3b.err" || bad "truncated: $(cat "$tmp/3b.err")"
damaged; rm "$tmp/dmg/pieces/p0/000002.sst"
"$STRATA" backup verify "$tmp/dmg" --quiet 2>"$tmp/3c.err" && bad "verify accepted a missing file"
grep -q 'pieces/p0/000002.sst is missing' "$tmp/3c.err" || bad "missing: $(cat "$tmp/3c.err")"
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
"${BK[@]}" import "$tmp/exp" --as b2 >/dev/null 2>"$tmp/4b.err" && bad "import over b2 succeeded"
grep -q 'ALREADY_EXISTS' "$tmp/4b.err" || bad "import over b2: $(cat "$tmp/4b.err")"
echo ok

echo "== 5. a damaged import leaves nothing"
"${BK[@]}" import "$tmp/dmg-flipped" --as b3 >/dev/null 2>"$tmp/5.err" && bad "damaged import succeeded"
grep -q 'pieces/p0/000001.sst: checksum mismatch' "$tmp/5.err" || bad "damaged import: $(cat "$tmp/5.err")"
grep -q 'was deleted' "$tmp/5.err" || bad "damaged import did not say it deleted b3: $(cat "$tmp/5.err")"
"${BK[@]}" describe b3 >/dev/null 2>&1 && bad "b3 stayed after a failed import"
echo ok

echo "== 6. export into a non-empty directory"
mkdir -p "$tmp/full" && echo keep >"$tmp/full/x"
"${BK[@]}" export b1 "$tmp/full" >/dev/null 2>"$tmp/6.err" && bad "export into a full directory succeeded"
grep -q 'not empty' "$tmp/6.err" || bad "full dir: $(cat "$tmp/6.err")"
[ "$(ls "$tmp/full")" = x ] || bad "the non-empty directory was changed"
echo "PASS"
