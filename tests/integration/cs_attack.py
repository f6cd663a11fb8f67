#!/usr/bin/env python3
"""cs_attack.py — hostile change stream clients through a router (cs_hostile_test.sh), on top of
hostile/cslib.py. Prints "ok: WHAT" or "FAIL: WHAT ..."; exit status 1 when a case failed.

  cs_attack.py flood PORT ROUTER_PID NODE_PID STREAMS ROWS BYTES LIMIT_MB [NODE_LIMIT_MB]
      STREAMS live ReadChangeStreams of a table (250 per connection) that never read, while
      ROWS rows of BYTES are written: every write succeeds (more than 256 streams used to take
      every stream slot of the router's node connection, and every other call to the node
      waited), other clients are served, a fresh stream from before the writes gets every row,
      and the router grows by at most LIMIT_MB, the node by at most NODE_LIMIT_MB (default
      LIMIT_MB; both printed).
  cs_attack.py cap PORT MAX METRICS_ADDR
      against a router started with --max-change-streams MAX and --metrics METRICS_ADDR: MAX
      unread streams are relayed (strata_router_change_streams), the next one is
      RESOURCE_EXHAUSTED, no unread stream ended but for a failed node link, and once the client
      closed them new streams are served.
  cs_attack.py disable PORT
      a stream is open when change streams are turned off: it ends with a clean status, and a
      new stream of the table is FAILED_PRECONDITION; ReadChangeStream of a table that never had
      streams is FAILED_PRECONDITION too.
  cs_attack.py inputs PORT
      malformed tokens, times, heartbeats and partitions: each INVALID_ARGUMENT.
"""
import os, re, socket, sys, threading, time, urllib.request
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from cslib import *
from h2raw import Conn, grpc_msg, DATA, HEADERS, RST
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sec_attack import grpc_status

failed = []


def expect(what, ok, detail=''):
    print(('ok: %s %s' % (what, detail)) if ok else 'FAIL: %s %s' % (what, detail))
    if not ok: failed.append(what)


def rss_mb(pid):
    for line in open('/proc/%d/status' % pid):
        if line.startswith('VmRSS:'): return int(line.split()[1]) // 1024
    return 0


def rcall(port, path, body, limit=60):
    """One call on a new connection: (response bytes, grpc-status as a string, end reason)."""
    c = Conn(port, timeout=limit)
    sid = c.headers(path)
    c.data_fc(sid, grpc_msg(body))
    data, hdrs, why = c.wait_end(sid, limit)
    c.s.close()
    st = grpc_status(data, hdrs, why)
    return data, ('0' if st == 'end' else st), why


def flood(port, rpid, npid, streams, rows, nbytes, limit_mb, node_limit_mb=None):
    T = 'csflood%d' % (now_us() % 100000)
    rcall(port, ADMIN + 'CreateTable', fld(1, INST) + fld(2, T) + fld(3, fld(3, fld(1, 'cf') + fld(2, b'')) +
                                                              fld(8, fld(1, fld(1, 86400)))))
    start = now_us()
    base_r, base_n = rss_mb(rpid), rss_mb(npid)
    conns = []
    req = cs_req(T, start_us=start, hb_s=1)
    for i in range(streams):
        if i % 250 == 0: conns.append(Conn(port, timeout=30))
        c = conns[-1]
        sid = c.headers(BT + 'ReadChangeStream')
        c.data(sid, grpc_msg(req))  # and never read again: windows fill, the server must hold back
    time.sleep(0.5)
    errs = []
    val = b'v' * nbytes
    for k in range(rows):
        _, st, why = rcall(port, BT + 'MutateRow', fld(1, tname(T)) + fld(2, 'row%04d' % k) + fld(3, set_cell('cf', 'q', val)),
                           limit=20)
        if st != '0':
            errs.append((k, st, why))
            break
    expect('%d writes succeed with %d unread streams open' % (rows, streams), not errs, str(errs[:3]))
    if errs:
        for c in conns: c.s.close()
        return
    # Another client is served: a table admin call and a read.
    _, st, why = rcall(port, ADMIN + 'ListTables', fld(1, INST), limit=30)
    expect('ListTables served meanwhile', st == '0', str((st, why)))
    seen = set()
    end = now_us()

    def on(e):
        if e[0] == 'rec': seen.add(e[1])
    why = stream_cs(port, cs_req(T, start_us=start, end_us=end, hb_s=1), on, limit=120)
    expect('a fresh stream gets every row', len(seen) == rows, 'got %d of %d (%s)' % (len(seen), rows, why))
    grow_r, grow_n = rss_mb(rpid) - base_r, rss_mb(npid) - base_n
    for _ in range(20):  # the unread streams may still be filling: the peak of the next 2 s
        time.sleep(0.1)
        grow_r, grow_n = max(grow_r, rss_mb(rpid) - base_r), max(grow_n, rss_mb(npid) - base_n)
    nbound = node_limit_mb if node_limit_mb is not None else limit_mb
    print('  RSS growth with %d unread streams: router %d MB (bound %d MB), node %d MB (bound %d MB)' %
          (streams, grow_r, limit_mb, grow_n, nbound))
    expect('router memory bounded', grow_r <= limit_mb, '%d MB' % grow_r)
    expect('node memory bounded', grow_n <= nbound, '%d MB' % grow_n)
    for c in conns: c.s.close()


def router_cs(maddr):
    """(ReadChangeStream calls the router relays now, {code: its finished ReadChangeStream
    calls}) from the router's /metrics."""
    text = urllib.request.urlopen('http://%s/metrics' % maddr, timeout=10).read().decode()
    m = re.search(r'^strata_router_change_streams (\d+)', text, re.M)
    codes = {}
    for h in re.finditer(r'strata_rpc_server_handled_total\{([^}]*)\} (\d+)', text):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', h.group(1)))
        if lab.get('method') == 'ReadChangeStream' and int(h.group(2)):
            codes[lab['code']] = int(h.group(2))
    return (int(m.group(1)) if m else -1), codes


def ended(c, sids, wait=0.2):
    """The streams of sids that ended on c (END_STREAM or RST_STREAM) among the frames that
    arrive within wait seconds. No window is returned: the streams stay unread."""
    gone = set()
    c.s.settimeout(wait)
    try:
        while True:
            t, fl, s, _ = c.read_frame()
            if s in sids and (t == RST or (t in (DATA, HEADERS) and fl & 1)):
                gone.add(s)
    except (socket.timeout, BlockingIOError):
        pass
    return gone


CODE_NAMES = {'0': 'OK', '8': 'RESOURCE_EXHAUSTED', '14': 'UNAVAILABLE'}


def other_ends(base, now):
    """ReadChangeStream calls that ended with a status no step of cap() accounts for."""
    return [k for k in now if now[k] != base.get(k, 0) and k not in CODE_NAMES.values()]


def cap(port, most, maddr):
    """MAX unread streams on one connection, then one more: RESOURCE_EXHAUSTED; the slots come
    back when the client goes away. The next stream is asked for only once the router's
    strata_router_change_streams says it relays all MAX (they arrive on their own connection,
    possibly after it). A stream that a failed node link ended meanwhile (UNAVAILABLE, e.g. its
    node's loop stalled past the link's keepalive: docs/changestreams.md, The router) gave its
    slot back: it is opened again, as a client resuming would, and the next one asked for again;
    the router's count of finished ReadChangeStream calls must show no other end of an unread
    stream."""
    T = 'cscap%d' % (now_us() % 100000)
    _, st, why = rcall(port, ADMIN + 'CreateTable', fld(1, INST) + fld(2, T) + fld(3, fld(3, fld(1, 'cf') + fld(2, b'')) +
                                                                          fld(8, fld(1, fld(1, 86400)))))
    if st != '0':
        expect('CreateTable', False, str((st, why)))
        return
    t0 = now_us()
    req = cs_req(T, start_us=t0, hb_s=1)
    bounded = cs_req(T, start_us=t0, end_us=t0 + 1000)  # ends at once with CloseStream OK
    _, base = router_cs(maddr)
    want = {}  # the finished calls the router should count: each poll's status, the ended streams
    c = Conn(port, timeout=30)
    held = set()
    st = why = None
    for _ in range(5):
        deadline = time.time() + 60
        while True:
            gone = ended(c, held, 0.05)
            held -= gone
            want['UNAVAILABLE'] = want.get('UNAVAILABLE', 0) + len(gone)
            if gone and other_ends(base, router_cs(maddr)[1]):
                break  # not a failed link: reported below, not replaced
            while len(held) < most:
                sid = c.headers(BT + 'ReadChangeStream')
                c.data(sid, grpc_msg(req))  # and never read: no window is returned
                held.add(sid)
            if router_cs(maddr)[0] >= most or time.time() > deadline:
                break
        if other_ends(base, router_cs(maddr)[1]):
            break
        relayed = router_cs(maddr)[0]
        if relayed < most:
            print('  only %d of %d unread streams relayed after 60 s' % (relayed, most))
            break
        _, st, why = rcall(port, BT + 'ReadChangeStream', bounded, limit=30)
        name = CODE_NAMES.get(st, st)
        want[name] = want.get(name, 0) + 1
        after = router_cs(maddr)[0]
        print('  %d of %d streams relayed, stream %d: %s, then %d relayed' % (relayed, most, most + 1, st, after))
        if st == '8' or (st == '0' and after >= most) or st not in CODE_NAMES:
            break  # refused, or served past the cap: decided
    expect('stream %d past --max-change-streams %d is RESOURCE_EXHAUSTED' % (most + 1, most), st == '8',
           str((st, why)))
    relayed, got = router_cs(maddr)  # one scrape: the count and the calls agree
    want['UNAVAILABLE'] = want.get('UNAVAILABLE', 0) + most - relayed  # ended, not replaced
    got = dict((k, got.get(k, 0) - base.get(k, 0)) for k in got if got.get(k, 0) != base.get(k, 0))
    want = dict((k, v) for k, v in want.items() if v)
    expect('no unread stream ended but for a failed node link', got == want, 'calls ended %s, expected %s' % (got, want))
    c.s.close()
    for _ in range(100):  # the router frees the slots once it sees the connection gone: poll
        _, st, why = rcall(port, BT + 'ReadChangeStream', bounded, limit=30)
        if st == '0':
            break
        time.sleep(0.1)
    expect('streams are served again once the client closed its streams', st == '0', str((st, why)))


def disable(port):
    T = 'csdisable%d' % (now_us() % 100000)
    rcall(port, ADMIN + 'CreateTable', fld(1, INST) + fld(2, T) + fld(3, fld(3, fld(1, 'cf') + fld(2, b'')) +
                                                              fld(8, fld(1, fld(1, 86400)))))
    t0 = now_us()
    rcall(port, BT + 'MutateRow', fld(1, tname(T)) + fld(2, 'a') + fld(3, set_cell('cf', 'q', 'v')))
    res = {}

    def reader():
        c = Conn(port, timeout=60)
        sid = c.headers(BT + 'ReadChangeStream')
        c.data_fc(sid, grpc_msg(cs_req(T, start_us=t0, hb_s=1)))
        data, hdrs, why = c.wait_end(sid, 60)
        res['st'], res['why'], res['evs'] = grpc_status(b'', hdrs, why), why, decode(data)
    th = threading.Thread(target=reader)
    th.start()
    time.sleep(1.5)
    _, st, why = rcall(port, ADMIN + 'UpdateTable', fld(1, fld(1, tname(T))) + fld(2, fld(1, 'change_stream_config')))
    expect('UpdateTable turns streams off with a stream open', st == '0', str((st, why)))
    th.join(60)
    recs = [e for e in res.get('evs', []) if e[0] == 'rec']
    expect('the open stream got the row written before', len(recs) >= 1, str(len(recs)))
    expect('the open stream ends with a clean status once streams are off', res.get('st') not in ('0', 'timeout'),
           str((res.get('st'), res.get('why'))))
    _, st, why = rcall(port, BT + 'ReadChangeStream', cs_req(T, start_us=t0, hb_s=1), limit=10)
    expect('a new stream after streams are off is FAILED_PRECONDITION', st == '9', str((st, why)))
    rcall(port, ADMIN + 'CreateTable', fld(1, INST) + fld(2, 'csnever%d' % (t0 % 100000)) + fld(3, fld(3, fld(1, 'cf') + fld(2, b''))))
    _, st, why = rcall(port, BT + 'ReadChangeStream', cs_req('csnever%d' % (t0 % 100000), hb_s=1), limit=10)
    expect('ReadChangeStream of a table without streams is FAILED_PRECONDITION', st == '9', str((st, why)))


def inputs(port):
    """Hostile ReadChangeStream requests through the router: each a clean INVALID_ARGUMENT."""
    T = 'csin%d' % (now_us() % 100000)
    rcall(port, ADMIN + 'CreateTable', fld(1, INST) + fld(2, T) + fld(3, fld(3, fld(1, 'cf') + fld(2, b'')) +
                                                              fld(8, fld(1, fld(1, 86400)))))
    t0 = now_us()
    rcall(port, BT + 'MutateRow', fld(1, tname(T)) + fld(2, 'r') + fld(3, set_cell('cf', 'q', 'v')))
    now = now_us()
    tok = lambda t: cs_req(T, tokens=[(b'', t)], end_us=now + 300000)
    cases = [
        ('token garbage', tok('garbage')),
        ('token truncated', tok('1.')),
        ('token with a NUL', tok('1.%d\x00' % t0)),
        ('token H below W', tok('1.%d.%d.72' % (now, t0))),
        ('token of another partition', cs_req(T, tokens=[(rng('a', 'b'), '1.%d' % t0)], end_us=now + 300000)),
        ('token before the history', tok('1.1')),
        ('token version 2', tok('2.%d' % t0)),
        ('end_time before start_time', cs_req(T, start_us=now, end_us=t0)),
        ('start_time a day ahead', cs_req(T, start_us=now + 86400 * 10**6)),
        ('start_time in 1970', cs_req(T, start_us=1, end_us=now)),
        ('negative start_time', cs_req(T, start_us=-5 * 10**6, end_us=now)),
        ('heartbeat negative', cs_req(T, start_us=t0, end_us=now + 300000, hb_s=-1)),
        ('heartbeat nanos negative', cs_req(T, start_us=t0, end_us=now + 300000, hb_ns=-1)),
        ('partition start above end', cs_req(T, partition=rng('z', 'a'), start_us=t0)),
        ('partition key of 200 KB', cs_req(T, partition=rng('a' * 200000), start_us=t0)),
    ]
    for what, req in cases:
        _, st, why = rcall(port, BT + 'ReadChangeStream', req, limit=15)
        expect(what + ' is INVALID_ARGUMENT', st == '3', str((st, why)))
    for what, req in (('heartbeat 0 (the default)', cs_req(T, start_us=t0, end_us=now + 300000, hb_s=0)),
                      ('heartbeat of 2^62 s', cs_req(T, start_us=t0, end_us=now + 300000, hb_s=1 << 62))):
        data, st, why = rcall(port, BT + 'ReadChangeStream', req, limit=15)
        recs = [e for e in decode(data) if e[0] == 'rec']
        expect(what + ' reads the row', st == '0' and len(recs) == 1, str((st, why, len(recs))))
    _, st, why = rcall(port, BT + 'ReadChangeStream', cs_req('nope' + T, start_us=t0), limit=15)
    expect('an unknown table is NOT_FOUND', st == '5', str((st, why)))


def main():
    cmd, port = sys.argv[1], int(sys.argv[2])
    if cmd == 'flood': flood(port, int(sys.argv[3]), int(sys.argv[4]), *map(int, sys.argv[5:10]))
    elif cmd == 'cap': cap(port, int(sys.argv[3]), sys.argv[4])
    elif cmd == 'disable': disable(port)
    elif cmd == 'inputs': inputs(port)
    else: sys.exit('unknown command ' + cmd)
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
