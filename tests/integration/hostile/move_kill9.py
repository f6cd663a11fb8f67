#!/usr/bin/env python3
"""move_kill9.py PORT DIR STRATA [source|target] — on `strata up --dir DIR --clusters 2 --nodes 2`
(or --clusters 1): a table's only tablet, on east-1, holds 8,000 rows of 4 KB; MoveTablet to
east-0 is started and, 150 ms later (the copy half done), the source (east-1) or the target
(east-0) is killed with kill -9 and restarted with `strata up`. Then both nodes must not list a
tablet for the same rows, and every read through the router (40, each after a write and a
refreshed tablet map) must return every acknowledged row.
Written against a build where both nodes then kept a writable tablet [, ) — the source its full
one, the target the partial copy nobody dropped — and the router's map took either (reads returned
3,085 of 8,040 rows). It passes since a move's copy stays incoming until the source activates it
(docs/cluster.md, moves)."""
import os, signal, subprocess, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import *
from csconsumer import Checks

port, d, strata = int(sys.argv[1]), sys.argv[2], sys.argv[3]
victim = sys.argv[4] if len(sys.argv) > 4 else 'source'
checks = Checks()
T = 'mk%d' % (now_us() % 100000)
print('create', create_cs(port, T)[1:])
east = [n for n in topology_nodes(d) if n[0].startswith('east')]
ports = dict(east)
if not tablets_on(ports['east-1'], T):
    move_tablet(east, T, '')  # the tablet to east-1, while it is empty
N, VAL = 8000, 'x' * 4000
for b in range(0, N, 200):
    body = fld(1, tname(T)) + b''.join(fld(2, fld(1, 'r%05d' % j) + fld(2, set_cell('cf', 'q', VAL)))
                                       for j in range(b, b + 200))
    checks.expect('rows %d..' % b, call(port, BT + 'MutateRows', body)[2] == 'end')
tab = tablets_on(ports['east-1'], T)[0]
res = {}
th = threading.Thread(target=lambda: res.update(r=call(ports['east-1'], '/strata.internal.v1.Node/MoveTablet',
                                                        fld(1, tab[0]) + fld(2, '127.0.0.1:%d' % ports['east-0']),
                                                        limit=60)[1:]))
th.start()
time.sleep(0.15)
dead = 'east-1' if victim == 'source' else 'east-0'
os.kill(int(open(os.path.join(d, 'run', dead + '.pid')).read()), signal.SIGKILL)
th.join()
print('move:', res.get('r'), '; kill -9', dead)
time.sleep(0.3)
print('strata up:', subprocess.run([strata, 'up', '--dir', d], capture_output=True).returncode)
time.sleep(10)  # room for any cleanup
held = [(n, t[1], t[2]) for n, p in east for t in tablets_on(p, T)]
checks.expect('one node holds the rows', len(held) == 1, '%s' % held)
short = []
for i in range(40):
    call(port, BT + 'GenerateInitialChangeStreamPartitions', fld(1, tname(T)))  # refreshes the map
    mutate(port, T, 'w%03d' % i, [set_cell('cf', 'q', 'v')])
    keys, why = row_keys(port, T)
    if len(keys) < N + i + 1: short.append(len(keys))
checks.expect('every read returns every acknowledged row', not short,
              '%d of 40 reads short: %s' % (len(short), sorted(set(short))[:5]))
checks.exit()
