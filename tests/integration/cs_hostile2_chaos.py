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
import json, os, random, signal, subprocess, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from cslib import *

mode, port, d, strata = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
T = 'chaos%d' % (now_us() % 100000)
PROFILE = ('fo' + T) if mode == 'failover' else None
ROWS = ['%c%02d' % (chr(ord('a') + i % 24), i) for i in range(24)]
WRITES = 600          # the writer's total, chaos events at fixed shares of it
out_path, ck_path = os.path.join(d, T + '.jsonl'), os.path.join(d, T + '.ck')
failures = []


def fail(msg):
    print('FAIL: ' + msg); failures.append(msg)


def topology_nodes():
    nodes = []
    for line in open(os.path.join(d, 'topology')):
        p = line.split()
        if len(p) >= 4 and p[0] == 'node': nodes.append((os.path.basename(p[3]), int(p[2].rsplit(':', 1)[1])))
    return nodes  # [(name, port)]


def tablets_on(nport):
    data, st, why = call(nport, '/strata.internal.v1.Node/ListTablets', fld(1, tname(T)), limit=10)
    out = []
    for m in msgs(data):
        for f, _, v in fields(m):
            if f == 1:
                t = dict((a, b) for a, _, b in fields(v))
                if t.get(2, b'').decode().endswith('/' + T): out.append((t.get(1), t.get(3, b''), t.get(4, b'')))
    return out


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


consumer = None


def start_consumer():
    global consumer
    outf = open(out_path, 'ab')
    consumer = subprocess.Popen([strata, 'changes', '--dir', d, '--table', T, '--follow', '--checkpoint', ck_path,
                                 '--from', t0_text, '--heartbeat-s', '1', '--quiet'] +
                                (['--app-profile', PROFILE] if PROFILE else []), stdout=outf,
                                stderr=open(os.path.join(d, T + '.err'), 'ab'))
    outf.close()


def kill_consumer(what):
    time.sleep(random.random() * 0.3)
    if consumer.poll() is not None:
        fail('the consumer ended by itself (status %d): %s' % (consumer.returncode, open(os.path.join(d, T + '.err')).read()[-500:]))
    consumer.send_signal(signal.SIGKILL); consumer.wait()
    print('chaos: kill -9 the consumer (%s), %d acked' % (what, len(acked)))
    start_consumer()


def wait_acked(n):
    for _ in range(1200):
        if len(acked) >= n or stop.is_set(): return
        time.sleep(0.1)
    fail('the writer is stuck at %d acknowledged writes' % len(acked))


def chaos():
    nodes = topology_nodes()
    wait_acked(WRITES // 8); kill_consumer('1')
    wait_acked(WRITES * 2 // 8)
    for _ in range(20):  # the balancer may move the tablet meanwhile: find it again
        owner = [(n, p, t) for n, p in nodes for t in tablets_on(p)]
        if any(t[1] == b'm' for _, _, t in owner): break
        if owner:
            data, st, why = call(owner[0][1], '/strata.internal.v1.Node/SplitTablet', fld(1, owner[0][2][0]) + fld(2, 'm'),
                                 limit=20)
            print('chaos: split tablet %d at m on %s: %s' % (owner[0][2][0], owner[0][0], why))
        time.sleep(0.2)
    wait_acked(WRITES * 3 // 8); kill_consumer('2')
    wait_acked(WRITES * 4 // 8)
    right = [(n, p, t) for n, p in nodes for t in tablets_on(p) if t[1] == b'm']
    if right:
        src = right[0][:2]
        other = [(n, p) for n, p in nodes if n != src[0]][0]
        data, st, why = call(src[1], '/strata.internal.v1.Node/MoveTablet',
                             fld(1, right[0][2][0]) + fld(2, '127.0.0.1:%d' % other[1]), limit=30)
        print('chaos: move [m, ) from %s to %s: %s' % (src[0], other[0], why))
    else: fail('no tablet starting at m after the split')
    wait_acked(WRITES * 5 // 8)
    victim = [(n, p) for n, p in nodes if any(t[1] == b'm' for t in tablets_on(p))] or [nodes[-1]]
    pid = int(open(os.path.join(d, 'run', victim[0][0] + '.pid')).read())
    os.kill(pid, signal.SIGKILL)
    print('chaos: kill -9 %s (pid %d), %d acked' % (victim[0][0], pid, len(acked)))
    time.sleep(0.5)
    r = subprocess.run([strata, 'up', '--dir', d], capture_output=True, text=True)
    print('chaos: strata up: %d' % r.returncode)
    wait_acked(WRITES * 6 // 8); kill_consumer('3')


def failover():
    wait_acked(WRITES // 4); kill_consumer('1')
    wait_acked(WRITES // 2)
    r = subprocess.run([strata, 'failover', PROFILE, 'west', '--dir', d], capture_output=True, text=True)
    epoch[0] = 1
    print('chaos: strata failover %s west: %d %s' % (PROFILE, r.returncode, r.stderr.strip()[-200:]))
    if r.returncode: fail('strata failover: ' + r.stdout + r.stderr)
    wait_acked(WRITES * 5 // 8); kill_consumer('2, after the failover')
    wait_acked(WRITES * 7 // 8); kill_consumer('3')


if PROFILE:
    r = call(port, '/google.bigtable.admin.v2.BigtableInstanceAdmin/CreateAppProfile', fld(1, INST) + fld(2, PROFILE) + fld(3, fld(6, fld(1, 'east'))) + fld(4, 1))
    print('profile', r[1:])
print('create', create_cs(port, T)[1:])
t0 = now_us()
t0_text = time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t0 // 10**6)) + '.%06dZ' % (t0 % 10**6)
time.sleep(0.01)
start_consumer()
wt = threading.Thread(target=writer); wt.start()
chaos() if mode == 'chaos' else failover()
wt.join(120); stop.set()
print('writer: %d acknowledged of %d, %d rows unsure' % (len(acked), WRITES, len(unsure)))

want = set('%s=v%05d' % (r_, s) for r_, s, _ in acked)
after = set('v%05d' % s for _, s, e in acked if e)


def seen_now():
    got, order = set(), []
    for line in open(out_path, 'rb'):
        try: j = json.loads(line)
        except ValueError:
            continue  # a line cut by kill -9: printed again after the checkpoint
        for m in j.get('mods', []):
            if 'value' in m: got.add('%s=%s' % (j['row'], m['value'])); order.append((j['row'], m['value']))
    return got, order


for _ in range(600):  # hang guard, not a timing check
    got, order = seen_now()
    if want <= got: break
    time.sleep(0.1)
if consumer.poll() is not None: fail('the consumer ended by itself (status %d)' % consumer.returncode)
consumer.send_signal(signal.SIGTERM); consumer.wait()
got, order = seen_now()
missing = sorted(want - got)
if missing: fail('%d acknowledged writes never printed: %s' % (len(missing), missing[:10]))
first, bad = {}, []
for row, v in order:
    if row in unsure: continue
    seen_vals = first.setdefault((row, v in after), [])
    if v not in seen_vals:
        if seen_vals and v < seen_vals[-1]: bad.append((row, seen_vals[-1], v))
        seen_vals.append(v)
if bad: fail('values of a row first printed out of write order: %s' % bad[:10])
broken = sum(1 for line in open(out_path, 'rb') if line.strip() and not line.startswith(b'{'))
print('consumer printed %d lines, %d distinct acknowledged writes, %d broken lines' % (len(order), len(want & got), broken))
print('FAIL' if failures else 'PASS')
sys.exit(1 if failures else 0)
