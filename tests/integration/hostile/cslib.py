"""cslib.py — change stream helpers for the hostile scripts (stdlib only, on top of h2raw.py):
admin and write calls, a ReadChangeStream request builder and a response decoder."""
import os, struct, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h2raw import Conn, fld, grpc_msg, varint, frame, WINUP, RST, status_of

INST = 'projects/p/instances/i'
BT = '/google.bigtable.v2.Bigtable/'
ADMIN = '/google.bigtable.admin.v2.BigtableTableAdmin/'


def tname(t):
    return INST + '/tables/' + t


def ts(us):
    return fld(1, us // 1000000) + fld(2, (us % 1000000) * 1000)


def now_us():
    return int(time.time() * 1e6)


def rfc3339(us):
    """us (microseconds since the epoch) as `strata changes --from` takes it."""
    return time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(us // 10**6)) + '.%06dZ' % (us % 10**6)


def varint_at(b, i):
    v, shift = 0, 0
    while True:
        c = b[i]; i += 1
        v |= (c & 127) << shift; shift += 7
        if not c & 128:
            return v, i


def fields(b):
    i = 0
    while i < len(b):
        key, i = varint_at(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0: v, i = varint_at(b, i)
        elif wt == 2:
            n, i = varint_at(b, i); v, i = b[i:i + n], i + n
        elif wt == 1: v, i = b[i:i + 8], i + 8
        elif wt == 5: v, i = b[i:i + 4], i + 4
        else: raise ValueError('wire type %d' % wt)
        yield num, wt, v


def msgs(data):
    i = 0
    while i + 5 <= len(data):
        n = struct.unpack('>I', data[i + 1:i + 5])[0]
        yield data[i + 5:i + 5 + n]; i += 5 + n


def call(port, path, body, limit=60, conn=None):
    c = conn or Conn(port, timeout=limit)
    sid = c.headers(path)
    c.data_fc(sid, grpc_msg(body))
    data, hdrs, why = c.wait_end(sid, limit)
    return data, status_of(hdrs), why


def create_cs(port, table, families=('cf',), retention=86400):
    fams = b''.join(fld(3, fld(1, f) + fld(2, b'')) for f in families)
    cfg = fld(8, fld(1, fld(1, retention))) if retention else b''
    return call(port, ADMIN + 'CreateTable', fld(1, INST) + fld(2, table) + fld(3, fams + cfg))


def update_cs(port, table, retention):
    cfg = fld(8, fld(1, fld(1, retention))) if retention else b''
    mask = fld(2, fld(1, 'change_stream_config'))
    return call(port, ADMIN + 'UpdateTable', fld(1, fld(1, tname(table)) + cfg) + mask)


def create_profile(port, name, cluster):
    """A single-cluster app profile routed to cluster, with transactional writes allowed."""
    return call(port, '/google.bigtable.admin.v2.BigtableInstanceAdmin/CreateAppProfile',
                fld(1, INST) + fld(2, name) + fld(3, fld(6, fld(1, cluster))) + fld(4, 1))


def set_cell(fam, q, val, ts_us=-1):
    return fld(1, fld(1, fam) + fld(2, q) + fld(3, ts_us) + fld(4, val))


def mutate(port, table, row, muts, conn=None, profile=None):
    body = fld(1, tname(table)) + (fld(4, profile) if profile else b'') + fld(2, row) + b''.join(fld(3, m) for m in muts)
    return call(port, BT + 'MutateRow', body, conn=conn)


def cs_req(table, partition=b'', start_us=None, end_us=None, tokens=None, hb_ns=None, hb_s=None, profile=None):
    r = fld(1, tname(table))
    if profile is not None: r += fld(2, profile)
    r += fld(3, fld(1, partition)) if partition is not None else b''
    if start_us is not None: r += fld(4, ts(start_us))
    if end_us is not None: r += fld(5, ts(end_us))
    if tokens is not None:
        r += fld(6, b''.join(fld(1, fld(1, fld(1, p)) + fld(2, t)) for p, t in tokens))
    if hb_ns is not None or hb_s is not None:
        r += fld(7, (fld(1, hb_s) if hb_s is not None else b'') + (fld(2, hb_ns) if hb_ns is not None else b''))
    return r


def rng(start=None, end=None):
    return (fld(1, start) if start is not None else b'') + (fld(3, end) if end is not None else b'')


def decode(data):
    """-> list of events: ('rec', row, type, source, token, [(fam,q,ts,value_len)...]), ('hb', token, wm),
    ('close', code, tokens, new_partitions)."""
    out, cur = [], None
    for m in msgs(data):
        for num, wt, v in fields(m):
            if num == 1:
                d = dict(); cells = []
                for f, _, x in fields(v):
                    if f == 6:
                        for cf, _, cx in fields(x):
                            if cf == 2:
                                for mf, _, mx in fields(cx):
                                    if mf == 1:
                                        sc = dict((a, b) for a, _, b in fields(mx))
                                        cells.append(('set', sc.get(1), sc.get(2), sc.get(3), len(sc.get(4, b''))))
                                    else:
                                        cells.append((('', 'set', 'delcol', 'delfam')[mf] if mf < 4 else mf,) + tuple(b for a, _, b in fields(mx))[:2])
                    else:
                        d[f] = x
                if d.get(1) != 3 or cur is None:  # not CONTINUATION
                    cur = ['rec', d.get(3), d.get(1), d.get(2), None, cells]
                else:
                    cur[5] += cells
                if d.get(8):
                    cur[4] = d.get(9, b'').decode(); out.append(tuple(cur)); cur = None
            elif num == 2:
                d = dict((a, b) for a, _, b in fields(v))
                tok = dict((a, b) for a, _, b in fields(d.get(1, b''))).get(2, b'').decode()
                out.append(('hb', tok, d.get(2)))
            elif num == 3:
                code, msg, toks, parts = 0, b'', [], []
                for f, _, x in fields(v):
                    if f == 1:
                        sd = dict((a, b) for a, _, b in fields(x)); code = sd.get(1, 0); msg = sd.get(2, b'')
                    if f == 2:
                        tk = dict((a, b) for a, _, b in fields(x))
                        toks.append((dict((a, b) for a, _, b in fields(tk.get(1, b''))).get(1, b''), tk.get(2, b'').decode()))
                    if f == 3: parts.append(x)
                out.append(('close', code, toks, parts, msg))
    return out


def read_cs(port, req, limit=10, conn=None):
    c = conn or Conn(port, timeout=limit)
    sid = c.headers(BT + 'ReadChangeStream')
    c.data_fc(sid, grpc_msg(req))
    data, hdrs, why = c.wait_end(sid, limit)
    return decode(data), status_of(hdrs), why


def ncall(port, path, body, limit=8):
    """One call through node:http2 (grpcraw.js): (events or raw data, status, message, err)."""
    import subprocess, json, base64
    p = subprocess.run(['node', os.path.join(os.path.dirname(os.path.abspath(__file__)), 'grpcraw.js'),
                        str(port), path, str(int(limit * 1000))], input=body.hex(), capture_output=True, text=True)
    try:
        j = json.loads(p.stdout.strip().splitlines()[-1])
    except Exception:
        return None, None, None, 'node: ' + p.stderr[-300:]
    return base64.b64decode(j['data']), j['status'], j['message'], j['err']


def ncs(port, req, limit=8):
    data, st, msg, err = ncall(port, BT + 'ReadChangeStream', req, limit)
    return (decode(data) if data is not None else None), st, msg, err


def stream_cs(port, req, on_event, limit=60, conn=None):
    """Reads a ReadChangeStream as it comes, calling on_event(event) for each decoded event
    (decode()'s tuples); returns the end reason ('end', 'rst:N', 'eof:...', 'timeout')."""
    from h2raw import DATA, HEADERS, GOAWAY
    import socket
    c = conn or Conn(port, timeout=limit)
    sid = c.headers(BT + 'ReadChangeStream')
    c.data_fc(sid, grpc_msg(req))
    buf = b''; end = time.time() + limit; partial = b''
    c.s.settimeout(limit)
    while time.time() < end:
        try: t, fl, s, p = c.read_frame()
        except socket.timeout: return 'timeout'
        except (EOFError, ConnectionResetError, OSError) as e: return 'eof:' + str(e)
        if t == GOAWAY: return 'goaway'
        if s != sid: continue
        if t == DATA and p:
            c.s.sendall(frame(WINUP, 0, 0, struct.pack('>I', len(p))) + frame(WINUP, 0, sid, struct.pack('>I', len(p))))
            buf += p
            # only whole gRPC messages; records may span messages: decode keeps CONTINUATIONs in
            # one event only when given whole records, so cut at the last message ending a record
            i = 0; cut = 0
            while i + 5 <= len(buf):
                n = struct.unpack('>I', buf[i + 1:i + 5])[0]
                if i + 5 + n > len(buf): break
                i += 5 + n
                cut = i
            if cut:
                partial += buf[:cut]; buf = buf[cut:]
                evs = decode(partial)
                # keep an unfinished record (no 'done') for later: re-decode from its first message
                done_upto = 0; j = 0; open_start = None
                for m in msgs(partial):
                    mlen = 5 + len(m)
                    is_dc = False; fin = False
                    for num, wt, v in fields(m):
                        if num == 1:
                            is_dc = True
                            for f, _, x in fields(v):
                                if f == 8 and x: fin = True
                    if is_dc and not fin:
                        if open_start is None: open_start = j
                    else:
                        open_start = None
                    j += mlen
                if open_start is not None:
                    keep = partial[open_start:]; partial = partial[:open_start]
                    evs = decode(partial); partial = keep
                else:
                    partial = b''
                for e in evs: on_event(e)
        if t == RST: return 'rst:%d' % struct.unpack('>I', p)[0]
        if t == HEADERS and fl & 1: return 'end'
        if t == DATA and fl & 1: return 'end'
    return 'timeout'


def row_keys(port, table, profile=None):
    """Row keys a full ReadRows of table returns (from the chunks' row_key fields)."""
    body = fld(1, tname(table)) + (fld(5, profile) if profile else b'')
    data, st, why = call(port, BT + 'ReadRows', body, limit=60)
    keys = []
    for m in msgs(data):
        for num, wt, v in fields(m):
            if num == 1:
                for f, _, x in fields(v):
                    if f == 1 and x: keys.append(x.decode())
    return keys, why


def topology_nodes(d):
    """The nodes of the instance in d (`strata up --dir d`): [(name, port)], name as east-0."""
    nodes = []
    for line in open(os.path.join(d, 'topology')):
        p = line.split()
        if len(p) >= 4 and p[0] == 'node': nodes.append((os.path.basename(p[3]), int(p[2].rsplit(':', 1)[1])))
    return nodes


def tablets_on(nport, table, incoming=False):
    """The tablets of table on the node at nport that serve it: [(id, start, end)], b'' for an
    open end. A move's incoming copy (Tablet.incoming = 9) serves nothing and is left out, unless
    incoming is true."""
    data, st, why = call(nport, '/strata.internal.v1.Node/ListTablets', fld(1, tname(table)), limit=10)
    out = []
    for m in msgs(data):
        for f, _, v in fields(m):
            if f == 1:
                t = dict((a, b) for a, _, b in fields(v))
                if t.get(2, b'').decode().endswith('/' + table) and (incoming or not t.get(9)):
                    out.append((t.get(1), t.get(3, b''), t.get(4, b'')))
    return out


def split_tablets(nodes, table, key):
    """Splits table's tablet holding key at key on whichever of nodes [(name, port)] holds it,
    until a tablet starts at key; the balancer may move the tablet meanwhile: it is found again."""
    k = key.encode()
    for _ in range(20):
        held = [(n, p, t) for n, p in nodes for t in tablets_on(p, table)]
        if any(t[1] == k for _, _, t in held): break
        for n, p, t in held:
            if t[1] < k and (not t[2] or t[2] > k):
                data, st, why = call(p, '/strata.internal.v1.Node/SplitTablet', fld(1, t[0]) + fld(2, key), limit=20)
                print('split tablet %d at %s on %s: %s %s' % (t[0], key, n, why, st))
        time.sleep(0.2)
    print('tablets: %s' % [(n, t[1], t[2]) for n, p in nodes for t in tablets_on(p, table)])


def move_tablet(nodes, table, key):
    """Moves table's tablet starting at key to another of nodes [(name, port)]: (from, to) names,
    None when no tablet starts at key."""
    for n, p, t in [(n, p, t) for n, p in nodes for t in tablets_on(p, table)]:
        if t[1] == key.encode():
            other = [(m, q) for m, q in nodes if m != n][0]
            data, st, why = call(p, '/strata.internal.v1.Node/MoveTablet', fld(1, t[0]) + fld(2, '127.0.0.1:%d' % other[1]),
                                 limit=30)
            print('move [%s, ) from %s to %s: %s %s' % (key, n, other[0], why, st))
            return n, other[0]
    return None
