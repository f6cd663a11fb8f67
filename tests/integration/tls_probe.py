# tls_probe.py — stdlib-only HTTP/2 probes of a TLS listener, for tls_router_test.sh.
#   tls_probe.py plain PORT                 h2c with prior knowledge; prints served|refused
#   tls_probe.py tls PORT CA [CERT KEY]     TLS (ALPN h2, SNI localhost) then an HTTP/2 PING;
#                                           prints "served serial=HEX" or "refused: WHY"
#   tls_probe.py list PORT CA [CERT KEY]    as tls, then a gRPC ListTables call on the connection;
#                                           prints the table ids or "refused: WHY"
#   tls_probe.py hold PORT CA GOFILE        as tls, then keeps the connection, waits for GOFILE
#                                           to exist and PINGs again on it: "second served"
import os, socket, ssl, struct, sys, time

PREFACE = b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'
SETTINGS, PING = 4, 6


def frame(t, flags, payload):
    return struct.pack('>I', len(payload))[1:] + bytes([t, flags]) + b'\0\0\0\0' + payload


def recv_exact(s, n):
    buf = b''
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError('connection closed by the server')
        buf += chunk
    return buf


def ping(s, data):
    """PINGs and reads frames until the ACK: the server's HTTP/2 session is up."""
    s.sendall(frame(PING, 0, data))
    while True:
        hdr = recv_exact(s, 9)
        ln = struct.unpack('>I', b'\0' + hdr[:3])[0]
        body = recv_exact(s, ln)
        if hdr[3] == SETTINGS and not hdr[4] & 1:
            s.sendall(frame(SETTINGS, 1, b''))
        if hdr[3] == PING and hdr[4] & 1 and body == data:
            return


def tls_conn(port, ca, cert=None, key=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(ca)
    ctx.set_alpn_protocols(['h2'])
    if cert:
        ctx.load_cert_chain(cert, key)
    raw = socket.create_connection(('127.0.0.1', port), timeout=10)
    s = ctx.wrap_socket(raw, server_hostname='localhost')
    if s.selected_alpn_protocol() != 'h2':
        raise ConnectionError('ALPN did not select h2')
    s.sendall(PREFACE + frame(SETTINGS, 0, b''))
    ping(s, b'strata01')
    return s


def serial(s):
    return s.getpeercert()['serialNumber'].lower().lstrip('0')


def list_tables(s):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'hostile'))
    import h2raw, re
    c = h2raw.Conn.__new__(h2raw.Conn)  # the TLS socket instead of Conn's own TCP one
    c.s, c.buf, c.next, c.conn_win, c.init_win, c.win = s, b'', 1, 65535, 65535, {}
    sid = c.headers('/google.bigtable.admin.v2.BigtableTableAdmin/ListTables')
    c.data(sid, h2raw.grpc_msg(h2raw.fld(1, 'projects/p/instances/i')))
    data, hdrs, why = c.wait_end(sid)
    if why != 'end':
        return 'refused: stream ended with %s' % why
    return ' '.join(m.decode() for m in re.findall(rb'/tables/([A-Za-z0-9_.-]+)', data))


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == 'plain':
        try:
            s = socket.create_connection(('127.0.0.1', port), timeout=10)
            s.sendall(PREFACE + frame(SETTINGS, 0, b''))
            ping(s, b'strata01')
            print('served')
        except (OSError, ConnectionError) as e:
            print('refused: %s' % e)
        return
    if mode == 'tls':
        args = sys.argv[3:]
        try:
            s = tls_conn(port, *args)
            print('served serial=%s' % serial(s))
        except (OSError, ConnectionError, ssl.SSLError) as e:
            print('refused: %s' % e)
        return
    if mode == 'list':
        try:
            print(list_tables(tls_conn(port, *sys.argv[3:])))
        except (OSError, ConnectionError, ssl.SSLError, EOFError) as e:
            print('refused: %s' % e)
        return
    if mode == 'hold':
        s = tls_conn(port, sys.argv[3])
        print('first served serial=%s' % serial(s), flush=True)
        for _ in range(600):  # hang guard: 60 s
            if os.path.exists(sys.argv[4]):
                break
            time.sleep(0.1)
        ping(s, b'strata02')
        print('second served serial=%s' % serial(s), flush=True)


main()
