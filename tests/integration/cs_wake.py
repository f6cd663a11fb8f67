#!/usr/bin/env python3
"""cs_wake.py PORT DIR — a change stream asked for heartbeats a day apart (heartbeat_duration
100 days, kept at one day) must still end at once when its partition stops being served here, on
`strata up --clusters 1 --nodes 2`, through the router, with no write to its node afterwards:
  - its tablet moved to the other node: CloseStream OUT_OF_RANGE, and the row written meanwhile
    to the new node comes when the new partition is read from the CloseStream's token;
  - its tablet split: CloseStream OUT_OF_RANGE with two new partitions;
  - change streams of its table turned off: FAILED_PRECONDITION;
  - its table deleted: NOT_FOUND.
Each used to wait for the next heartbeat (a day) or a write to the same node (after a move,
there is none): the stream stayed open and silent while the table's writes went elsewhere.
Exit 0 when all hold, 1 otherwise."""
import os, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import *
from csconsumer import Checks
from sec_attack import grpc_status

port, d = int(sys.argv[1]), sys.argv[2]
checks = Checks()
expect = checks.expect
HB_S = 100 * 86400
LIMIT = 10  # a hang guard: the answer comes within a second when the stream is woken
nodes = topology_nodes(d)


def stream(table, partition=None, tokens=None):
    """Starts a ReadChangeStream of table from now in a thread: a dict filled at its end with
    the events, the grpc-status and how long it took."""
    out = {}
    req = cs_req(table, partition=partition or rng(), hb_s=HB_S, tokens=tokens,
                 start_us=None if tokens else now_us())

    def run():
        t0 = time.time()
        c = Conn(port, timeout=LIMIT)
        sid = c.headers(BT + 'ReadChangeStream')
        c.data_fc(sid, grpc_msg(req))
        data, hdrs, why = c.wait_end(sid, LIMIT)
        c.s.close()
        out.update(ev=decode(data), why=why, st=grpc_status(data, hdrs, why), s=time.time() - t0)
    th = threading.Thread(target=run)
    th.start()
    time.sleep(1)  # the stream is open and idle on its node
    return th, out


def closes(out):
    return [e for e in out['ev'] if e[0] == 'close']


def new_table(name):
    t = '%s%d' % (name, now_us() % 100000)
    expect('create %s' % t, create_cs(port, t)[2] == 'end')
    expect('write a', mutate(port, t, 'a', [set_cell('cf', 'q', 'va')])[2] == 'end')
    return t


# 1. the tablet moves to the other node; a row is written there
T = new_table('wm')
th, out = stream(T)
moved = move_tablet(nodes, T, '')
expect('the tablet moved', moved is not None)
expect('write b to the new node', mutate(port, T, 'b', [set_cell('cf', 'q', 'vb')])[2] == 'end')
th.join()
cl = closes(out)
expect('move: the stream ends with CloseStream OUT_OF_RANGE', out['why'] == 'end' and
       len(cl) == 1 and cl[0][1] == 11, '%s %s after %.1f s' % (out['why'], cl, out['s']))
if cl and cl[0][2]:
    p, tok = cl[0][2][0]
    # read the new partition from its token up to now: row b comes
    end = now_us()
    ev, st, why = read_cs(port, cs_req(T, partition=p, tokens=[(p, tok)], end_us=end), limit=LIMIT)
    expect('the new partition read from its token has row b',
           any(e[0] == 'rec' and e[1] == b'b' for e in ev), '%s %s' % (why, [e[:2] for e in ev]))

# 2. the tablet splits, no write follows
th, out = stream(T)
split_tablets(nodes, T, 'm')
th.join()
cl = closes(out)
expect('split: the stream ends with CloseStream OUT_OF_RANGE and two partitions',
       out['why'] == 'end' and len(cl) == 1 and cl[0][1] == 11 and len(cl[0][3]) == 2,
       '%s %s after %.1f s' % (out['why'], cl, out['s']))

# 3. change streams turned off
T = new_table('wo')
th, out = stream(T)
expect('streams off', update_cs(port, T, 0)[2] == 'end')
th.join()
expect('streams off: the stream ends FAILED_PRECONDITION', out['st'] == '9',
       '%s %s after %.1f s' % (out['why'], out['st'], out['s']))

# 4. the table is deleted
T = new_table('wd')
th, out = stream(T)
expect('delete', call(port, ADMIN + 'DeleteTable', fld(1, tname(T)))[2] == 'end')
th.join()
expect('deleted: the stream ends NOT_FOUND', out['st'] == '5',
       '%s %s after %.1f s' % (out['why'], out['st'], out['s']))
checks.exit()
