// edges_client.js — edge cases of the data and table admin API where Strata once answered
// differently from Cloud Bigtable (and the official emulator), through the official Node.js
// client's generated clients against BIGTABLE_EMULATOR_HOST. Each case prints `ok NAME` or
// `FAIL NAME: detail`; exit 1 when one failed. Reads go through the app profiles named in
// argv (one per cluster), so every cluster's copy is checked.
'use strict';
const {Bigtable, v2} = require('@google-cloud/bigtable');

const bt = new Bigtable({projectId: 'p'});
const data = new v2.BigtableClient(bt.options.BigtableClient);
const admin = new v2.BigtableTableAdminClient(bt.options.BigtableTableAdminClient);
const INST = 'projects/p/instances/i';
const TN = t => INST + '/tables/' + t;
const PROFILES = process.argv.slice(2).length ? process.argv.slice(2) : [''];
const B = s => Buffer.from(s);
let failed = 0;

function check(name, cond, detail) {
  console.log(cond ? 'ok ' + name : 'FAIL ' + name + ': ' + detail);
  if (!cond) failed++;
}

// The cells of every row as "key fam:qual=value ...", through one app profile.
function cells(table, appProfileId) {
  return new Promise((resolve, reject) => {
    const out = [];
    let row = null;
    const s = data.readRows({tableName: TN(table), appProfileId}, {retry: null});
    s.on('data', r => {
      for (const c of r.chunks) {
        if (c.rowKey && c.rowKey.length && (!row || row.done)) row = {k: String(c.rowKey), c: []};
        if (c.familyName) row.f = c.familyName.value;
        if (c.qualifier) row.q = String(c.qualifier.value);
        row.c.push(row.f + ':' + row.q + '=' + String(c.value));
        if (c.commitRow) {
          out.push([row.k].concat(row.c).join(' '));
          row.done = true;
        }
      }
    });
    s.on('error', reject);
    s.on('end', () => resolve(out.join('; ')));
  });
}

const set = (f, q, v, ts) => ({setCell: {familyName: f, columnQualifier: B(q), value: B(v),
  timestampMicros: ts}});

async function table(id, families) {
  const columnFamilies = {};
  for (const f of families) columnFamilies[f] = {};
  await admin.createTable({parent: INST, tableId: id, table: {columnFamilies}});
}

// ModifyColumnFamilies applies its modifications in order: a family dropped and created again
// in one call starts empty, like one dropped by one call and created by the next.
async function dropCreate() {
  await table('edges_dc', ['a', 'b']);
  await data.mutateRow({tableName: TN('edges_dc'), rowKey: B('r'),
    mutations: [set('a', 'q', 'old', 1000), set('b', 'q', 'keep', 1000)]});
  await admin.modifyColumnFamilies({name: TN('edges_dc'), modifications: [
    {id: 'a', drop: true}, {id: 'a', create: {gcRule: {maxNumVersions: 1}}}]});
  for (const p of PROFILES) {
    const got = await cells('edges_dc', p);
    check('drop_create_same_family/' + (p || 'default'), got === 'r b:q=keep', got);
  }
  await data.mutateRow({tableName: TN('edges_dc'), rowKey: B('r'),
    mutations: [set('a', 'q', 'new', 2000)]});
  const got = await cells('edges_dc', PROFILES[0]);
  check('drop_create_then_write', got === 'r a:q=new b:q=keep', got);
}

// `drop: false` asks for nothing: the emulator changes nothing, and so does Strata (it once
// dropped the family and every cell in it), also on a protected table and beside a create.
async function dropFalse() {
  await table('edges_df', ['cf', 'keep']);
  await data.mutateRow({tableName: TN('edges_df'), rowKey: B('r'),
    mutations: [set('cf', 'a', 'precious', 1000), set('keep', 'a', 'x', 1000)]});
  const [t] = await admin.modifyColumnFamilies({name: TN('edges_df'),
    modifications: [{id: 'cf', drop: false}, {id: 'nosuch', drop: false}, {id: 'more', create: {}}]});
  check('drop_false_schema', Object.keys(t.columnFamilies).sort().join() === 'cf,keep,more',
    Object.keys(t.columnFamilies).join());
  for (const p of PROFILES) {
    // nothing waits for replication here: the other cluster's copy may still be on its way
    let got = await cells('edges_df', p);
    for (let i = 0; i < 100 && got === ''; i++) {
      await new Promise(res => setTimeout(res, 100));
      got = await cells('edges_df', p);
    }
    check('drop_false_cells/' + (p || 'default'), got === 'r cf:a=precious keep:a=x', got);
  }
  await admin.updateTable({table: {name: TN('edges_df'), deletionProtection: true},
    updateMask: {paths: ['deletion_protection']}});
  let err = null;
  try {
    await admin.modifyColumnFamilies({name: TN('edges_df'), modifications: [{id: 'cf', drop: false}]});
  } catch (e) {
    err = e;
  }
  check('drop_false_protected', !err, err ? err.code + ' ' + err.details : '');
  await admin.updateTable({table: {name: TN('edges_df'), deletionProtection: false},
    updateMask: {paths: ['deletion_protection']}});
}

// A drop right after a write: the write may still be on its way to the other cluster, and must
// not land there after the purge (it would show again once the family is created again).
async function dropAfterWrite() {
  await table('edges_dw', ['a', 'b']);
  const entries = [];
  for (let i = 0; i < 500; i++) {
    entries.push({rowKey: B('r' + String(i).padStart(3, '0')),
      mutations: [set('a', 'q', 'old', 1000), set('b', 'q', 'keep', 1000)]});
  }
  await new Promise((resolve, reject) => data.mutateRows({tableName: TN('edges_dw'), entries})
    .on('data', () => {}).on('error', reject).on('end', resolve));
  await admin.modifyColumnFamilies({name: TN('edges_dw'), modifications: [{id: 'a', drop: true}]});
  await admin.modifyColumnFamilies({name: TN('edges_dw'), modifications: [{id: 'a', create: {}}]});
  for (const p of PROFILES) {
    const got = (await cells('edges_dw', p)).split('; ');
    const back = got.filter(r => r.includes(' a:'));
    check('drop_after_write/' + (p || 'default'), got.length === 500 && !back.length,
      got.length + ' rows, ' + back.length + ' with family a, e.g. ' + back[0]);
  }
}

// Cloud Bigtable answers an increment of a cell that is not 8 bytes with FAILED_PRECONDITION.
async function incrementNotCounter() {
  await data.mutateRow({tableName: TN('edges_dc'), rowKey: B('n'),
    mutations: [set('b', 's', 'abc', 1000)]});
  let code = 0;
  try {
    await data.readModifyWriteRow({tableName: TN('edges_dc'), rowKey: B('n'),
      rules: [{familyName: 'b', columnQualifier: B('s'), incrementAmount: 1}]});
  } catch (e) {
    code = e.code;
  }
  check('increment_not_8_bytes', code === 9, 'code ' + code);
}

// REQUEST_STATS_FULL over a table of three tablets: one request_stats, in the last message, for
// the whole read (each tablet's own stats used to reach the client, the last one counted).
async function statsAcrossTablets() {
  await admin.createTable({parent: INST, tableId: 'edges_st', table: {columnFamilies: {cf: {}}},
    initialSplits: [{key: B('r10')}, {key: B('r20')}]});
  const entries = [];
  for (let i = 0; i < 30; i++) {
    entries.push({rowKey: B('r' + String(i).padStart(2, '0')), mutations: [set('cf', 'q', 'v', 1000)]});
  }
  await new Promise((resolve, reject) => data.mutateRows({tableName: TN('edges_st'), entries})
    .on('data', () => {}).on('error', reject).on('end', resolve));
  const got = await new Promise((resolve, reject) => {
    const out = {rows: 0, stats: [], msgs: 0};
    const s = data.readRows({tableName: TN('edges_st'), requestStatsView: 'REQUEST_STATS_FULL',
      filter: {rowKeyRegexFilter: B('r.[05]')}}, {retry: null});
    s.on('data', r => {
      out.msgs++;
      out.rows += r.chunks.filter(c => c.commitRow).length;
      if (r.requestStats) out.stats.push([out.msgs, r.requestStats.fullReadStatsView.readIterationStats]);
    });
    s.on('error', reject);
    s.on('end', () => resolve(out));
  });
  const it = got.stats.length === 1 && got.stats[0][0] === got.msgs ? got.stats[0][1] : null;
  const lim = await new Promise((resolve, reject) => {
    let st = null;
    data.readRows({tableName: TN('edges_st'), requestStatsView: 'REQUEST_STATS_FULL', rowsLimit: 2},
      {retry: null}).on('data', r => { st = r.requestStats || st; })
      .on('error', reject).on('end', () => resolve(st.fullReadStatsView.readIterationStats));
  });
  check('request_stats_rows_limit', +lim.rowsSeenCount === 2 && +lim.cellsSeenCount === 2,
    JSON.stringify(lim));
  check('request_stats_across_tablets', got.rows === 6 && it && +it.rowsSeenCount === 30 &&
    +it.rowsReturnedCount === 6 && +it.cellsSeenCount === 30 && +it.cellsReturnedCount === 6,
    JSON.stringify(got));
}

// A GC rule serializes to at most 500 bytes (Cloud Bigtable); the emulator takes any size.
async function gcRuleSize() {
  const union = n => ({union: {rules: Array.from({length: n}, (_, i) => ({maxNumVersions: i + 1}))}});
  const code = async fn => { try { await fn(); return 0; } catch (e) { return e.code; } };
  const ct = n => code(() => admin.createTable({parent: INST, tableId: 'edges_gc' + n,
    table: {columnFamilies: {f: {gcRule: union(n)}}}}));
  check('gc_rule_400_bytes', await ct(100) === 0, 'refused');
  const big = await ct(200);
  check('gc_rule_800_bytes_create_table', big === 3, 'code ' + big);
  const mod = await code(() => admin.modifyColumnFamilies({name: TN('edges_gc100'),
    modifications: [{id: 'g', create: {gcRule: union(200)}}]}));
  check('gc_rule_800_bytes_modify', mod === 3, 'code ' + mod);
  // max_age is at least 1 ms (Cloud Bigtable): a shorter one would hide every cell written.
  for (const [name, age] of [['0', {}], ['500ns', {nanos: 500}], ['999us', {nanos: 999000}]]) {
    const c = await code(() => admin.createTable({parent: INST, tableId: 'edges_age' + name,
      table: {columnFamilies: {f: {gcRule: {maxAge: age}}}}}));
    check('gc_max_age_' + name + '_create_table', c === 3, 'code ' + c);
  }
  const age = await code(() => admin.modifyColumnFamilies({name: TN('edges_gc100'),
    modifications: [{id: 'a', create: {gcRule: {maxAge: {}}}}]}));
  check('gc_max_age_0_modify', age === 3, 'code ' + age);
  const ms = await code(() => admin.createTable({parent: INST, tableId: 'edges_age1ms',
    table: {columnFamilies: {f: {gcRule: {maxAge: {nanos: 1000000}}}}}}));
  check('gc_max_age_1ms_create_table', ms === 0, 'code ' + ms);
}

// Aggregate column families (value_type) and their AddToCell / MergeToCell are not supported:
// the family is refused UNIMPLEMENTED when it is made, and AddToCell too, rather than a schema
// accepted whose every write then fails INVALID_ARGUMENT.
async function aggregatesRefused() {
  const code = async fn => { try { await fn(); return 0; } catch (e) { return e.code; } };
  const sum = {valueType: {aggregateType: {inputType: {int64Type: {encoding: {bigEndianBytes: {}}}},
    sum: {}}}};
  const c = await code(() => admin.createTable({parent: INST, tableId: 'edges_agg',
    table: {columnFamilies: {sum, plain: {}}}}));
  check('aggregate_family_create_table', c === 12, 'code ' + c);
  await table('edges_agg2', ['cf']);
  const m = await code(() => admin.modifyColumnFamilies({name: TN('edges_agg2'),
    modifications: [{id: 'sum', create: sum}]}));
  check('aggregate_family_modify', m === 12, 'code ' + m);
  const a = await code(() => data.mutateRow({tableName: TN('edges_agg2'), rowKey: B('r'),
    mutations: [{addToCell: {familyName: 'cf', columnQualifier: {rawValue: B('c')},
      timestamp: {rawTimestampMicros: 1000}, input: {intValue: 5}}}]}, {retry: null}));
  check('add_to_cell_refused', a === 12, 'code ' + a);
  // a family update changes gc_rule only: another update_mask path is refused, and what the
  // mask leaves out of the message is not applied
  const upd = (paths, gcRule) => code(() => admin.modifyColumnFamilies({name: TN('edges_agg2'),
    modifications: [{id: 'cf', update: {gcRule, ...sum}, updateMask: {paths}}]}));
  const bad = await upd(['nonsense'], {maxNumVersions: 1});
  check('update_mask_unknown_path', bad === 3, 'code ' + bad);
  const vt = await upd(['value_type'], {maxNumVersions: 1});
  check('update_mask_value_type', vt === 12, 'code ' + vt);
  const gc = await upd(['gc_rule'], {maxNumVersions: 2});
  const [t] = await admin.getTable({name: TN('edges_agg2')});
  const cf = t.columnFamilies.cf;
  check('update_mask_gc_rule', gc === 0 && cf.gcRule && cf.gcRule.maxNumVersions === 2 &&
    !cf.valueType, 'code ' + gc + ' ' + JSON.stringify(cf));
}

// A ReadModifyWriteRow of 100,000 rules (the documented maximum), half of them on columns an
// earlier rule named, answers with one cell per column in qualifier order; the node used to
// compare each rule with every earlier column and every cell, held its loop for about a minute
// and the call ended UNAVAILABLE (the router dropped the silent node) with every cell written.
async function rmwManyRules() {
  await table('edges_rmw', ['cf']);
  const q = i => B('q' + String(i).padStart(6, '0'));
  const rules = Array.from({length: 100000}, (_, i) => ({familyName: 'cf',
    columnQualifier: q(i % 50000), appendValue: B(i < 50000 ? 'a' : 'b')}));
  let got;
  try {
    const [r] = await data.readModifyWriteRow({tableName: TN('edges_rmw'), rowKey: B('big'), rules},
      {timeout: 600000, retry: null});
    const cols = r.row.families[0].columns;
    const sorted = cols.every((c, i) => i === 0 || Buffer.compare(cols[i - 1].qualifier,
      c.qualifier) < 0);
    const values = cols.every(c => c.cells[0].value.toString() === 'ab');
    got = `${r.row.families.length} ${cols.length} ${sorted} ${values}`;
  } catch (e) {
    got = 'code ' + e.code + ' ' + e.details;
  }
  check('rmw_100000_rules', got === '1 50000 true true', got);
}

// A row-level filter or CheckAndMutateRow predicate is evaluated over the whole row in one piece
// on the node's loop: over a row of 100,000 cells an interleave of 40 regexes held it for
// seconds (a 1,000-regex one for tens). Past a bound of cells x filter work it is
// FAILED_PRECONDITION with advice (a code clients do not retry: the same request over the same
// row fails again), nothing written; a light filter over the same row still runs.
async function heavyRowFilters() {
  await table('edges_heavy', ['cf']);
  for (let b = 0; b < 5; b++) {
    const mutations = Array.from({length: 20000}, (_, i) =>
      set('cf', 'q' + String(b * 20000 + i).padStart(6, '0'), 'v', 1000));
    await data.mutateRow({tableName: TN('edges_heavy'), rowKey: B('wide'), mutations});
  }
  const heavy = {interleave: {filters: Array.from({length: 40}, (_, i) =>
    ({valueRegexFilter: B('x' + i)}))}};
  const code = async fn => { try { await fn(); return 0; } catch (e) { return e.code; } };
  const cam = await code(() => data.checkAndMutateRow({tableName: TN('edges_heavy'),
    rowKey: B('wide'), predicateFilter: heavy, trueMutations: [set('cf', 'hit', 'y', 1000)],
    falseMutations: [set('cf', 'miss', 'y', 1000)]}, {retry: null}));
  check('cam_heavy_predicate_refused', cam === 9, 'code ' + cam);
  const read = async filter => {
    try {
      let n = 0;
      await new Promise((resolve, reject) => data.readRows({tableName: TN('edges_heavy'),
        rows: {rowKeys: [B('wide')]}, filter}, {retry: null}).on('data', r => {
        for (const c of r.chunks || []) if (c.qualifier) n++;
      }).on('error', reject).on('end', resolve));
      return 'ok ' + n;
    } catch (e) {
      return 'code ' + e.code;
    }
  };
  check('read_heavy_row_filter_refused', await read(heavy) === 'code 9', 'refused?');
  const light = {interleave: {filters: [{valueRegexFilter: B('v')}, {blockAllFilter: true}]}};
  const got = await read(light);
  check('read_light_row_filter_runs', got === 'ok 100000', got);
  const branch = await read({columnQualifierRegexFilter: B('hit|miss')});
  check('cam_heavy_predicate_wrote_nothing', branch === 'ok 0', branch);
}

// A consistency token belongs to its table (Cloud Bigtable): checking it on another table is
// INVALID_ARGUMENT, not an answer about the wrong table; on its own table it still works.
async function tokenOtherTable() {
  for (const id of ['tok_a', 'tok_b']) await table(id, ['cf']);
  const [tok] = await admin.generateConsistencyToken({name: TN('tok_a')});
  let err = null;
  try {
    await admin.checkConsistency({name: TN('tok_b'), consistencyToken: tok.consistencyToken});
  } catch (e) {
    err = e;
  }
  check('token_other_table', err && err.code === 3, err ? err.code + ' ' + err.details : 'answered');
  const [own] = await admin.checkConsistency({name: TN('tok_a'),
    consistencyToken: tok.consistencyToken});
  check('token_own_table', typeof own.consistent === 'boolean', JSON.stringify(own));
}

// CRC32C (Castagnoli, reflected), as the router tags its consistency tokens.
function crc32c(buf) {
  let crc = 0xffffffff;
  for (const b of buf) {
    crc ^= b;
    for (let k = 0; k < 8; k++) crc = crc & 1 ? (crc >>> 1) ^ 0x82f63b78 : crc >>> 1;
  }
  return (crc ^ 0xffffffff) >>> 0;
}

// A consistency token the router did not make for the table (cut, altered, parts joined or
// replaced, another cluster, even with its tag computed again over the forged text) is
// INVALID_ARGUMENT "invalid consistency token": never an answer, nor a complaint about a healthy
// node. A genuine one still serves the client's waitForReplication.
async function tokenForged() {
  await table('tok_f', ['cf']);
  await data.mutateRow({tableName: TN('tok_f'), rowKey: B('r'), mutations: [set('cf', 'q', 'v', 1000)]});
  const [gen] = await admin.generateConsistencyToken({name: TN('tok_f')});
  const tok = gen.consistencyToken;
  const p = tok.split(':'); // strata1, cluster, node parts, tag
  const tagged = body => body + ':' + crc32c(Buffer.from('tok_f' + body)).toString(16).padStart(8, '0');
  const body = i => v => { const q = p.slice(0, 3); q[i] = v; return q.join(':'); };
  const part = body(2), cluster = body(1);
  check('token_tag_recomputed', tagged(p.slice(0, 3).join(':')) === tok, tok);
  const last = p[3].slice(-1) === '0' ? '1' : '0';
  const forged = {
    part_5: part('5') + ':' + p[3], part_0: part('0') + ':' + p[3],
    part_20_nines: part('9'.repeat(20)) + ':' + p[3], part_twice: part(p[2] + p[2]) + ':' + p[3],
    parts_two: part(p[2] + ',' + p[2]) + ':' + p[3], zeros_1mib: part('0'.repeat(1 << 20)) + ':' + p[3],
    cluster_other: cluster(p[1] === '1' ? '2' : '1') + ':' + p[3], cluster_0: cluster('0') + ':' + p[3],
    tag_changed: tok.slice(0, -1) + last, tag_not_hex: tok.slice(0, -1) + 'g',
    tag_cut: tok.slice(0, -1), extra_part: tok + ':x', empty: '',
    retagged_part_5: tagged(part('5')), retagged_part_cut: tagged(part(p[2].slice(0, 28))),
    retagged_parts_two: tagged(part(p[2] + ',' + p[2])), retagged_cluster_9: tagged(cluster('9')),
  };
  for (const [name, t] of Object.entries(forged)) {
    let err = null;
    try {
      await admin.checkConsistency({name: TN('tok_f'), consistencyToken: t});
    } catch (e) {
      err = e;
    }
    check('token_forged_' + name, err && err.code === 3 &&
          /invalid consistency token/.test(err.details) && !/does not replicate/.test(err.details),
          err ? err.code + ' ' + err.details : 'answered');
  }
  const [own] = await admin.checkConsistency({name: TN('tok_f'), consistencyToken: tok});
  check('token_genuine', typeof own.consistent === 'boolean', JSON.stringify(own));
  const [replicated] = await bt.instance('i').table('tok_f').waitForReplication();
  check('token_wait_for_replication', replicated === true, String(replicated));
}

// deletion_protection covers a table's column families (Cloud Bigtable): dropping one is
// FAILED_PRECONDITION naming the protection, and its cells stay in every cluster; adding a family
// to a protected table is allowed.
async function dropProtected() {
  await admin.createTable({parent: INST, tableId: 'edges_dp',
    table: {columnFamilies: {cf: {}, keep: {}}, deletionProtection: true}});
  await data.mutateRow({tableName: TN('edges_dp'), rowKey: B('r'),
    mutations: [set('cf', 'c', 'v', 1000), set('keep', 'c', 'w', 1000)]});
  let err = null;
  try {
    await admin.modifyColumnFamilies({name: TN('edges_dp'), modifications: [{id: 'cf', drop: true}]});
  } catch (e) {
    err = e;
  }
  check('drop_family_protected_refused', err && err.code === 9 &&
    /deletion_protection/.test(err.details), err ? err.code + ' ' + err.details : 'answered OK');
  for (const p of PROFILES) {
    // the refusal is immediate: the other cluster's copy may still wait for replication
    let got = await cells('edges_dp', p);
    for (let i = 0; i < 100 && got === ''; i++) {
      await new Promise(res => setTimeout(res, 100));
      got = await cells('edges_dp', p);
    }
    check('drop_family_protected_cells_' + (p || 'default'), got === 'r cf:c=v keep:c=w', got);
  }
  const [t] = await admin.modifyColumnFamilies({name: TN('edges_dp'),
    modifications: [{id: 'more', create: {}}]});
  check('create_family_protected', Object.keys(t.columnFamilies).sort().join() === 'cf,keep,more',
    Object.keys(t.columnFamilies).join());
}

// ListTables pages as Cloud Bigtable's does: at most page_size tables and a next_page_token;
// walking the pages gives every table once, a table created between two pages shifts nothing;
// a token no ListTables gave and a negative page_size are INVALID_ARGUMENT.
async function listTablesPages() {
  for (const id of ['lt_a', 'lt_b', 'lt_c']) await table(id, ['cf']);
  const page = async (req) => {
    try {
      const [ts, next] = await admin.listTables({parent: INST, ...req}, {autoPaginate: false});
      return {code: 0, names: ts.map(t => t.name), next};
    } catch (e) {
      return {code: e.code};
    }
  };
  const all = (await page({})).names || [];
  const p1 = await page({pageSize: 2});
  check('list_tables_page_size', p1.code === 0 && p1.names.length === 2 && p1.next &&
        p1.next.pageToken, JSON.stringify(p1));
  await table('lt_0', ['cf']); // sorts before the first page's tables
  const seen = [...(p1.names || [])];
  let next = p1.next;
  for (let i = 0; next && next.pageToken && i < 100; i++) {
    const p = await page({pageSize: 2, pageToken: next.pageToken});
    if (p.code) break;
    seen.push(...p.names);
    next = p.next;
  }
  check('list_tables_pages_walk', seen.length === all.length && new Set(seen).size === seen.length &&
        all.every(n => seen.includes(n)), JSON.stringify({seen, all}));
  const z = await page({pageToken: 'zzz'});
  check('list_tables_bad_token', z.code === 3, 'code ' + z.code);
  const neg = await page({pageSize: -1});
  check('list_tables_negative_page_size', neg.code === 3, 'code ' + neg.code);
}

(async () => {
  await listTablesPages();
  await dropCreate();
  await dropFalse();
  await dropProtected();
  await gcRuleSize();
  await tokenOtherTable();
  await tokenForged();
  await aggregatesRefused();
  await rmwManyRules();
  await heavyRowFilters();
  await statsAcrossTablets();
  await incrementNotCounter();
  await dropAfterWrite();
  process.exit(failed ? 1 : 0);
})().catch(e => {
  console.log('FAIL unexpected error: ' + (e.stack || e));
  process.exit(1);
});
