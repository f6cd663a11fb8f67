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
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from cslib import move_tablet, now_us, split_tablets, topology_nodes
from csconsumer import Stream

s = Stream(int(sys.argv[1]), sys.argv[2], sys.argv[3], 'fs', profile='p',
           rows=['%c%02d' % ('bhnt'[i % 4], i) for i in range(8)])


def nodes(cluster):
    return [(n, p) for n, p in topology_nodes(s.d) if n.startswith(cluster + '-')]


moving = {'west': '', 'east': 'm'}


def fail_over(frm, to):
    s.run('chaos', 'partition', 'east', 'west')
    s.run('failover', s.profile, to)
    s.write(6)  # on the new cluster only: the links are cut
    if not move_tablet(nodes(to), s.table, moving[to]):  # the new cluster moves a tablet meanwhile
        s.fail('no tablet of %s starts at %s' % (to, moving[to]))
    s.write(6)
    s.wait_tokens_pass(now_us(), 'the writes on %s' % to)  # the consumer's tokens, issued by frm
    s.kill_consumer('it resumes from its checkpoint (%s tokens %s) on %s' % (frm, s.checkpoint_times(), to))
    s.start_consumer()
    s.run('chaos', 'heal')
    s.write(4)
    s.wait_printed('after the failover %s -> %s' % (frm, to))


s.make_profile(s.profile, 'east')
s.create()
s.start_consumer()
s.write(8)
s.wait_printed('east, before the split')
split_tablets(nodes('east'), s.table, 'm')
s.write(8)
s.wait_printed('east, after its split at m')
fail_over('east', 'west')
split_tablets(nodes('west'), s.table, 'g')
s.write(8)
s.wait_printed('west, after its split at g')
fail_over('west', 'east')
s.finish()
