"""table_churn.py PORT DIR FIRST LAST CS: table cycles FIRST..LAST on the router at PORT, each:
CreateTable (families cf1, cf2; splits r030, r060; with CS=1 change streams kept a day),
MutateRows of 100 rows (a cell in each family), ReadRows of all of them, with CS=1 `strata
changes` ($STRATA, on the instance in DIR) over the table's life, which must show the 100 rows,
then DeleteTable; and an app profile created (single-cluster, east), updated (to multi-cluster),
read and deleted. Exits 1 at the first call that fails, naming the cycle and the call."""
import os, subprocess, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import ADMIN, BT, INST, call, create_profile, fld, now_us, rfc3339, row_keys, tname

IA = '/google.bigtable.admin.v2.BigtableInstanceAdmin/'

port, d, first, last, cs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == '1'


def ok(what, c, res):
    _, st, why = res
    if why != 'end' or (st and st[0] != '0'):
        sys.exit('cycle %d: %s failed: %r %r' % (c, what, st, why))


def cell(fam, q, v):
    return fld(1, fld(1, fam) + fld(2, q) + fld(3, -1) + fld(4, v))


def profile_cycle(c):
    name = INST + '/appProfiles/churn%d' % c
    ok('CreateAppProfile', c, create_profile(port, 'churn%d' % c, 'east'))
    prof = fld(1, name) + fld(3, 'cycle %d' % c) + fld(5, b'')  # multi-cluster routing
    mask = fld(2, fld(1, 'description') + fld(1, 'multi_cluster_routing_use_any'))
    ok('UpdateAppProfile', c, call(port, IA + 'UpdateAppProfile', fld(1, prof) + mask + fld(3, 1)))
    ok('GetAppProfile', c, call(port, IA + 'GetAppProfile', fld(1, name)))
    ok('DeleteAppProfile', c, call(port, IA + 'DeleteAppProfile', fld(1, name) + fld(2, 1)))


for c in range(first, last + 1):
    t = 'churn%d' % c
    fams = b''.join(fld(3, fld(1, f) + fld(2, b'')) for f in ('cf1', 'cf2'))
    cfg = fld(8, fld(1, fld(1, 86400))) if cs else b''
    splits = b''.join(fld(4, fld(1, k)) for k in ('r030', 'r060'))
    ok('CreateTable', c, call(port, ADMIN + 'CreateTable', fld(1, INST) + fld(2, t) + fld(3, fams + cfg) + splits))
    t0 = now_us() + 1000  # streams hold changes from the table's creation on
    ents = b''.join(fld(2, fld(1, 'r%03d' % i) + fld(2, cell('cf1', 'a', 'v%d' % i)) + fld(2, cell('cf2', 'b', 'w%d' % i)))
                    for i in range(100))
    ok('MutateRows', c, call(port, BT + 'MutateRows', fld(1, tname(t)) + ents))
    keys, why = row_keys(port, t)
    if len(set(keys)) != 100:
        sys.exit('cycle %d: ReadRows returned %d rows (%s)' % (c, len(set(keys)), why))
    if cs:
        p = subprocess.run([os.environ['STRATA'], 'changes', '--dir', d, '--table', t, '--from', rfc3339(t0),
                            '--until', 'now', '--quiet'], capture_output=True, text=True, timeout=60)
        if len(p.stdout.splitlines()) != 100:
            sys.exit('cycle %d: strata changes printed %d changes, not 100: %s' % (c, len(p.stdout.splitlines()), p.stderr[-300:]))
    ok('DeleteTable', c, call(port, ADMIN + 'DeleteTable', fld(1, tname(t))))
    profile_cycle(c)
