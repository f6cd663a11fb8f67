#!/usr/bin/env python3
"""cs_watermark_cut.py PORT DIR STRATA — on `strata up --dir DIR --port PORT --clusters 2
--nodes 2`: a stream read through a profile of west (heartbeats every 200 ms) while the
replication links east<->west are cut (`strata chaos partition east west`) for 5 s, with one
write a second made on east; then `strata chaos heal`. The five records must not arrive on
west with commit_timestamps below the estimated_low_watermark west already sent: a node with
peer clusters holds its watermark at its applied bound Y (writes committed elsewhere after Y
may still arrive). Before, west advanced it with its resolved stamp and the records came 1 to
5 s late, which a consumer using the watermark (Beam) drops as late data. Exit 1 when a record
is behind the watermark."""
import os, subprocess, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import *
port, D, S = int(sys.argv[1]), sys.argv[2], sys.argv[3]
T = 'wc%d' % (now_us() % 100000)
create_cs(port, T); create_profile(port, 'w' + T, 'west'); time.sleep(0.3); t0 = now_us()
raw = []
def rd():
    data, st, why = call(port, BT + 'ReadChangeStream', cs_req(T, start_us=t0, end_us=now_us() + 14 * 10**6, hb_ns=2 * 10**8, profile='w' + T), limit=40)
    raw.append(data)
th = threading.Thread(target=rd); th.start(); time.sleep(1)
print(subprocess.run([S, 'chaos', 'partition', 'east', 'west', '--dir', D], capture_output=True, text=True).returncode)
for i in range(5):
    mutate(port, T, 'during-cut-%d' % i, [set_cell('cf', 'q', 'v')]); time.sleep(1)
print(subprocess.run([S, 'chaos', 'heal', '--dir', D], capture_output=True, text=True).returncode)
th.join()
def ts_us(b):
    d = dict((a, x) for a, _, x in fields(b)); return d.get(1, 0) * 10**6 + d.get(2, 0) // 1000
maxwm = 0; late = []
for m in msgs(raw[0]):
    for num, wt, v in fields(m):
        if num == 1:
            d = dict((f, x) for f, _, x in fields(v))
            if 4 in d:
                ct = ts_us(d[4])
                late.append((d.get(3).decode(), (maxwm - ct) // 1000))
            if 10 in d: maxwm = max(maxwm, ts_us(d[10]))
        elif num == 2:
            d = dict((a, x) for a, _, x in fields(v))
            if 2 in d: maxwm = max(maxwm, ts_us(d[2]))
print('records on west: (row, ms by which its commit_timestamp is below the watermark already sent)', late)
sys.exit(1 if any(l > 0 for _, l in late) else 0)
