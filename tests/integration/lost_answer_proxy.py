"""lost_answer_proxy.py — a TCP proxy in front of a strata-router that loses the answer to an
UpdateAppProfile: the request reaches the router whole, nothing the router sends back on that
connection reaches the client, and after HOLD_S seconds (the router has stored the change) both
sides are closed, as when the router dies right after storing. Every other connection is relayed
as it is; with --refuse-after, the proxy stops listening once it has lost an answer (the router
stays gone). The UpdateAppProfile is recognised by its update_mask path in the request body
(gRPC messages travel uncompressed), the marker below.
Prints "proxy listening on 127.0.0.1:PORT" and serves until killed.
Usage: python3 lost_answer_proxy.py ROUTER_HOST:PORT [--refuse-after]"""
import socket
import sys
import threading
import time

MARKER = b'single_cluster_routing'
HOLD_S = 1.5


def close_both(a, b):
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def relay(src, dst, state, upstream):
    """Copies src to dst until either ends. upstream: client to router (watches for the
    marker, then closes both sides HOLD_S later); else router to client (silenced once the
    marker passed)."""
    seen = b''
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            if upstream and not state['lose']:
                seen = (seen + data)[-4096:]
                if MARKER in seen:
                    state['lose'] = True
                    state['lost'].set()
                    threading.Timer(HOLD_S, close_both, (src, dst)).start()
            elif not upstream and state['lose']:
                continue
            dst.sendall(data)
    except OSError:
        pass
    close_both(src, dst)


def serve(conn, target, lost):
    host, port = target.rsplit(':', 1)
    up = socket.create_connection((host, int(port)))
    state = {'lose': False, 'lost': lost}
    threads = [threading.Thread(target=relay, args=(conn, up, state, True)),
               threading.Thread(target=relay, args=(up, conn, state, False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    conn.close()
    up.close()


def main():
    target, refuse_after = sys.argv[1], '--refuse-after' in sys.argv[2:]
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(('127.0.0.1', 0))
    ls.listen(16)
    print('proxy listening on 127.0.0.1:%d' % ls.getsockname()[1], flush=True)
    lost = threading.Event()
    ls.settimeout(0.1)
    while not (refuse_after and lost.is_set()):
        try:
            conn, _ = ls.accept()
        except socket.timeout:
            continue
        threading.Thread(target=serve, args=(conn, target, lost), daemon=True).start()
    ls.close()
    while True:
        time.sleep(1)


main()
