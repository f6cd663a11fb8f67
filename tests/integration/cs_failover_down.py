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
import os, signal, subprocess, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from cslib import now_us
from csconsumer import Stream

s = Stream(int(sys.argv[1]), sys.argv[2], sys.argv[3], 'fd', profile='p')
s.make_profile(s.profile, 'east')
s.create()
pid = int(open(os.path.join(s.d, 'run', 'zone-3-0.pid')).read())
os.kill(pid, signal.SIGKILL)
t_down = now_us()
print('kill -9 zone-3-0 (pid %d)' % pid)
s.start_consumer()
s.write(8)
s.wait_printed('east, zone-3 down')
s.wait_tokens_pass(now_us() + 1500000, 'a second and a half more (heartbeats)')
ys = s.checkpoint_bounds()
print('east tokens at %s, bounds %s, zone-3 down at %d' % (s.checkpoint_times(), ys, t_down))
if not ys or any(y is None or y > t_down for y in ys):
    s.fail('east\'s bound is not held at or below the time zone-3 went down: %s' % ys)
s.run('chaos', 'partition', 'east', 'west')
s.run('failover', s.profile, 'west')
s.write(12)  # on west only
s.wait_tokens_pass(now_us(), 'the writes on west')
s.kill_consumer('it resumes from its checkpoint (east tokens) on west')
s.start_consumer()
s.run('chaos', 'heal')
s.write(4)
s.wait_printed('after the failover, zone-3 down')
r = subprocess.run([s.strata, 'up', '--dir', s.d], capture_output=True, text=True)
print('strata up (zone-3 again): %d %s' % (r.returncode, (r.stdout + r.stderr).strip()[-200:]))
t_up = now_us()
for _ in range(300):  # until west's bound moves past the restart
    s.write(1)
    ys = s.checkpoint_bounds()
    if ys and all(y is not None and y > t_up for y in ys): break
    time.sleep(0.1)
else:
    s.fail('the bound never moved past zone-3\'s restart: %s' % s.checkpoint_bounds())
print('bounds after zone-3 restarted: %s (restart at %d)' % (s.checkpoint_bounds(), t_up))
s.wait_printed('after zone-3 restarted')
s.finish()
