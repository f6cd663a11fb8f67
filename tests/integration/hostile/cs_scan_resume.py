#!/usr/bin/env python3
"""cs_scan_resume.py PORT NODE_PID_FILE NODE_CMD... — on a standalone strata-node: writes 3000 rows
into a table with streams on, then reads the catch-up scan in pieces: after each 400 records the
client drops the connection and resumes from the last token (1.W.H.K), once after kill -9 of the
node and a restart with NODE_CMD. Every row must have a record. Exit 1 on a gap."""
import subprocess, signal, sys
from cslib import *

port, pidfile, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
T = 'scan_%d' % (now_us() % 100000)
create_cs(port, T)
t0 = now_us()
c = Conn(port)
body = fld(1, tname(T)) + b''.join(fld(2, fld(1, 'k%05d' % i) + fld(2, set_cell('cf', 'q', 'v' * 100))) for i in range(3000))
print('MutateRows', ncall(port, BT + 'MutateRows', body, 30)[1:])
time.sleep(1.5)  # past the ring? the scan path reads storage when the ring lacks records
end = now_us()
seen, tok, pieces = [], None, 0


class Enough(Exception): pass


while pieces < 40:
    n = [0]

    def on(e):
        global tok
        if e[0] == 'rec':
            seen.append(e[1].decode()); tok = e[4]; n[0] += 1
            if n[0] >= 400: raise Enough()
        elif e[0] == 'hb' and e[1]: tok = e[1]
        elif e[0] == 'close': raise StopIteration()
    req = cs_req(T, tokens=[(b'', tok)] if tok else None, start_us=None if tok else t0, end_us=end)
    try:
        why = stream_cs(port, req, on, limit=20)
        print('stream ended', why); break
    except Enough:
        pieces += 1
        print('piece %d: %d records so far, token %s' % (pieces, len(seen), tok[:60]))
        if pieces == 3:
            pid = int(open(pidfile).read()); os.kill(pid, signal.SIGKILL); time.sleep(0.5)
            p = subprocess.Popen(cmd, stdout=open('/tmp/cshostile/node-restart.log', 'a'), stderr=subprocess.STDOUT)
            open(pidfile, 'w').write(str(p.pid)); time.sleep(1.5)
            print('node killed and restarted, pid', p.pid)
    except StopIteration:
        break
want = ['k%05d' % i for i in range(3000)]
missing = sorted(set(want) - set(seen))
print('records %d (distinct %d), missing %d %s' % (len(seen), len(set(seen)), len(missing), missing[:5]))
sys.exit(1 if missing else 0)
