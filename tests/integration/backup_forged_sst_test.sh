#!/usr/bin/env bash
# backup_forged_sst_test.sh — an export whose SSTable is replaced by a well-formed forged one and
# whose MANIFEST is re-signed (every size and CRC32C right, so `verify` accepts it) is refused by
# the import's seal when the file's contents could not come from a node (docs/backups.md "On a
# node", docs/formats/sstable.md "Verifying a file made elsewhere"), on `strata up` (one cluster,
# one node):
#   futuretomb  a row tombstone whose version is 10 years ahead (it used to hide every later
#               write to its row, acknowledged and lost);
#   futurecell  a cell whose version is 10 years ahead (a tablet move of the restored table used
#               to throw the destination node's clock, and its change streams, 10 years ahead);
#   unsorted    two entries of one data block swapped (used to be served out of order);
# each refusal names the file and what was wrong, and leaves no backup to restore. The same forger
# writing a sound file (versions at the piece's freeze, keys in order) is imported, restored and
# read back, and a write to the restored table wins: the forger is right, and genuine files pass.
# Usage: backup_forged_sst_test.sh PATH/TO/strata (skips, 77, without cbt or python3)
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
instance_init backup_forged_sst
bk() { timeout 120 "$STRATA" backup --dir "$DIR" --quiet "$@"; }
cbtq() {
  BIGTABLE_EMULATOR_HOST=127.0.0.1:$PORT timeout 60 "$CBT" -project p -instance i "$@" 2>&1 | grep -v 'creds flag unset'
  return "${PIPESTATUS[0]}"
}
# forge SRC DST KIND: a copy of the one-file export SRC whose SSTable is replaced by a forged one
# (rows r00..r19, family cf, docs/formats/sstable.md and keys.md) and whose MANIFEST is re-signed.
forge() {
  python3 - "$@" <<'PY'
import hashlib, os, shutil, struct, sys
def crc32c(data):
    crc = 0xffffffff
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82f63b78 & -(crc & 1))
    return crc ^ 0xffffffff
mask = lambda c: ((((c >> 15) | (c << 17)) & 0xffffffff) + 0xa282ead8) & 0xffffffff
def varint(n):
    o = b''
    while n >= 0x80: o += bytes([n & 0x7f | 0x80]); n >>= 7
    return o + bytes([n])
def block(ents):  # every entry a restart point: shared = 0
    out, restarts = b'', []
    for k, v in ents:
        restarts.append(len(out)); out += varint(0) + varint(len(k)) + varint(len(v)) + k + v
    return out + b''.join(struct.pack('<I', r) for r in restarts or [0]) + struct.pack('<I', len(restarts or [0]))
sealed = lambda b: b + bytes([0]) + struct.pack('<I', mask(crc32c(b + bytes([0]))))
enc = lambda x: x.replace(b'\0', b'\0\xff') + b'\0\x01'
inv = lambda v: struct.pack('>Q', 0xffffffffffffffff - v)
cell = lambda row, ts, ver: enc(row) + b'\x02' + enc(b'cf') + b'\x02' + enc(b'v') + b'\x02' + inv(ts) + inv(ver)
src, dst, kind = sys.argv[1:4]
shutil.copytree(src, dst)
lines = [l for l in open(os.path.join(dst, 'MANIFEST')).read().split('\n') if l and not l.startswith('end ')]
frozen = int(next(l for l in lines if l.startswith('piece ')).split()[4])
fi = next(i for i, l in enumerate(lines) if l.startswith('file '))
name, _, _, piece = lines[fi].split()[1:5]
now, future = frozen - 1000000, frozen + 10 * 365 * 86400 * 10**6
V = lambda us: (us << 10) | 1
ents = [(cell(b'r%02d' % i, now, V(now)), b'val%02d' % i) for i in range(20)]
if kind == 'futuretomb': ents.insert(5, (enc(b'r05') + b'\x01' + inv(V(future)), b''))
if kind == 'futurecell': ents[7] = (cell(b'r07', now, V(future)), b'future')
if kind == 'unsorted': ents[3], ents[9] = ents[9], ents[3]
f, index = b'', []
for i in range(0, len(ents), 8):
    b = block(ents[i:i + 8]); index.append((ents[i:i + 8][-1][0], varint(len(f)) + varint(len(b)))); f += sealed(b)
data_end = len(f)
filt = b'\xff' * 64 + bytes([6])  # a bloom filter that never rules a row out
fo = len(f); f += sealed(filt)
keys = [k for k, _ in ents]
meta = varint(len(min(keys))) + min(keys) + varint(len(max(keys))) + max(keys) + varint(len(ents))
mo = len(f); f += sealed(meta)
ib = block(index); io = len(f); f += sealed(ib)
foot = struct.pack('<QQQQQQQQI', io, len(ib), fo, len(filt), mo, len(meta), len(ents), data_end, 1)
f += foot + struct.pack('<I', mask(crc32c(foot))) + struct.pack('<Q', 0x0031545353415453)
open(os.path.join(dst, 'files', piece + '.' + name), 'wb').write(f)
lines[fi] = 'file %s %d %08x %s' % (name, len(f), crc32c(f), piece)
text = ('\n'.join(lines) + '\n').encode()
text += b'end %08x %s\n' % (crc32c(text), hashlib.sha256(text).hexdigest().encode())
open(os.path.join(dst, 'MANIFEST'), 'wb').write(text)
PY
}

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 >/dev/null || fail "strata up failed"
cbtq createtable t families=cf >/dev/null || fail "createtable t"
cbtq set t a cf:v=a >/dev/null || fail "set a"
bk create t --id src --wait >/dev/null || fail "create src"
bk export src "$TMPD/exp" >/dev/null || fail "export src"
[ "$(ls "$TMPD/exp/files" | wc -l)" = 1 ] || fail "the export of one row holds $(ls "$TMPD/exp/files" | wc -l) files"

echo "== 1. forged files the seal must refuse"
for k in futuretomb:'entry 5: version time' futurecell:'entry 7: version time' \
  unsorted:'entry 4: key not above the previous one'; do
  kind=${k%%:*} want=${k#*:}
  forge "$TMPD/exp" "$TMPD/$kind" "$kind" || fail "forge $kind"
  "$STRATA" backup verify "$TMPD/$kind" --quiet >/dev/null || fail "verify refused the re-signed $kind export"
  bk import "$TMPD/$kind" --as "$kind" >/dev/null 2>"$TMPD/$kind.err" && fail "the $kind export was imported"
  grep -q "DATA_LOSS" "$TMPD/$kind.err" || fail "import $kind: $(cat "$TMPD/$kind.err")"
  grep -q "file [0-9]*\.sst: data block 0, $want" "$TMPD/$kind.err" || fail "import $kind: $(cat "$TMPD/$kind.err")"
  grep -q "export the backup again" "$TMPD/$kind.err" || fail "import $kind says nothing to do: $(cat "$TMPD/$kind.err")"
  bk restore "$kind" --to "r$kind" --wait >/dev/null 2>&1 && fail "the refused $kind backup restored"
  echo "ok: $kind: $(grep -o 'file [0-9]*\.sst: .*' "$TMPD/$kind.err" | head -c 160)"
done

echo "== 2. the same forger's sound file is imported, restored and read"
forge "$TMPD/exp" "$TMPD/sound" sound || fail "forge sound"
bk import "$TMPD/sound" --as sound >/dev/null 2>"$TMPD/sound.err" || fail "import sound: $(cat "$TMPD/sound.err")"
bk restore sound --to rsound --wait >/dev/null 2>"$TMPD/sound.err" || fail "restore sound: $(cat "$TMPD/sound.err")"
[ "$(cbtq count rsound | tail -1)" = 20 ] || fail "rsound does not hold 20 rows: $(cbtq count rsound)"
cbtq set rsound r05 cf:v=new >/dev/null || fail "set rsound r05"
got=$(cbtq lookup rsound r05 cells-per-column=1 | grep -A1 'cf:v' | tail -1 | tr -d ' "')
[ "$got" = new ] || fail "rsound r05 reads '$got' after writing 'new' to it"
echo "ok"
echo "PASS"
