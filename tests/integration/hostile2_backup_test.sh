#!/usr/bin/env bash
# hostile2_backup_test.sh — backups attacked from the outside on `strata up` (one cluster, one
# node), docs/backups.md:
#   1. an export whose manifest is re-signed with a piece frozen in the year 287,000 (its
#      checksums all match) is refused by verify (frozen_us far outside start_us..end_us); one
#      re-signed as a backup made in the year 3000 (its times consistent) is accepted by verify
#      and import (they cannot know the node's clock), but the restore must be refused naming the
#      piece, leave no table, and leave the node's clock alone. It used to restore, and the
#      node's clock (the version of every later write, change-stream times) jumped ahead;
#   2. exports whose SSTable is garbage or has a flipped byte, each re-signed so every
#      checksum matches: the import's seal reads the file through and refuses it naming the
#      file, no backup or table left;
#   3. after all that a genuine restore works, and a write to the restored table wins over the
#      restored cell;
#   4. ListBackups filters with impossible times and sizes (hostile2_backup_filter.js through the
#      official Node.js client; this part is skipped without node or the installed package).
# Usage: hostile2_backup_test.sh PATH/TO/strata (skips, 77, without cbt or python3)
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")" && pwd)/hostile2_backup_filter.js
instance_init hostile2_backup
bk() { timeout 120 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
cbtq() {
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}
# forge SRC DST CASE: a copy of export SRC with its (first) piece or file changed and the
# MANIFEST re-signed, so that verify finds every checksum right.
forge() {
  python3 - "$@" <<'PY'
import hashlib, os, shutil, sys
def crc32c(data):
    crc = 0xffffffff
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82f63b78 & -(crc & 1))
    return crc ^ 0xffffffff
src, dst, case = sys.argv[1:4]
shutil.copytree(src, dst)
lines = [l for l in open(os.path.join(dst, "MANIFEST")).read().split("\n") if l and not l.startswith("end ")]
pi = next(i for i, l in enumerate(lines) if l.startswith("piece "))
fi = next(i for i, l in enumerate(lines) if l.startswith("file "))
name, _, _, last = lines[fi].split()[1:5]
v3 = lines[0].endswith(" 3")  # format 3: files/<piece>.<name>; 2: files/<sha256>
path = os.path.join(dst, "files", last + "." + name if v3 else last)
data = open(path, "rb").read()
if case == "future287":  # only the piece in the future: inconsistent with start_us / end_us
    f = lines[pi].split(); f[4] = "9000000000000000000"; lines[pi] = " ".join(f)
elif case == "future":  # the year 3000, and the backup's times with it: consistent
    y3000 = 32503680000000000
    for i, l in enumerate(lines):
        k = l.split(" ")[0]
        if k in ("start_us", "end_us"): lines[i] = "%s %d" % (k, y3000)
        if k == "expire_us": lines[i] = "expire_us %d" % (y3000 + 86400000000)
        if k == "piece": f = l.split(); f[4] = str(y3000); lines[i] = " ".join(f)
else:
    data = {"garbage": bytes((i * 7919 + 13) % 251 for i in range(len(data))),
            "half": data[:len(data) // 2],
            "flip": data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0x40]) + data[len(data) // 2 + 1:]}[case]
    if not v3:
        last = hashlib.sha256(data).hexdigest()
        path = os.path.join(dst, "files", last)
    open(path, "wb").write(data)
    lines[fi] = "file %s %d %08x %s" % (name, len(data), crc32c(data), last)
text = ("\n".join(lines) + "\n").encode()
text += b"end %08x %s\n" % (crc32c(text), hashlib.sha256(text).hexdigest().encode())
open(os.path.join(dst, "MANIFEST"), "wb").write(text)
PY
}

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >/dev/null || fail "strata up failed"
cbtq createtable t families=cf >/dev/null || fail "createtable t"
for r in a b c; do cbtq set t "$r" "cf:v=$r" >/dev/null || fail "set $r"; done
bk create t --id src --wait >/dev/null || fail "create src"
bk export src "$TMPD/exp" >/dev/null || fail "export src"

echo "== 1. a piece frozen in the year 287,000, then one of a backup made in the year 3000"
forge "$TMPD/exp" "$TMPD/future287" future287 || fail "forge future287"
"$STRATA" backup verify "$TMPD/future287" --quiet >/dev/null 2>"$TMPD/1v.err" &&
  fail "verify accepted a piece frozen long after its backup's end_us"
grep -q 'frozen_us' "$TMPD/1v.err" || fail "verify future287: $(cat "$TMPD/1v.err")"
forge "$TMPD/exp" "$TMPD/future" future || fail "forge future"
"$STRATA" backup verify "$TMPD/future" --quiet >/dev/null || fail "the re-signed export does not verify"
bk import "$TMPD/future" --as future >/dev/null || fail "import future"
bk restore future --to rfuture --wait >/dev/null 2>"$TMPD/1.err" && fail "a piece frozen in the year 3000 was restored"
grep -q 'ahead of this node' "$TMPD/1.err" || fail "restore future: $(cat "$TMPD/1.err")"
cbtq read rfuture >/dev/null 2>&1 && fail "rfuture exists after its restore failed"
echo "ok: $(head -c 300 "$TMPD/1.err")"

echo "== 2. re-signed SSTables that are garbage or have a flipped byte"
for c in garbage flip; do
  forge "$TMPD/exp" "$TMPD/$c" "$c" || fail "forge $c"
  bk import "$TMPD/$c" --as "$c" >/dev/null 2>"$TMPD/2.err" && fail "import of a $c SSTable succeeded"
  grep -q 'DATA_LOSS.*file [0-9]*\.sst: ' "$TMPD/2.err" || fail "import $c: $(cat "$TMPD/2.err")"
  bk restore "$c" --to "r$c" --wait >/dev/null 2>&1 && fail "restore of a refused $c import succeeded"
  cbtq read "r$c" >/dev/null 2>&1 && fail "r$c exists after its import failed"
  echo "ok: $c: $(grep -o 'file [0-9]*\.sst: .*' "$TMPD/2.err" | head -c 200)"
done

echo "== 3. a genuine restore still works, and later writes win"
bk restore src --to rsrc --wait >/dev/null || fail "restore src"
cbtq set rsrc a cf:v=new >/dev/null || fail "set rsrc a"
got=$(cbtq lookup rsrc a cells-per-column=1 | grep -A1 'cf:v' | tail -1 | tr -d ' "')
[ "$got" = new ] || fail "rsrc a reads '$got' after writing 'new' to it"
[ "$(cbtq count rsrc | tail -1)" = 3 ] || fail "rsrc does not hold 3 rows"
echo "ok"

echo "== 4. ListBackups filters with impossible times and sizes"
if ! command -v node >/dev/null || [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "skipped: node or @google-cloud/bigtable (installed by nodejs_client_test) missing"
  exit 0
fi
BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT NODE_PATH="$CACHE/node_modules" timeout 120 node "$JS" >"$TMPD/js.out" 2>&1
rc=$?
grep -E '^(ok|FAIL)' "$TMPD/js.out"
[ $rc = 0 ] || fail "hostile2_backup_filter.js failed (exit $rc): $(grep -v '^ok' "$TMPD/js.out" | head -20)"
echo "PASS"
