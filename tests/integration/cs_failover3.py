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
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from cslib import now_us
from csconsumer import Stream

s = Stream(int(sys.argv[1]), sys.argv[2], sys.argv[3], 'f3', profile='p')
s.writer_profile = 'q' + s.table


def fail_over(cut, frm, to):
    """Cuts cut<->zone-3, writes on zone-3, waits for the consumer's tokens (issued by frm) to
    pass those writes, kills it, points P at to and starts it again from its checkpoint."""
    s.run('chaos', 'partition', cut, 'zone-3')
    s.write(12)  # zone-3 accepts them; cut has not applied them
    s.wait_tokens_pass(now_us(), 'the zone-3 writes')
    s.kill_consumer('it resumes from its checkpoint (%s tokens) on %s' % (frm, to))
    s.run('failover', s.profile, to)
    s.start_consumer()
    s.run('chaos', 'heal')
    s.write(4)
    s.wait_printed('after the failover %s -> %s' % (frm, to))


s.make_profile(s.profile, 'east')
s.make_profile(s.writer_profile, 'zone-3')
s.create()
s.start_consumer()
s.write(8)
s.wait_printed('east, before the failover')
fail_over('east', 'east', 'west')
fail_over('west', 'west', 'east')
s.finish()
