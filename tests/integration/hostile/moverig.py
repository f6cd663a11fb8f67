"""moverig.py — the rig of the move tests (move_steps.py, move_full.py): two nodes, A (node 1)
and B (node 2), of one cluster behind a router with the balancer off, started from the binaries
under test in a directory of their own, with the checks' verdicts collected."""
import os, signal, subprocess, sys, time

from cslib import BT, call, fld, row_keys, tname


class Rig:
    def __init__(self, node_bin, router_bin, d):
        self.node_bin, self.router_bin, self.d = node_bin, router_bin, d
        self.procs = {}
        self.bad = []

    def expect(self, what, ok, detail=''):
        print('%s: %s %s' % ('ok' if ok else 'FAIL', what, detail))
        if not ok:
            self.bad.append(what)

    def wait_listen(self, log, since=0):
        """The port a process logged it listens on (after byte since of its log)."""
        for _ in range(300):
            try:
                text = open(log).read()[since:]
            except FileNotFoundError:
                text = ''
            for line in text.splitlines():
                if 'listening on 127.0.0.1:' in line:
                    return int(line.split('listening on 127.0.0.1:')[1].split()[0].strip(',;'))
            time.sleep(0.1)
        sys.exit('FAIL: %s never listened' % log)

    def start_node(self, name, num, port=0, faults=''):
        """Node NAME (data DIR/NAME, log DIR/NAME.log, appended) with the test-only move faults
        given (STRATA_TEST_MOVE, node/node_internal.h): its port."""
        log = os.path.join(self.d, name + '.log')
        since = os.path.getsize(log) if os.path.exists(log) else 0
        env = dict(os.environ)
        env.pop('STRATA_TEST_MOVE', None)
        if faults:
            env['STRATA_TEST_MOVE'] = faults
        self.procs[name] = subprocess.Popen(
            [self.node_bin, '--data', os.path.join(self.d, name), '--listen',
             '127.0.0.1:%d' % port, '--node-num', str(num)],
            stdout=open(log, 'a'), stderr=subprocess.STDOUT, env=env)
        return self.wait_listen(log, since)

    def start_router(self, a, b):
        """The router over nodes a and b (ports; data DIR/a, DIR/b), balancer off: its port."""
        topo = os.path.join(self.d, 'topology')
        with open(topo, 'w') as f:
            f.write('project = p\ninstance = i\n[cluster east]\nzone = z\n'
                    'node = 127.0.0.1:%d %s/a\nnode = 127.0.0.1:%d %s/b\n' % (a, self.d, b, self.d))
        rlog = os.path.join(self.d, 'router.log')
        self.procs['router'] = subprocess.Popen(
            [self.router_bin, '--config', topo, '--listen', '127.0.0.1:0', '--balance', 'off'],
            stdout=open(rlog, 'w'), stderr=subprocess.STDOUT)
        self.router = self.wait_listen(rlog)
        return self.router

    def keys(self, table):
        """Row keys read through the router (refreshing its map first, retrying not-owner)."""
        for _ in range(20):
            call(self.router, BT + 'GenerateInitialChangeStreamPartitions', fld(1, tname(table)))
            k, why = row_keys(self.router, table)
            if why == 'end':
                return k
            time.sleep(0.3)
        return None

    def stop(self, name, sig=signal.SIGTERM):
        p = self.procs.pop(name, None)
        if p:
            p.send_signal(sig)
            p.wait(60)
