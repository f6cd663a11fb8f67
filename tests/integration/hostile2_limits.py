#!/usr/bin/env python3
"""hostile2_limits.py PORT CA TOKENS MAXCONN — slow and greedy clients against a router with small
connection limits (hostile2_sec_test.sh starts it with --max-connections MAXCONN and short
--handshake-timeout-ms, --slow-client-timeout-ms and --idle-timeout-s). Each case prints
"ok: WHAT" or "FAIL: WHAT: ..."; the exit status is 1 when a case failed. Waits are polls with
generous bounds, never timing assertions."""
import os, socket, struct, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
from sec_attack import TConn, expect, failed, grpc_status, bearer, tokens_of, fld, grpc_msg, TA, INST
from h2raw import frame, HEADERS, DATA, PING, hlit

port, ca, toks, maxconn = int(sys.argv[1]), sys.argv[2], tokens_of(sys.argv[3]), int(sys.argv[4])
A = toks['admin']


def list_tables(c, limit=30):
    sid = c.headers(TA + 'ListTables', bearer(A))
    c.data(sid, grpc_msg(fld(1, INST)))
    data, h, why = c.wait_end(sid, limit)
    return grpc_status(data, h, why)


def closed_within(s, limit):
    """True when the server closes socket s (EOF or reset) within limit seconds; reads and drops
    whatever it sends first (a GOAWAY, TLS alerts)."""
    end = time.time() + limit
    while time.time() < end:
        s.settimeout(max(0.1, end - time.time()))
        try:
            if not s.recv(65536): return True
        except socket.timeout: return False
        except (ConnectionResetError, BrokenPipeError): return True
        except OSError: return True
    return False


def fresh_call(limit=30):
    try:
        c = TConn(port, ca, timeout=limit)
        st = list_tables(c, limit)
        c.s.close()
        return st
    except (OSError, EOFError) as e:
        return 'error:' + type(e).__name__


# 1. Clients that never finish their handshake cannot take the connection limit: at the limit
#    each new connection closes the oldest connection still in its handshake (an established one
#    only when there is none), so new clients are served throughout and the established
#    connection that made its call before the storm is kept; the stalled ones are closed (to make
#    room, or at the handshake timeout). New TLS clients used to be refused for as long as the
#    stalled handshakes held the limit, and then the idle established connection was closed
#    first to make room for them.
legit = TConn(port, ca, timeout=30)
expect('established connection before the storm', '0', list_tables(legit))
held = []
for _ in range(maxconn + 10):
    try:
        s = socket.create_connection(('127.0.0.1', port), timeout=10)
        s.sendall(b'\x16\x03\x01\x02\x00\x01')  # a ClientHello begun, never finished
        held.append(s)
    except OSError:
        break
# A TLS client at the limit is served, and is never sent plaintext HTTP/2 frames (which TLS reads
# as a server without TLS, "wrong version number").
try:
    c = TConn(port, ca, timeout=30)
    over = 'served:' + list_tables(c)
    c.s.close()
except (OSError, EOFError) as e:
    over = 'refused:' + repr(e)
expect('a TLS client at the limit is served', 'served:0', over)
expect('new clients served while the storm goes on', [['0'] * 5], [fresh_call() for _ in range(5)])
expect('the established connection was kept through the storm', '0', list_tables(legit))
legit.s.close()
expect('every stalled handshake closed (to make room or at the handshake timeout)', True,
       all(closed_within(s, 60) for s in held))
for s in held: s.close()
expect('a new client is served once they are gone', '0', fresh_call())
legit = TConn(port, ca, timeout=30)  # kept through cases 2-4, which stay below the limit
expect('an established connection after the storm', '0', list_tables(legit))

# 2. A ClientHello sent one byte a second: the handshake timeout counts from accept, not from the
#    last byte.
s = socket.create_connection(('127.0.0.1', port), timeout=10)
hello = b'\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03' + b'\x00' * 64
gone = False
for i in range(60):
    try:
        s.sendall(hello[i % len(hello):i % len(hello) + 1])
    except OSError:
        gone = True
        break
    if closed_within(s, 1):
        gone = True
        break
expect('a ClientHello trickled a byte a second is cut off', True, gone)
s.close()

# 3. Headers begun and never finished (HEADERS without END_HEADERS): the connection is closed.
c = TConn(port, ca, timeout=30)
h = b''.join(hlit(k, v) for k, v in [(':method', 'POST'), (':scheme', 'http'),
                                     (':path', TA + 'ListTables'), (':authority', 'localhost')])
c.send(frame(HEADERS, 0, 1, h))
expect('a header block left open closes its connection', True, closed_within(c.s, 60))

# 4. A request body trickled a byte a second ends RESOURCE_EXHAUSTED (8) or closes.
c = TConn(port, ca, timeout=30)
sid = c.headers(TA + 'ListTables', bearer(A))
body = grpc_msg(fld(1, INST))
why = None
for i in range(len(body) - 1):
    try:
        c.send(frame(DATA, 0, sid, body[i:i + 1]))
    except OSError:
        why = 'eof'
        break
    data, hd, w = c.wait_end(sid, 1)
    if w != 'timeout':
        why = grpc_status(data, hd, w)
        break
expect('a request body trickled a byte a second is refused', ['8', 'eof'], why)
c.s.close()

# 5. The connection established after case 1 still works after all of that.
expect('the first connection still served', '0', list_tables(legit))
legit.s.close()
sys.exit(1 if failed else 0)
