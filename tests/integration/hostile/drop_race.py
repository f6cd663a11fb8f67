"""drop_race.py PORT DIR CBT — DropRowRange through the router racing writes to the same rows, a
split and a move of the table's tablets (docs/cluster.md, "Work off the loop"), on the instance
of `strata up --dir DIR --port PORT --nodes 2`, with change streams off and on.

A writer writes rows under the prefix without pause while the drop runs. Afterwards: no row
acknowledged before the call was sent survives (neither the preloaded ones nor the writer's);
every row whose write was sent after the call returned survives. Exits 1 on a violation."""
import os, subprocess, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cslib import call, create_cs, mutate, set_cell, row_keys, topology_nodes, split_tablets, \
    move_tablet, tname, fld, ADMIN

PORT, DIR, CBT = int(sys.argv[1]), sys.argv[2], sys.argv[3]
PRELOAD = 20000
bad = []


def good(why, st):
    return why == 'end' and (not st or st[0] == '0')


def preload(table, prefix):
    path = os.path.join(DIR, '..', table + '.csv')
    with open(path, 'w') as f:
        f.write(',cf\nrow-key,q\n')
        for i in range(PRELOAD):
            f.write('%s%06d,v\n' % (prefix, i))
    env = dict(os.environ, BIGTABLE_EMULATOR_HOST='127.0.0.1:%d' % PORT)
    subprocess.run([CBT, '-project', 'p', '-instance', 'i', 'import', table, path, 'column-family=cf',
                    'batch-size=1000', 'workers=2'], env=env, check=True, capture_output=True)


def drop(table, prefix):
    body = fld(1, tname(table)) + (fld(2, prefix) if prefix else fld(3, 1))
    return call(PORT, ADMIN + 'DropRowRange', body, limit=60)


def run(table, retention, prefix):
    data, st, why = create_cs(PORT, table, retention=retention)
    if not good(why, st):
        print('create %s: %s %s' % (table, why, st))
    pre = prefix or 'a'
    preload(table, pre)
    nodes = topology_nodes(DIR)
    split_tablets(nodes, table, pre + '010000')
    writes = []  # (sent, acked, row, ok)
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            row = '%sw%07d' % (pre, i)
            i += 1
            sent = time.monotonic()
            _, st2, why2 = mutate(PORT, table, row, [set_cell('cf', 'q', 'x')])
            writes.append((sent, time.monotonic(), row, good(why2, st2)))

    def mover():
        time.sleep(0.05)
        move_tablet(nodes, table, pre + '010000')

    w = threading.Thread(target=writer)
    m = threading.Thread(target=mover)
    w.start()
    time.sleep(0.3)
    m.start()
    t0 = time.monotonic()
    _, st, why = drop(table, prefix)
    t1 = time.monotonic()
    time.sleep(0.5)
    stop.set()
    w.join()
    m.join()
    ok = good(why, st)
    print('%s (streams %s, %s): DropRowRange %s %s in %.2fs; %d writes' %
          (table, 'on' if retention else 'off', 'prefix' if prefix else 'whole table', why, st,
           t1 - t0, len(writes)))
    if not ok:
        # A drop that fails (tablets kept moving) may be retried: the retry must finish it.
        _, st, why = drop(table, prefix)
        print('retried: %s %s' % (why, st))
        if not good(why, st):
            bad.append('%s: DropRowRange failed twice: %s %s' % (table, why, st))
            return
        t1 = time.monotonic()
    keys, why = row_keys(PORT, table)
    keys = set(keys)
    old = [k for k in keys if k.startswith(pre) and not k.startswith(pre + 'w')]
    if old:
        bad.append('%s: %d preloaded rows survived the drop, e.g. %s' % (table, len(old), old[:3]))
    before = [r for s, a, r, k in writes if k and a < t0 and r in keys]
    if before:
        bad.append('%s: %d rows acknowledged before the drop survived, e.g. %s' %
                   (table, len(before), before[:3]))
    after = [r for s, a, r, k in writes if k and s > t1 and r not in keys]
    if after:
        bad.append('%s: %d rows written after the drop returned are missing, e.g. %s' %
                   (table, len(after), after[:3]))
    n_after = len([1 for s, a, r, k in writes if k and s > t1])
    print('%s: %d rows left, %d writes after the drop all kept: %s' %
          (table, len(keys), n_after, not after))


run('off_prefix', 0, 'a')
run('off_all', 0, None)
run('on_prefix', 86400, 'a')
run('on_all', 86400, None)
for b in bad:
    print('FAIL: ' + b)
sys.exit(1 if bad else 0)
