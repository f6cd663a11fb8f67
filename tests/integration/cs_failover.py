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
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from cslib import now_us
from csconsumer import Stream

s = Stream(int(sys.argv[1]), sys.argv[2], sys.argv[3], 'fo', profile='p')
s.make_profile(s.profile, 'east')
s.create()
s.start_consumer()
s.write(16)
s.wait_printed('east, before the failover')
s.run('chaos', 'partition', 'east', 'west')
s.run('failover', s.profile, 'west')
s.write(16)  # on west only: the links are cut
t_west = now_us()
print('wrote %d, the last 16 on west only' % len(s.acked))
s.wait_tokens_pass(t_west, 'the west writes')  # the consumer's east tokens (heartbeats)
print('checkpoint tokens at %s, the west writes up to %d' % (s.checkpoint_times(), t_west))
s.kill_consumer('it resumes from its checkpoint (east tokens) on west')
s.start_consumer()
s.run('chaos', 'heal')
s.write(8)
s.wait_printed('after the failover')
s.finish()
