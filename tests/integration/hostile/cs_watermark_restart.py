#!/usr/bin/env python3
"""cs_watermark_restart.py PORT DIR STRATA — on `strata up --dir DIR --port PORT --clusters 2
--nodes 1`: three writes made on east while the replication links east<->west are cut, east
killed (`strata chaos kill-cluster east`), the links healed and west-0 restarted, so west's node
knows no applied bound (its first poll of east cannot answer) while writes committed on east are
still to come. A stream read through a profile of west (heartbeats every 200 ms) runs while east
is down and after `strata chaos restart-cluster east` ships the three writes. They must not
arrive with commit_timestamps below an estimated_low_watermark the stream already sent: a node
with peer clusters holds its watermark while its bound is unknown. Before, the restarted node
sent its position as the watermark and the writes came seconds behind it, which a consumer
using the watermark (Beam) drops as late data. Exit 1 when a record is behind the watermark or
does not arrive."""
import os, subprocess, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import *
port, D, S = int(sys.argv[1]), sys.argv[2], sys.argv[3]
T = 'wr%d' % (now_us() % 100000)


def strata(*args):
    r = subprocess.run([S, *args, '--dir', D], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit('strata %s failed: %s%s' % (' '.join(args), r.stdout, r.stderr))


create_cs(port, T); create_profile(port, 'w' + T, 'west'); time.sleep(0.3); t0 = now_us()
strata('chaos', 'partition', 'east', 'west')
for i in range(3):
    mutate(port, T, 'east-%d' % i, [set_cell('cf', 'q', 'v')])
strata('chaos', 'kill-cluster', 'east')
strata('chaos', 'heal')
strata('restart', 'west-0')
events = []  # ('rec', row, commit_us) and ('wm', us), in arrival order


def ts_us(b):
    d = dict((a, x) for a, _, x in fields(b)); return d.get(1, 0) * 10**6 + d.get(2, 0) // 1000


def rd():
    data, st, why = call(port, BT + 'ReadChangeStream', cs_req(T, start_us=t0, end_us=now_us() + 9 * 10**6, hb_ns=2 * 10**8, profile='w' + T), limit=40)
    for m in msgs(data or b''):
        for num, wt, v in fields(m):
            if num == 1:
                d = dict((f, x) for f, _, x in fields(v))
                if 4 in d: events.append(('rec', d.get(3).decode(), ts_us(d[4])))
                if 10 in d: events.append(('wm', ts_us(d[10])))
            elif num == 2:
                d = dict((a, x) for a, _, x in fields(v))
                if 2 in d: events.append(('wm', ts_us(d[2])))


th = threading.Thread(target=rd); th.start(); time.sleep(3)
strata('chaos', 'restart-cluster', 'east')
th.join()
maxwm, late, rows = 0, [], set()
for e in events:
    if e[0] == 'wm': maxwm = max(maxwm, e[1])
    else:
        rows.add(e[1]); late.append((e[1], (maxwm - e[2]) // 1000))
print('heartbeats and records', len(events), '; records on west (row, ms by which its commit_timestamp is below the watermark already sent):', late)
if len(rows) != 3: sys.exit('expected the 3 writes of east on west, got %s' % sorted(rows))
sys.exit(1 if any(l > 0 for _, l in late) else 0)
