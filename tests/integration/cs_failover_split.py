#!/usr/bin/env python3
"""cs_failover_split.py PORT DIR STRATA — a change stream consumer that fails over between clusters
whose tablets differ misses no write (docs/changestreams.md, Failover: the applied bound), on
`strata up --clusters 2 --nodes 2` (east, west). Each cluster splits on its own: east's tablet is
split at m (SplitTablet on east's node) while the consumer reads east, so its tokens are for
[, m) and [m, ); the links are cut, the writer is pointed at west (one tablet) and the consumer,
killed with kill -9, resumes there from east's two tokens (the router closes each partition with
west's tablet as the new one, the tokens merge). Then west splits at g, the links are cut again
and the consumer fails back to east ([, m), [m, )) with west's tokens of [, g) and [g, ). During
each failover the new cluster moves a tablet to its other node (MoveTablet) while written.
Rows on both sides of g and m are written throughout. Every acknowledged write must be printed.
Exit 0 when every acknowledged write was printed, 1 otherwise."""
import json, os, signal, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from cslib import *

port, d, strata = int(sys.argv[1]), sys.argv[2], sys.argv[3]
T = 'fs%d' % (now_us() % 100000)
PROFILE = 'p' + T
ROWS = ['%c%02d' % ('bhnt'[i % 4], i) for i in range(8)]
out_path, ck_path, err_path = [os.path.join(d, T + s) for s in ('.jsonl', '.ck', '.err')]
acked, failures = [], []


def fail(msg):
    print('FAIL: ' + msg); failures.append(msg)


def run(*args):
    r = subprocess.run([strata] + list(args) + ['--dir', d], capture_output=True, text=True)
    print('strata %s: %d %s' % (' '.join(args), r.returncode, (r.stdout + r.stderr).strip()[-200:]))
    if r.returncode: fail('strata %s failed' % ' '.join(args))


def write(n):
    """n writes through the profile, one after another; each acknowledged one is remembered."""
    for _ in range(n):
        seq = len(acked)
        row = ROWS[seq % len(ROWS)]
        for attempt in range(50):
            data, st, why = call(port, BT + 'MutateRow', fld(1, tname(T)) + fld(4, PROFILE) + fld(2, row) +
                                 fld(3, set_cell('cf', 'q', 'v%05d' % seq)), limit=20)
            if why == 'end' and len(data) >= 5: acked.append('%s=v%05d' % (row, seq)); break
            time.sleep(0.1)
        else:
            fail('write %d was never acknowledged: %s' % (seq, st))


consumer = None


def start_consumer(t0_text):
    global consumer
    outf = open(out_path, 'ab')
    consumer = subprocess.Popen([strata, 'changes', '--dir', d, '--table', T, '--follow', '--checkpoint', ck_path,
                                 '--from', t0_text, '--heartbeat-s', '1', '--quiet', '--app-profile', PROFILE],
                                stdout=outf, stderr=open(err_path, 'ab'))
    outf.close()


def checkpoint_times():
    """The W (microseconds) of every token of the checkpoint file; [] while there is none."""
    out = []
    try:
        lines = open(ck_path).read().split('\n')[1:]
    except OSError:
        return out
    for line in lines:
        p = line.split()
        if len(p) == 4 and p[0] == 't':
            tok = bytes.fromhex(p[3]).decode().split('.')
            out.append(int(tok[1] if tok[0] == '1' else tok[3]))
    return out


def seen():
    got = set()
    for line in open(out_path, 'rb'):
        try: j = json.loads(line)
        except ValueError: continue  # a line cut by kill -9
        for m in j.get('mods', []):
            if 'value' in m: got.add('%s=%s' % (j['row'], m['value']))
    return got


def wait_printed(want, what):
    for _ in range(300):  # hang guard, not a timing check
        if want <= seen(): return
        if consumer.poll() is not None:
            fail('the consumer ended by itself (status %d): %s' % (consumer.returncode, open(err_path).read()[-500:]))
            return
        time.sleep(0.1)
    missing = sorted(want - seen())
    fail('%s: %d acknowledged writes never printed: %s' % (what, len(missing), missing[:12]))



def node_ports(cluster):
    out = []
    for line in open(os.path.join(d, 'topology')):
        p = line.split()
        if len(p) >= 4 and p[0] == 'node' and os.path.basename(p[3]).startswith(cluster + '-'):
            out.append(int(p[2].rsplit(':', 1)[1]))
    return out


def tablets_on(nport):
    data, st, why = call(nport, '/strata.internal.v1.Node/ListTablets', fld(1, tname(T)), limit=10)
    out = []
    for m in msgs(data):
        for f, _, v in fields(m):
            if f == 1:
                t = dict((a, b) for a, _, b in fields(v))
                if t.get(2, b'').decode().endswith('/' + T): out.append((t.get(1), t.get(3, b''), t.get(4, b'')))
    return out


def cluster_tablets(cluster):
    return [(p, t) for p in node_ports(cluster) for t in tablets_on(p)]


def split(cluster, key):
    for _ in range(20):  # the balancer may move the tablet meanwhile: find it again
        if any(t[1] == key.encode() for _, t in cluster_tablets(cluster)): break
        for p, t in cluster_tablets(cluster):
            if t[1] < key.encode() and (not t[2] or t[2] > key.encode()):
                data, st, why = call(p, '/strata.internal.v1.Node/SplitTablet', fld(1, t[0]) + fld(2, key), limit=20)
                print('split %s at %s: %s %s' % (cluster, key, why, st))
        time.sleep(0.2)
    print('%s tablets: %s' % (cluster, [(p, t[1], t[2]) for p, t in cluster_tablets(cluster)]))


def move(cluster, key):
    """Moves the tablet starting at key to the other node of cluster."""
    for p, t in cluster_tablets(cluster):
        if t[1] == key.encode():
            other = [q for q in node_ports(cluster) if q != p][0]
            data, st, why = call(p, '/strata.internal.v1.Node/MoveTablet', fld(1, t[0]) + fld(2, '127.0.0.1:%d' % other),
                                 limit=30)
            print('move %s [%s, ) to %d: %s %s' % (cluster, key, other, why, st))
            return
    fail('no tablet of %s starts at %s' % (cluster, key))


moving = {'west': '', 'east': 'm'}


def fail_over(frm, to):
    run('chaos', 'partition', 'east', 'west')
    run('failover', PROFILE, to)
    write(6)  # on the new cluster only: the links are cut
    move(to, moving[to])  # the new cluster moves a tablet between its nodes meanwhile
    write(6)
    t_w = now_us()
    for _ in range(300):  # until the consumer's tokens (issued by frm) pass those writes
        times = checkpoint_times()
        if times and min(times) > t_w: break
        time.sleep(0.1)
    else:
        fail('the checkpoint never passed the writes on %s: %s' % (to, checkpoint_times()))
    consumer.send_signal(signal.SIGKILL); consumer.wait()
    print('kill -9 the consumer; it resumes from its checkpoint (%s tokens %s) on %s' % (frm, checkpoint_times(), to))
    start_consumer(t0_text)
    run('chaos', 'heal')
    write(4)
    wait_printed(set(acked), 'after the failover %s -> %s' % (frm, to))


print('profile', call(port, '/google.bigtable.admin.v2.BigtableInstanceAdmin/CreateAppProfile',
                      fld(1, INST) + fld(2, PROFILE) + fld(3, fld(6, fld(1, 'east'))) + fld(4, 1))[1:])
print('create', create_cs(port, T)[1:])
t0 = now_us()
t0_text = time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t0 // 10**6)) + '.%06dZ' % (t0 % 10**6)
time.sleep(0.01)
start_consumer(t0_text)
write(8)
wait_printed(set(acked), 'east, before the split')
split('east', 'm')
write(8)
wait_printed(set(acked), 'east, after its split at m')
fail_over('east', 'west')
split('west', 'g')
write(8)
wait_printed(set(acked), 'west, after its split at g')
fail_over('west', 'east')
if consumer.poll() is None:
    consumer.send_signal(signal.SIGTERM); consumer.wait()
lines = sum(1 for line in open(out_path, 'rb') if line.startswith(b'{'))
print('%d acknowledged writes, %d printed, in %d changes (the rest again: at least once)' %
      (len(acked), len(set(acked) & seen()), lines))
print('FAIL' if failures else 'PASS')
sys.exit(1 if failures else 0)
