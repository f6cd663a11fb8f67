#!/usr/bin/env python3
"""cs_failover_down.py PORT DIR STRATA — the applied bound with a peer node down, on `strata up
--clusters 3 --nodes 1` (east, west, zone-3): zone-3's node is killed with kill -9 before the
stream starts and stays down. The consumer reads east through profile P; its stream stays
healthy (writes printed, heartbeat tokens move on) while the bound Y in east's tokens stays at
or below the time zone-3 went down (zone-3's writes may be missing on east). Then the links
east<->west are cut, P is pointed at west, the writer goes on there, and the consumer, killed
with kill -9, resumes from east's tokens on west: every write is printed. Last, zone-3 is
started again (`strata up`) and Y in the consumer's tokens (now west's) moves past the restart.
Exit 0 when all hold, 1 otherwise."""
import json, os, signal, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from cslib import *

port, d, strata = int(sys.argv[1]), sys.argv[2], sys.argv[3]
T = 'fd%d' % (now_us() % 100000)
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



def checkpoint_bounds():
    """The Y of every version 2 token of the checkpoint file (None for a version 1 token)."""
    out = []
    try:
        lines = open(ck_path).read().split('\n')[1:]
    except OSError:
        return out
    for line in lines:
        p = line.split()
        if len(p) == 4 and p[0] == 't':
            tok = bytes.fromhex(p[3]).decode().split('.')
            out.append(int(tok[2]) if tok[0] == '2' else None)
    return out


def wait_tokens_pass(t, what):
    for _ in range(300):  # until the consumer's tokens pass t (heartbeats)
        times = checkpoint_times()
        if times and min(times) > t: return
        time.sleep(0.1)
    fail('the checkpoint never passed %s: %s' % (what, checkpoint_times()))


print('profile', call(port, '/google.bigtable.admin.v2.BigtableInstanceAdmin/CreateAppProfile',
                      fld(1, INST) + fld(2, PROFILE) + fld(3, fld(6, fld(1, 'east'))) + fld(4, 1))[1:])
print('create', create_cs(port, T)[1:])
pid = int(open(os.path.join(d, 'run', 'zone-3-0.pid')).read())
os.kill(pid, signal.SIGKILL)
t_down = now_us()
print('kill -9 zone-3-0 (pid %d)' % pid)
t0 = now_us()
t0_text = time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(t0 // 10**6)) + '.%06dZ' % (t0 % 10**6)
time.sleep(0.01)
start_consumer(t0_text)
write(8)
wait_printed(set(acked), 'east, zone-3 down')
wait_tokens_pass(now_us() + 1500000, 'a second and a half more (heartbeats)')
ys = checkpoint_bounds()
print('east tokens at %s, bounds %s, zone-3 down at %d' % (checkpoint_times(), ys, t_down))
if not ys or any(y is None or y > t_down for y in ys):
    fail('east\'s bound is not held at or below the time zone-3 went down: %s' % ys)
run('chaos', 'partition', 'east', 'west')
run('failover', PROFILE, 'west')
write(12)  # on west only
wait_tokens_pass(now_us(), 'the writes on west')
consumer.send_signal(signal.SIGKILL); consumer.wait()
print('kill -9 the consumer; it resumes from its checkpoint (east tokens) on west')
start_consumer(t0_text)
run('chaos', 'heal')
write(4)
wait_printed(set(acked), 'after the failover, zone-3 down')
r = subprocess.run([strata, 'up', '--dir', d], capture_output=True, text=True)
print('strata up (zone-3 again): %d %s' % (r.returncode, (r.stdout + r.stderr).strip()[-200:]))
t_up = now_us()
for _ in range(300):  # until west's bound moves past the restart
    write(1)
    ys = checkpoint_bounds()
    if ys and all(y is not None and y > t_up for y in ys): break
    time.sleep(0.1)
else:
    fail('the bound never moved past zone-3\'s restart: %s' % checkpoint_bounds())
print('bounds after zone-3 restarted: %s (restart at %d)' % (checkpoint_bounds(), t_up))
wait_printed(set(acked), 'after zone-3 restarted')
if consumer.poll() is None:
    consumer.send_signal(signal.SIGTERM); consumer.wait()
lines = sum(1 for line in open(out_path, 'rb') if line.startswith(b'{'))
print('%d acknowledged writes, %d printed, in %d changes (the rest again: at least once)' %
      (len(acked), len(set(acked) & seen()), lines))
print('FAIL' if failures else 'PASS')
sys.exit(1 if failures else 0)
