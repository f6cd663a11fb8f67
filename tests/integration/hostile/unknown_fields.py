"""unknown_fields.py PORT — fields the API does not define, hidden in the messages the router
stores (an AppProfile, a table's ColumnFamily, a Backup), are not stored: each carries 1 MiB in
an unknown field, the call succeeds, and reading the record back answers a few hundred bytes.
They used to be stored and answered forever (a 3 MiB app profile by the back door past the 4 KiB
description cap; two of them locked `cbt listappprofile` out with answers over 4 MiB)."""
import sys, time
from cslib import ADMIN, INST, call, fld, tname, ts, now_us

port = int(sys.argv[1])
INSTADM = '/google.bigtable.admin.v2.BigtableInstanceAdmin/'
HIDDEN = b'A' * (1 << 20)
failed = []


def check(what, resp, limit=4096):
    data, code, why = resp
    if (code and code[0] != '0') or why != 'end' or not data:  # each call answers a message
        failed.append('%s: failed, status %s (%s)' % (what, code or 'Huffman-coded', why))
    elif len(data) > limit:
        failed.append('%s: answered %d bytes: the hidden field was stored' % (what, len(data)))
    else:
        print('ok: %s answered %d bytes' % (what, len(data)))


# an app profile routed to east, hiding field 99
prof = fld(1, 'd') + fld(6, fld(1, 'east')) + fld(99, HIDDEN)
check('CreateAppProfile', call(port, INSTADM + 'CreateAppProfile',
                               fld(1, INST) + fld(2, 'hid') + fld(3, prof) + fld(4, 1)))
check('GetAppProfile', call(port, INSTADM + 'GetAppProfile', fld(1, INST + '/appProfiles/hid')))
check('ListAppProfiles', call(port, INSTADM + 'ListAppProfiles', fld(1, INST)))

# a table whose family hides field 77
fam = fld(1, 'cf') + fld(2, fld(1, fld(1, 2)) + fld(77, HIDDEN))  # {cf: ColumnFamily{max 2}}
check('CreateTable', call(port, ADMIN + 'CreateTable', fld(1, INST) + fld(2, 'hid') + fld(3, fld(3, fam))))
check('GetTable', call(port, ADMIN + 'GetTable', fld(1, tname('hid')) + fld(2, 2)))
fam2 = fld(1, 'cg') + fld(2, fld(99, HIDDEN))  # Modification{id, create: ColumnFamily}
check('ModifyColumnFamilies', call(port, ADMIN + 'ModifyColumnFamilies',
                                   fld(1, tname('hid')) + fld(2, fam2)))
check('GetTable after ModifyColumnFamilies', call(port, ADMIN + 'GetTable', fld(1, tname('hid')) + fld(2, 2)))

# a backup of it hiding field 99
cluster = INST + '/clusters/east'
bk = fld(2, tname('hid')) + fld(3, ts(now_us() + 86400 * 10**6)) + fld(99, HIDDEN)
check('CreateBackup', call(port, ADMIN + 'CreateBackup', fld(1, cluster) + fld(2, 'hidb') + fld(3, bk)))
time.sleep(1)
check('GetBackup', call(port, ADMIN + 'GetBackup', fld(1, cluster + '/backups/hidb')))

if failed:
    print('FAIL: ' + '; '.join(failed))
    sys.exit(1)
print('PASS')
