#!/usr/bin/env bash
# backup_schema_test.sh — an export whose schema line (re-signed, so its checksums hold) names
# a table no CreateTable could make must be refused by `strata backup verify` and `import`
# before anything is sent, and by the router's BeginImport when a client sends it anyway:
#   - a column family with a name outside [-_.a-zA-Z0-9] ("bad name/x"), or the system family
#     "\0changes" (the schema then does not even unpack: a string holding a NUL);
#   - a GC rule max_num_versions -5, a max_age of -1 s, a GC rule nested 17 levels;
#   - change_stream_config.retention_period of 10^12 s, or 0;
#   - two families of one name; bytes that are no Table at all.
# Before, verify said "verified" for all of them and import made a READY backup that no restore
# could ever use (PutTable refused the schema on every node at restore time).
# A piece whose size_bytes is not its files' sum (sent straight to BeginImport) is recorded with
# the sum: the backup's size was 2^64-1 pieces' worth wrapped (ListBackups: "16777216.0 TiB").
# A valid schema (family cf, a GC rule, change streams kept a day) still verifies, and its
# BeginImport makes a backup (CREATING; the forged ones must make none).
# Usage: backup_schema_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
tmp=$(make_tmp)
bad() { echo "FAIL: $*" >&2; exit 1; }

# schema KIND: the hex of a packed google.bigtable.admin.v2.Table. mkexport DIR HEX: a valid
# format-3 export of one piece holding one file, with that schema, signed.
export BK_PYLIB_DIR="$(cd "$(dirname "$0")" && pwd)"
PYLIB='
import os, sys
sys.path.insert(0, os.environ["BK_PYLIB_DIR"])
from bk_manifest import crc32c, signed
def varint(n):
    out = b""
    while True:
        b, n = n & 0x7f, n >> 7
        if not n:
            return out + bytes([b])
        out += bytes([b | 0x80])
def ld(f, data): return varint(f << 3 | 2) + varint(len(data)) + data
def vi(f, n): return varint(f << 3) + varint(n & (2**64 - 1))
def fam(name, gc=b""): return ld(3, ld(1, name) + ld(2, ld(1, gc)))
def nest(n): return ld(4, ld(1, nest(n - 1))) if n else vi(1, 1)
NAME = ld(1, b"projects/p/instances/i/tables/t")
SCHEMAS = {
  "good": NAME + fam(b"cf", vi(1, 2)) + fam(b"cg") + ld(8, ld(1, vi(1, 86400))),
  "badname": NAME + fam(b"cf") + fam(b"bad name/x"),
  "sysfam": NAME + fam(b"cf") + fam(b"\x00changes"),
  "gcneg": NAME + fam(b"cf", vi(1, -5)),
  "agneg": NAME + fam(b"cf", ld(2, vi(1, -1))),
  "gcdeep": NAME + fam(b"cf", nest(17)),
  "cshuge": NAME + fam(b"cf") + ld(8, ld(1, vi(1, 10**12))),
  "cszero": NAME + fam(b"cf") + ld(8, ld(1, b"")),
  "dup": NAME + fam(b"cf") + fam(b"cf", vi(1, 1)),
  "garbage": b"\xff\xff\xff",
}
'
schema() { python3 -c "$PYLIB"'
print(SCHEMAS[sys.argv[1]].hex())' "$1"; }
mkexport() {
  python3 -c "$PYLIB"'
d, schema = sys.argv[1], sys.argv[2]
data = b"not an sstable, never opened by verify " * 10
os.makedirs(os.path.join(d, "files"))
open(os.path.join(d, "files", "p0.000001.sst"), "wb").write(data)
lines = ["strata-backup-export 3", "backup projects/p/instances/i/clusters/c1/backups/h1",
         "source_table projects/p/instances/i/tables/t", "backup_type 1",
         "start_us 1796420000000000", "end_us 1796420000180000", "expire_us 1797024800000000",
         "schema " + schema, "piece p0 - - 1796420000050000",
         "file 000001.sst %d %08x p0" % (len(data), crc32c(data))]
open(os.path.join(d, "MANIFEST"), "wb").write(signed(lines))' "$1" "$2"
}

echo "== 1. verify and import refuse forged schemas (no server)"
mkexport "$tmp/good" "$(schema good)"
"$STRATA" backup verify "$tmp/good" --quiet >"$tmp/out" 2>&1 || bad "the valid export: $(cat "$tmp/out")"
for k in badname sysfam gcneg agneg gcdeep cshuge cszero dup garbage; do
  mkexport "$tmp/$k" "$(schema "$k")"
  for cmd in verify import; do
    args=(backup verify "$tmp/$k" --quiet)
    [ "$cmd" = import ] && args=(backup --endpoint 127.0.0.1:1 --cluster c1 --quiet import "$tmp/$k")
    timeout -s KILL 20 "$STRATA" "${args[@]}" >"$tmp/out" 2>&1
    rc=$?
    [ $rc -eq 1 ] || bad "$k: $cmd exit $rc (expected 1): $(cat "$tmp/out")"
    grep -q 'field schema' "$tmp/out" || bad "$k: $cmd said: $(cat "$tmp/out") (expected 'field schema')"
  done
  echo "ok: $k: $(head -c 240 "$tmp/out")"
done

echo "== 2. the router's BeginImport refuses them too"
up_single bkschema
begin() { # begin ID KIND [SIZE]: BeginImport of one piece (size_bytes SIZE, default 400: its one
  # file's size) with schema KIND; prints how the call ended
  HOSTILE=$(cd "$(dirname "$0")" && pwd)/hostile python3 -c "$PYLIB"'
sys.path.insert(0, os.environ["HOSTILE"])
from cslib import call, fld
port, bid, kind, cl, size = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
ts = lambda us: fld(1, us // 10**6)
import time
now = int(time.time() * 1e6)
backup = fld(2, "projects/p/instances/i/tables/t") + fld(3, ts(now + 7 * 86400 * 10**6)) + \
    fld(4, ts(now - 10**6)) + fld(5, ts(now)) + fld(11, 1)
piece = fld(2, "p0") + fld(6, fld(1, "000001.sst") + fld(2, 400) + fld(3, 1)) + fld(7, size) + fld(8, now)
req = fld(1, "projects/p/instances/i/clusters/" + cl) + fld(2, bid) + fld(3, backup) + \
    ld(4, SCHEMAS[kind]) + fld(5, piece)
data, st, why = call(port, "/strata.internal.v1.BackupAdmin/BeginImport", req)
print(why)  # the status is Huffman-coded: the outcome is judged by ListBackups below
' "$PORT" "$1" "$2" "$cl" "${3:-400}"
}
cl=$(sed -n 's/^\[cluster \(.*\)\]$/\1/p' "$DIR/topology" | head -n1)
for k in badname gcneg agneg gcdeep cshuge cszero dup good; do
  [ "$(begin "x$k" "$k")" = end ] || fail "BeginImport x$k: no answer"
done
# a piece whose size_bytes is not its files' sum (2^64-1: the backup's size wrapped negative)
[ "$(begin ysize good 18446744073709551615)" = end ] || fail "BeginImport ysize: no answer"
"$STRATA" backup list --dir "$DIR" >"$tmp/list" 2>&1 || fail "list: $(cat "$tmp/list")"
grep -q '^xgood ' "$tmp/list" || fail "the valid BeginImport made no backup: $(cat "$tmp/list")"
grep -v '^xgood ' "$tmp/list" | grep -q '^x' && fail "BeginImport accepted forged schemas: $(cat "$tmp/list")"
echo "ok: BeginImport made xgood only"
grep -q '^ysize .* 400 B ' "$tmp/list" || fail "ysize's size is not its file's 400 B: $(grep ysize "$tmp/list")"
echo "ok: a piece's size_bytes is its files' sum"
echo "PASS"
