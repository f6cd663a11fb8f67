#!/usr/bin/env python3
"""cs_failover.py PORT DIR STRATA — no write is missed when a change stream consumer fails over
from one cluster to another (docs/changestreams.md, Guarantees), on `strata up --clusters 2
--nodes 1` (clusters east and west).

A consumer (`strata changes --follow --checkpoint --app-profile P`) reads through profile P,
routed to east, while a writer writes through P. Then the replication links between the
clusters are cut (`strata chaos partition`), P is pointed at west (`strata failover`) and the
writer goes on: these writes are on west only. The consumer, still reading east, receives
heartbeats whose tokens pass the time of those writes. It is then killed with kill -9 and
started again: it resumes from its checkpoint (east's tokens) on west. The links are restored
and a few more writes made. Every acknowledged write must be printed: the writes west accepted
while east had not applied them have west stamps below east's token time, and a token that
only carried that time (version 1) resumed past them.
Exit 0 when every acknowledged write was printed, 1 otherwise (what is missing is printed)."""
import json, os, signal, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from cslib import *

port, d, strata = int(sys.argv[1]), sys.argv[2], sys.argv[3]
T = 'fo%d' % (now_us() % 100000)
PROFILE = 'p' + T
ROWS = ['r%02d' % i for i in range(8)]
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


print('profile', call(port, '/google.bigtable.admin.v2.BigtableInstanceAdmin/CreateAppProfile',
                      fld(1, INST) + fld(2, PROFILE) + fld(3, fld(6, fld(1, 'east'))) + fld(4, 1))[1:])
print('create', create_cs(port, T)[1:])
t0 = now_us()
t0_text = time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t0 // 10**6)) + '.%06dZ' % (t0 % 10**6)
time.sleep(0.01)
start_consumer(t0_text)
write(16)
wait_printed(set(acked), 'east, before the failover')
run('chaos', 'partition', 'east', 'west')
run('failover', PROFILE, 'west')
write(16)  # on west only: the links are cut
t_west = now_us()
print('wrote %d, the last 16 on west only' % len(acked))
for _ in range(300):  # until the consumer's east tokens pass the west writes (heartbeats)
    times = checkpoint_times()
    if times and min(times) > t_west: break
    time.sleep(0.1)
else:
    fail('the checkpoint never passed the west writes: %s' % checkpoint_times())
print('checkpoint tokens at %s, the west writes up to %d' % (checkpoint_times(), t_west))
consumer.send_signal(signal.SIGKILL); consumer.wait()
print('kill -9 the consumer; it resumes from its checkpoint (east tokens) on west')
start_consumer(t0_text)
run('chaos', 'heal')
write(8)
wait_printed(set(acked), 'after the failover')
if consumer.poll() is None:
    consumer.send_signal(signal.SIGTERM); consumer.wait()
lines = sum(1 for line in open(out_path, 'rb') if line.startswith(b'{'))
print('%d acknowledged writes, %d printed, in %d changes (the rest again: at least once)' %
      (len(acked), len(set(acked) & seen()), lines))
print('FAIL' if failures else 'PASS')
sys.exit(1 if failures else 0)
