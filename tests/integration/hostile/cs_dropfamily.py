#!/usr/bin/env python3
"""cs_dropfamily.py PORT — a table with streams on and families cf, g; row a gets cf:q, row b g:q;
then ModifyColumnFamilies drops cf. Reads the history through the default profile and, when the
instance has a single-cluster profile 'w' on another cluster (created here on a cluster named
west if it exists), through it too. Prints the records.
Expected: each cluster's history treats the drop the same way, and a record's source_cluster_id
names the cluster where the change was made (the drop is made on every cluster by the router).
A family drop is a schema change, which change streams do not capture (docs/changestreams.md):
neither history may hold a record of it, and both must hold the two writes. (The defect this
caught: each cluster's purge deletes were shipped to the other cluster, whose history then showed
them as that cluster's DeleteFromFamily.) Exit 1 otherwise."""
import sys
from cslib import *

port = int(sys.argv[1])
IA = '/google.bigtable.admin.v2.BigtableInstanceAdmin/'
ncall(port, IA + 'CreateAppProfile', fld(1, INST) + fld(2, 'w') + fld(3, fld(6, fld(1, 'west'))), 5)
T = 'dropfam_%d' % (now_us() % 100000)
create_cs(port, T, families=('cf', 'g'))
t0 = now_us()
mutate(port, T, 'a', [set_cell('cf', 'q', 'x')]); mutate(port, T, 'b', [set_cell('g', 'q', 'x')])
print('drop cf:', ncall(port, ADMIN + 'ModifyColumnFamilies', fld(1, tname(T)) + fld(2, fld(1, 'cf') + fld(4, 1)), 5)[1:])
time.sleep(1)
bad = 0
for prof, cl in ((None, 'east'), ('w', 'west')):
    ev, st, msg, err = ncs(port, cs_req(T, start_us=t0, end_us=now_us() + 300000, profile=prof), 8)
    if st != 0:
        print('profile %s: %s %s' % (prof, st, msg)); continue
    print('history read through profile %s (cluster %s):' % (prof or 'default', cl))
    writes = 0
    for e in ev:
        if e[0] == 'rec':
            print('   row %s source_cluster_id %s mutations %s' % (e[1], e[3], e[5]))
            if any(m[0] == 'delfam' for m in e[5]):
                bad += 1
            else:
                writes += 1
    if writes < 2:
        print('   expected the records of the 2 writes, got %d' % writes)
        bad += 1
sys.exit(1 if bad else 0)
