#!/usr/bin/env bash
# backup_hostile_dir_test.sh — `strata backup verify` and `import` on hostile export directories
# (docs/formats/backup-export.md), no server needed. A valid export is written here (two pieces,
# checksums computed by this script); then each case damages a copy and both commands must
# refuse it promptly, naming the entry, without reading anything outside DIR/pieces/:
#   - a FIFO in place of an SSTable or of MANIFEST (opening it used to block for ever);
#   - a piece directory, or pieces/ itself, that is a symbolic link to a copy outside DIR;
#   - an SSTable that is a symbolic link (to /dev/zero), a directory in place of an SSTable;
#   - a manifest whose file size is enormous, whose piece id holds "..", a truncated manifest.
# import points at an address where nothing listens: every case must be refused before it.
# Usage: backup_hostile_dir_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
tmp=$(make_tmp)
bad() { echo "FAIL: $*" >&2; exit 1; }

# mkexport DIR [SIZE_OF_FIRST_FILE]: a valid export of two pieces p0 [-, "m") and p1 ["m", -).
mkexport() {
  python3 - "$1" "${2:-}" "$(cd "$(dirname "$0")" && pwd)" <<'PY'
import hashlib, os, sys
sys.path.insert(0, sys.argv[3])
from bk_manifest import crc32c, signed
d, size0 = sys.argv[1], sys.argv[2]
files = {"p0": [("000001.sst", b"first piece " * 40)], "p1": [("000002.sst", b"second piece " * 30)]}
lines = ["strata-backup-export 1", "backup projects/p/instances/i/clusters/c1/backups/h1",
         "source_table projects/p/instances/i/tables/t", "backup_type 1",
         "start_us 1796420000000000", "end_us 1796420000180000", "expire_us 1797024800000000",
         "schema 0a0174"]
ranges = {"p0": ("-", "6d"), "p1": ("6d", "-")}
for piece in ("p0", "p1"):
    os.makedirs(os.path.join(d, "pieces", piece))
    lines.append("piece %s %s %s 1796420000050000" % (piece, *ranges[piece]))
    for name, data in files[piece]:
        open(os.path.join(d, "pieces", piece, name), "wb").write(data)
        size = size0 if (piece == "p0" and size0) else str(len(data))
        lines.append("file %s %s %08x %s" % (name, size, crc32c(data), hashlib.sha256(data).hexdigest()))
open(os.path.join(d, "MANIFEST"), "wb").write(signed(lines))
PY
}

# refused NAME EXPECT: verify and import of $tmp/h both fail (bounded: KILL after 20 s, a hang
# fails the test) with EXPECT in their message.
refused() {
  local what=$1 expect=$2 cmd
  for cmd in verify import; do
    local args=(backup verify "$tmp/h" --quiet)
    [ "$cmd" = import ] && args=(backup --endpoint 127.0.0.1:1 --cluster c1 --quiet import "$tmp/h")
    timeout -s KILL 20 "$STRATA" "${args[@]}" >"$tmp/out" 2>&1
    local rc=$?
    [ $rc -eq 137 ] && bad "$what: $cmd hung (killed after 20 s)"
    [ $rc -ne 0 ] || bad "$what: $cmd accepted it: $(cat "$tmp/out")"
    grep -qF -- "$expect" "$tmp/out" || bad "$what: $cmd said: $(cat "$tmp/out") (expected '$expect')"
  done
  echo "ok: $what: $(head -c 300 "$tmp/out")"
}
fresh() { rm -rf "$tmp/h"; cp -a "$tmp/exp" "$tmp/h"; }

mkexport "$tmp/exp"
"$STRATA" backup verify "$tmp/exp" --quiet >"$tmp/v.out" 2>&1 || bad "the valid export: $(cat "$tmp/v.out")"
mkdir -p "$tmp/outside" && cp -a "$tmp/exp/pieces/p0" "$tmp/outside/p0"

fresh; rm "$tmp/h/pieces/p0/000001.sst"; mkfifo "$tmp/h/pieces/p0/000001.sst"
refused "a FIFO in place of an SSTable" "pieces/p0/000001.sst is not a regular file"
fresh; mv "$tmp/h/MANIFEST" "$tmp/h/M"; mkfifo "$tmp/h/MANIFEST"
refused "a FIFO in place of MANIFEST" "MANIFEST is not a regular file"
fresh; rm -r "$tmp/h/pieces/p0"; ln -s "$tmp/outside/p0" "$tmp/h/pieces/p0"
refused "a piece directory linked outside" "pieces/p0 is not a directory"
fresh; mv "$tmp/h/pieces" "$tmp/pieces.elsewhere"; ln -s "$tmp/pieces.elsewhere" "$tmp/h/pieces"
refused "pieces/ linked outside" "/pieces is not a directory"
rm -rf "$tmp/pieces.elsewhere"
fresh; rm "$tmp/h/pieces/p1/000002.sst"; ln -s /dev/zero "$tmp/h/pieces/p1/000002.sst"
refused "an SSTable linked to /dev/zero" "pieces/p1/000002.sst is a symbolic link"
fresh; rm "$tmp/h/pieces/p1/000002.sst"; mkdir "$tmp/h/pieces/p1/000002.sst"
refused "a directory in place of an SSTable" "pieces/p1/000002.sst is not a regular file"
rm -rf "$tmp/h"; mkexport "$tmp/h" 999999999999999999
refused "an enormous size in the manifest" "pieces/p0/000001.sst has 480 bytes, the manifest says 999999999999999999"
fresh; sed -i 's/^piece p1 /piece ..p1 /' "$tmp/h/MANIFEST"
refused "a piece id with .." "MANIFEST"
fresh; truncate -s 200 "$tmp/h/MANIFEST"
refused "a truncated manifest" "MANIFEST"
echo PASS
