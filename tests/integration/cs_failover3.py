#!/usr/bin/env python3
"""cs_failover3.py PORT DIR STRATA — with three clusters (`strata up --clusters 3 --nodes 1`:
east, west, zone-3), a change stream consumer that fails over misses no write a third cluster
accepted while the cluster it read had not applied it (docs/changestreams.md, Failover: the
applied bound), and it may fail over twice, the second time with tokens the first failover's
cluster issued.

A consumer reads through profile P (routed to east); a writer writes through profile Q, routed
to zone-3. Round 1: the links east<->zone-3 are cut (west still receives zone-3's writes), the
writer goes on, the consumer's east tokens pass those writes (heartbeats), it is killed with
kill -9, P is pointed at west and the consumer resumes there from east's tokens. Round 2: the
same from west to east (links west<->zone-3 cut, tokens issued by west, resumed on east).
Every acknowledged write must be printed.
Exit 0 when every acknowledged write was printed, 1 otherwise."""
import json, os, signal, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from cslib import *

port, d, strata = int(sys.argv[1]), sys.argv[2], sys.argv[3]
T = 'f3%d' % (now_us() % 100000)
PROFILE = 'p' + T
WPROFILE = 'q' + T
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
            data, st, why = call(port, BT + 'MutateRow', fld(1, tname(T)) + fld(4, WPROFILE) + fld(2, row) +
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



def profile(name, cluster):
    print('profile', name, call(port, '/google.bigtable.admin.v2.BigtableInstanceAdmin/CreateAppProfile',
                                fld(1, INST) + fld(2, name) + fld(3, fld(6, fld(1, cluster))) + fld(4, 1))[1:])


def fail_over(cut, frm, to):
    """Cuts cut<->zone-3, writes on zone-3, waits for the consumer's tokens (issued by frm) to
    pass those writes, kills it, points P at to and starts it again from its checkpoint."""
    run('chaos', 'partition', cut, 'zone-3')
    write(12)  # zone-3 accepts them; cut has not applied them
    t_w = now_us()
    for _ in range(300):  # until the consumer's tokens pass the writes (heartbeats)
        times = checkpoint_times()
        if times and min(times) > t_w: break
        time.sleep(0.1)
    else:
        fail('the checkpoint never passed the zone-3 writes: %s' % checkpoint_times())
    consumer.send_signal(signal.SIGKILL); consumer.wait()
    print('kill -9 the consumer; it resumes from its checkpoint (%s tokens) on %s' % (frm, to))
    run('failover', PROFILE, to)
    start_consumer(t0_text)
    run('chaos', 'heal')
    write(4)
    wait_printed(set(acked), 'after the failover %s -> %s' % (frm, to))


profile(PROFILE, 'east')
profile(WPROFILE, 'zone-3')
print('create', create_cs(port, T)[1:])
t0 = now_us()
t0_text = time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t0 // 10**6)) + '.%06dZ' % (t0 % 10**6)
time.sleep(0.01)
start_consumer(t0_text)
write(8)
wait_printed(set(acked), 'east, before the failover')
fail_over('east', 'east', 'west')
fail_over('west', 'west', 'east')
if consumer.poll() is None:
    consumer.send_signal(signal.SIGTERM); consumer.wait()
lines = sum(1 for line in open(out_path, 'rb') if line.startswith(b'{'))
print('%d acknowledged writes, %d printed, in %d changes (the rest again: at least once)' %
      (len(acked), len(set(acked) & seen()), lines))
print('FAIL' if failures else 'PASS')
sys.exit(1 if failures else 0)
