#!/usr/bin/env bash
# move_full_test.sh CASE NODE_BIN ROUTER_BIN — a move during which a disk fills up
# (hostile/move_full.py, docs/cluster.md, Moves): target, the target's partial copy, whose
# drop fails too, is never served after a restart; source, the source's tablet, whose drop after
# the activation fails, is never served after a restart. Needs root (a 30 MiB tmpfs for that
# node's data) and python3; skips (77) without them.
set -u
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "SKIP: python3 missing"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "SKIP: not root (cannot mount a small tmpfs)"; exit 77; }
D=$(make_tmp)
FULL=$D/$([ "$1" = source ] && echo a || echo b)
mkdir -p "$FULL"
# 30 MiB: too small for the commit log's preallocation, so its writes hit the full disk.
mount -t tmpfs -o size=30m tmpfs "$FULL" 2>/dev/null || { echo "SKIP: cannot mount a tmpfs"; exit 77; }
chmod 700 "$FULL"
timeout 240 python3 "$(dirname "$0")/hostile/move_full.py" "$1" "$2" "$3" "$D"
rc=$?
[ "$rc" = 0 ] || tail -n 30 "$D"/a.log "$D"/b.log
umount "$FULL" 2>/dev/null || umount -l "$FULL"
[ "$rc" = 0 ] || exit 1
if grep -l "Sanitizer" "$D"/*.log; then
  grep -h -A 30 "Sanitizer" "$D"/*.log | head -n 60
  exit 1
fi
echo PASS
