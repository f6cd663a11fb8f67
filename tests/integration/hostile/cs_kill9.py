#!/usr/bin/env python3
"""cs_kill9.py PORT DIR STRATA [NODE] — ReadChangeStream through the router of `strata up --dir DIR`
while a writer writes rows; kills -9 node NODE (default east-0) mid-stream, restarts it with
`STRATA up --dir DIR`, and resumes the stream from the last token it got each time the stream
ends. Every acknowledged row must have a record (no gap); prints duplicates.
Exit 0: no acknowledged write missing; 1: a gap."""
import os, signal, subprocess, sys, threading, time
from cslib import *

port, d, strata = int(sys.argv[1]), sys.argv[2], sys.argv[3]
node = sys.argv[4] if len(sys.argv) > 4 else 'east-0'
T = 'k9_%d' % (now_us() % 100000)
print('create', create_cs(port, T)[1:])
t0 = now_us()
acked, stop = [], threading.Event()


def writer():
    i = 0
    c = None
    while not stop.is_set():
        try:
            c = c or Conn(port, timeout=10)
            _, st, why = mutate(port, T, 'w%06d' % i, [set_cell('cf', 'q', 'v')], conn=c)
            if why == 'end' and not [s for s in st if s not in ('0', b'0')] and not st:
                acked.append('w%06d' % i)
            elif why != 'end':
                c = None
        except Exception:
            c = None; time.sleep(0.05)
        i += 1


seen, tok = [], ['1.%d' % (t0 - 1)]
ends = []


def on_ev(e):
    if e[0] == 'rec':
        seen.append(e[1].decode()); tok[0] = e[4]
    elif e[0] == 'hb' and e[1]:
        tok[0] = e[1]
    elif e[0] == 'close':
        ends.append(('close', e[1], e[2]))


wt = threading.Thread(target=writer); wt.start()
stop_at = [None]


def reader():
    while True:
        end_us = stop_at[0]
        req = cs_req(T, tokens=[(b'', tok[0])], hb_ns=200000000, end_us=end_us)
        try:
            why = stream_cs(port, req, on_ev, limit=20)
        except Exception as ex:
            why = 'exc %r' % ex
        ends.append(why)
        if end_us is not None and ends and isinstance(ends[-2 if len(ends) > 1 else -1], tuple) and ends[-2][1] == 0:
            return
        if end_us is not None and why == 'end' and any(isinstance(x, tuple) and x[1] == 0 for x in ends):
            return
        time.sleep(0.2)


rt = threading.Thread(target=reader, daemon=True); rt.start()
time.sleep(1.5)
pid = int(open(os.path.join(d, 'run', node + '.pid')).read())
print('kill -9', node, pid, 'after', len(acked), 'acked')
os.kill(pid, signal.SIGKILL)
time.sleep(1.0)
subprocess.run([strata, 'up', '--dir', d, '--port', str(port)], stdout=subprocess.DEVNULL)
print('restarted; acked', len(acked))
time.sleep(2.0)
stop.set(); wt.join()
stop_at[0] = now_us() + 1000000
rt.join(60)
present, why = row_keys(port, T)
print('table holds %d rows (%s)' % (len(present), why))
missing = [r for r in present if r not in set(seen)]
dups = len(seen) - len(set(seen))
print('present %d, acked-or-failed %d, records %d (%d duplicates), missing %d %s; stream ends: %s' %
      (len(present), len(acked), len(seen), dups, len(missing), missing[:10], ends[-8:]))
# order check: per row one record; rows were written in order
sys.exit(1 if missing else 0)
