"""cs_mixed_chaos.py PORT DIR STRATA [SECONDS [CLUSTER]] — on `strata up --dir DIR --clusters 2
--nodes 2`: two writers (MutateRow, MutateRows of 1-3 rows, CheckAndMutateRow, ReadModifyWriteRow
increments) and a dropper (5 rows under a fresh prefix, then DropRowRange of it) write through the
default profile for SECONDS (default 30) while, in turn, a tablet of CLUSTER (default east) is
split, a tablet is moved to the other node of CLUSTER, a node of either cluster is killed with
kill -9 and restarted (`strata up`), and the consumer (`strata changes --follow --checkpoint`
through a profile routed to CLUSTER) is killed with kill -9 and resumed. Then every acknowledged
value must have been printed, every dropped row must have a delete record, and per row the first
appearance of the values must follow the order of their acknowledgements (each row has one
writer). Exit 0 when all hold, 1 otherwise."""
import os, sys, time, json, random, signal, subprocess, threading, struct
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import *
from csconsumer import Stream
port, d, strata = int(sys.argv[1]), sys.argv[2], sys.argv[3]
DUR = float(sys.argv[4]) if len(sys.argv) > 4 else 30
CL = sys.argv[5] if len(sys.argv) > 5 else 'east'
s = Stream(port, d, strata, 'mx', profile='pf' if CL != 'east' else None)
if s.profile: s.writer_profile = None; s.make_profile(s.profile, CL)
T = s.table
s.create(); s.start_consumer()
acked = []   # (row, value-string) in ack order per writer
unsure = set(); stop = threading.Event(); lock = threading.Lock()
drops = []   # (prefix, rows written before)
def ok_unary(path, body):
    try:
        data, st, why = call(port, BT + path, body, limit=20)
    except Exception as e:
        return None
    return data if why == 'end' and len(data) >= 5 else None
def writer(wid):
    seq = 0; rnd = random.Random(wid); counters = {}
    while not stop.is_set():
        kind = seq % 4; seq += 1
        tag = 'w%d.%05d' % (wid, seq)
        if kind == 0:
            row = 'k%d%02d' % (wid, rnd.randrange(20))
            body = fld(1, tname(T)) + fld(2, row) + fld(3, set_cell('cf', 'q', 'mr' + tag))
            r = ok_unary('MutateRow', body); got = [(row, 'mr' + tag)] if r else None; rows = [row]
        elif kind == 1:
            rows = ['k%d%02d' % (wid, rnd.randrange(20)) for _ in range(3)]
            rows = sorted(set(rows))
            body = fld(1, tname(T)) + b''.join(fld(2, fld(1, r_) + fld(2, set_cell('cf', 'q', 'ms' + tag))) for r_ in rows)
            try:
                data, st, why = call(port, BT + 'MutateRows', body, limit=20)
                okidx = set()
                for m in msgs(data):
                    for f, _, e in fields(m):
                        if f == 1:
                            ed = dict((a, b) for a, _, b in fields(e))
                            code = dict((a, b) for a, _, b in fields(ed.get(2, b''))).get(1, 0)
                            if code == 0: okidx.add(ed.get(1, 0))
                got = [(rows[i], 'ms' + tag) for i in sorted(okidx)] if why == 'end' else []
                bad = [rows[i] for i in range(len(rows)) if i not in okidx]
                if why != 'end' or bad:
                    with lock: unsure.update(bad if why == 'end' else rows)
            except Exception:
                got = []; 
                with lock: unsure.update(rows)
            with lock: acked.extend(got)
            time.sleep(0.01); continue
        elif kind == 2:
            row = 'k%d%02d' % (wid, rnd.randrange(20))
            body = fld(1, tname(T)) + fld(2, row) + fld(4, set_cell('cf', 'q', 'ct' + tag)) + fld(5, set_cell('cf', 'q', 'cf' + tag))
            r = ok_unary('CheckAndMutateRow', body)
            if r is not None:
                matched = any(f == 1 and v for f, _, v in fields(list(msgs(r))[0]))
                got = [(row, ('ct' if matched else 'cf') + tag)]
            else: got = None
            rows = [row]
        else:
            row = 'c%d%d' % (wid, rnd.randrange(4))
            body = fld(1, tname(T)) + fld(2, row) + fld(3, fld(1, 'cf') + fld(2, 'n') + fld(4, 1))
            r = ok_unary('ReadModifyWriteRow', body)
            got = None
            if r is not None:
                # Row{key=1, families=2{name=1, columns=2{qualifier=1, cells=2{ts=1, value=2}}}}
                try:
                    rowm = dict((a, b) for a, _, b in fields(list(msgs(r))[0]))[1]
                    fam = dict((a, b) for a, _, b in fields(rowm))[2]
                    col = dict((a, b) for a, _, b in fields(fam))[2]
                    cell = dict((a, b) for a, _, b in fields(col))[2]
                    val = dict((a, b) for a, _, b in fields(cell))[2]
                    got = [(row, 'INC%d' % struct.unpack('>q', val)[0])]
                except Exception as e:
                    print('rmw decode', e, r[:80]); got = None
            rows = [row]
        if got: 
            with lock: acked.extend(got)
        else:
            with lock: unsure.update(rows)
        time.sleep(0.005)
def dropper():
    n = 0
    while not stop.is_set():
        pre = 'd%03d' % n; n += 1
        for i in range(5):
            ok_unary('MutateRow', fld(1, tname(T)) + fld(2, '%s-%d' % (pre, i)) + fld(3, set_cell('cf', 'q', 'dv')))
        r = call(port, ADMIN + 'DropRowRange', fld(1, tname(T)) + fld(2, pre), limit=30)
        if r[2] == 'end' and r[0] is not None and len(r[0]) >= 5:
            with lock: drops.append(pre)
        else:
            print('drop', pre, r[1:])
        time.sleep(0.3)
ths = [threading.Thread(target=writer, args=(i,)) for i in range(2)] + [threading.Thread(target=dropper)]
for t in ths: t.start()
nodes = [n for n in topology_nodes(d) if n[0].startswith(CL)]; allnodes = topology_nodes(d)
t_end = time.time() + DUR; step = 0
keys = ['k0%02d' % i for i in range(1, 20, 3)] + ['k1%02d' % i for i in range(2, 20, 4)] + ['c1', 'd0', 'd1', 'k1']
random.shuffle(keys)
while time.time() < t_end:
    step += 1
    time.sleep(1.0)
    ev = step % 5
    if ev in (1, 3) and keys:
        split_tablets(nodes, T, keys.pop())
    elif ev == 2:
        held = [(n, p, t) for n, p in nodes for t in tablets_on(p, T)]
        if held:
            n_, p_, t_ = random.choice(held)
            other = [(m, q) for m, q in nodes if m != n_][0]
            r = call(p_, '/strata.internal.v1.Node/MoveTablet', fld(1, t_[0]) + fld(2, '127.0.0.1:%d' % other[1]), limit=30)
            print('move', t_[1], n_, '->', other[0], r[2])
    elif ev == 4:
        victim = random.choice(allnodes)
        pid = int(open(os.path.join(d, 'run', victim[0] + '.pid')).read())
        os.kill(pid, signal.SIGKILL); print('kill -9', victim[0], 'acked', len(acked))
        time.sleep(0.3)
        r = subprocess.run([strata, 'up', '--dir', d], capture_output=True, text=True); print('up', r.returncode, r.stderr[-200:])
    elif ev == 0:
        s.kill_consumer('step %d' % step); s.start_consumer()
stop.set()
for t in ths: t.join()
print('acked', len(acked), 'unsure rows', len(unsure), 'drops', len(drops))
want = set('%s=%s' % rv for rv in acked)
def seen_all():
    out = []; deletes = {}
    for line in open(s.out_path, 'rb'):
        try: j = json.loads(line)
        except ValueError: continue
        for m in j.get('mods', []):
            if 'value' in m: out.append((j['row'], m['value']))
            elif 'value_b64' in m:
                import base64
                v = base64.b64decode(m['value_b64'])
                out.append((j['row'], 'INC%d' % struct.unpack('>q', v)[0] if len(v) == 8 else v.hex()))
            else:
                deletes.setdefault(j['row'], []).append(m)
    return out, deletes
for _ in range(300):
    out, dels = seen_all()
    if want <= set('%s=%s' % rv for rv in out) and all(('%s-%d' % (p, i)) in dels for p in drops for i in range(5)): break
    if s.ended_by_itself(): break
    time.sleep(0.2)
out, dels = seen_all()
missing = sorted(want - set('%s=%s' % rv for rv in out))
if missing: s.fail('%d acked writes never printed: %s' % (len(missing), missing[:10]))
dmiss = [('%s-%d' % (p, i)) for p in drops for i in range(5) if ('%s-%d' % (p, i)) not in dels]
if dmiss: s.fail('%d dropped rows without a delete record: %s' % (len(dmiss), dmiss[:10]))
# order: per row, first appearance of acked values must follow ack order (one writer per row)
pos = {}
for i, (r_, v) in enumerate(acked): pos[(r_, v)] = i
firsts = {}
for r_, v in out:
    if (r_, v) in pos and (r_, v) not in firsts: firsts[(r_, v)] = len(firsts)
byrow = {}
for (r_, v), i in sorted(firsts.items(), key=lambda x: x[1]):
    if r_ in unsure: continue
    byrow.setdefault(r_, []).append(pos[(r_, v)])
bad = [(r_, l) for r_, l in byrow.items() if l != sorted(l)]
if bad: s.fail('rows first printed out of order: %s' % [(r_, l[:10]) for r_, l in bad[:5]])
print('%d acknowledged values, %d printed, %d dropped rows' % (len(want), len(want) - len(missing), 5 * len(drops)))
s.stop_consumer()
s.exit()
