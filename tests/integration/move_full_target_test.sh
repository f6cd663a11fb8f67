#!/usr/bin/env bash
# move_full_target_test.sh NODE_BIN ROUTER_BIN — a move whose target's disk is full: the target's
# partial copy, whose drop fails too, is never served after a restart (hostile/move_full_target.py,
# docs/cluster.md, Moves). Needs root (a 30 MiB tmpfs for the target's data) and python3; skips
# (77) without them.
set -u
. "$(dirname "$0")/lib.sh"
command -v python3 >/dev/null || { echo "SKIP: python3 missing"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "SKIP: not root (cannot mount a small tmpfs)"; exit 77; }
D=$(make_tmp)
mkdir -p "$D/b"
# 30 MiB: too small for the commit log's preallocation, so its writes hit the full disk.
mount -t tmpfs -o size=30m tmpfs "$D/b" 2>/dev/null || { echo "SKIP: cannot mount a tmpfs"; exit 77; }
chmod 700 "$D/b"
timeout 240 python3 "$(dirname "$0")/hostile/move_full_target.py" "$1" "$2" "$D"
rc=$?
[ "$rc" = 0 ] || tail -n 30 "$D"/a.log "$D"/b.log
umount "$D/b" 2>/dev/null || umount -l "$D/b"
[ "$rc" = 0 ] || exit 1
if grep -l "Sanitizer" "$D"/*.log; then
  grep -h -A 30 "Sanitizer" "$D"/*.log | head -n 60
  exit 1
fi
echo PASS
