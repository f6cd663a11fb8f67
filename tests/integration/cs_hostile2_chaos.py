#!/usr/bin/env python3
"""cs_hostile2_chaos.py chaos|failover PORT DIR STRATA — at-least-once and per-row order of a change stream
read by `strata changes --follow --checkpoint` through the router of `strata up --dir DIR
--clusters 1 --nodes 2`, while a writer updates 24 rows in turn and, one after another:
the consumer is killed with kill -9 (and started again from its checkpoint), the table's tablet
is split (SplitTablet on its node), one half is moved to the other node (MoveTablet), the node
holding a half is killed with kill -9 and restarted (`strata up`), and the consumer is killed
again. Every acknowledged write must be printed (a writer log against the consumer's output),
and the first appearance of each row's values must follow the order of the writes.
With `failover` (on `strata up --clusters 2 --nodes 1`) the consumer and the writer use a
single-cluster app profile of cluster east, which `strata failover` points at west halfway while
both run; the consumer is killed with kill -9 after that and resumes from its checkpoint (east's
tokens) on west. The order check then holds for the writes before and after the failover apart.
Exit 0 when both hold, 1 otherwise (what is missing or out of order is printed)."""
import os, random, signal, subprocess, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from cslib import *
from csconsumer import Stream

mode = sys.argv[1]
s = Stream(int(sys.argv[2]), sys.argv[3], sys.argv[4], 'chaos', profile='fo' if mode == 'failover' else None)
port, d, T, PROFILE = s.port, s.d, s.table, s.profile
ROWS = ['%c%02d' % (chr(ord('a') + i % 24), i) for i in range(24)]
WRITES = 600          # the writer's total, chaos events at fixed shares of it
acked, unsure, stop, epoch = [], set(), threading.Event(), [0]


def writer():
    c, seq = None, 0
    while not stop.is_set() and seq < WRITES:
        row = ROWS[seq % len(ROWS)]
        try:
            c = c or Conn(port, timeout=20)
            data, st, why = call(port, BT + 'MutateRow',
                                 fld(1, tname(T)) + (fld(4, PROFILE) if PROFILE else b'') + fld(2, row) + fld(3, set_cell('cf', 'q', 'v%05d' % seq)),
                                 limit=20, conn=c)
            if why == 'end' and len(data) >= 5: acked.append((row, seq, epoch[0]))
            else:
                if why != 'end': unsure.add(row); c = None  # may still apply later: no order check
                time.sleep(0.05)
        except Exception:
            unsure.add(row); c = None; time.sleep(0.05)
        seq += 1
        time.sleep(0.01)


def kill_consumer(what):
    time.sleep(random.random() * 0.3)
    s.kill_consumer('chaos %s, %d acked' % (what, len(acked)))
    s.start_consumer()


def wait_acked(n):
    for _ in range(1200):
        if len(acked) >= n or stop.is_set(): return
        time.sleep(0.1)
    s.fail('the writer is stuck at %d acknowledged writes' % len(acked))


def chaos():
    nodes = topology_nodes(d)
    wait_acked(WRITES // 8); kill_consumer('1')
    wait_acked(WRITES * 2 // 8)
    split_tablets(nodes, T, 'm')
    wait_acked(WRITES * 3 // 8); kill_consumer('2')
    wait_acked(WRITES * 4 // 8)
    if not move_tablet(nodes, T, 'm'): s.fail('no tablet starting at m after the split')
    wait_acked(WRITES * 5 // 8)
    victim = [(n, p) for n, p in nodes if any(t[1] == b'm' for t in tablets_on(p, T))] or [nodes[-1]]
    pid = int(open(os.path.join(d, 'run', victim[0][0] + '.pid')).read())
    os.kill(pid, signal.SIGKILL)
    print('chaos: kill -9 %s (pid %d), %d acked' % (victim[0][0], pid, len(acked)))
    time.sleep(0.5)
    r = subprocess.run([s.strata, 'up', '--dir', d], capture_output=True, text=True)
    print('chaos: strata up: %d' % r.returncode)
    wait_acked(WRITES * 6 // 8); kill_consumer('3')


def failover():
    wait_acked(WRITES // 4); kill_consumer('1')
    wait_acked(WRITES // 2)
    s.run('failover', PROFILE, 'west')
    epoch[0] = 1
    wait_acked(WRITES * 5 // 8); kill_consumer('2, after the failover')
    wait_acked(WRITES * 7 // 8); kill_consumer('3')


if PROFILE: s.make_profile(PROFILE, 'east')
s.create()
s.start_consumer()
wt = threading.Thread(target=writer); wt.start()
chaos() if mode == 'chaos' else failover()
wt.join(120); stop.set()
print('writer: %d acknowledged of %d, %d rows unsure' % (len(acked), WRITES, len(unsure)))

want = set('%s=v%05d' % (r_, q) for r_, q, _ in acked)
s.wait_printed('at the end', want, tries=600)
s.stop_consumer()
after = set('v%05d' % q for _, q, e in acked if e)
order = s.printed()
first, bad = {}, []
for row, v in order:
    if row in unsure: continue
    seen_vals = first.setdefault((row, v in after), [])
    if v not in seen_vals:
        if seen_vals and v < seen_vals[-1]: bad.append((row, seen_vals[-1], v))
        seen_vals.append(v)
if bad: s.fail('values of a row first printed out of write order: %s' % bad[:10])
broken = sum(1 for line in open(s.out_path, 'rb') if line.strip() and not line.startswith(b'{'))
print('consumer printed %d lines, %d distinct acknowledged writes, %d broken lines' %
      (len(order), len(want & s.seen()), broken))
s.exit()
