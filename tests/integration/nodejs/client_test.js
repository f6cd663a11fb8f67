// client_test.js — one scenario through the official Cloud Bigtable Node.js client
// (@google-cloud/bigtable, pinned in package.json) against the server named by
// BIGTABLE_EMULATOR_HOST: admin (create table with GC rules, createFamily, getFamilies, list,
// deleteRows, delete), writes (insert, row.save, mutate with every delete kind, bulk mutate),
// reads (keys, ranges, prefixes, limits, every filter kind the client builds, reversed through
// the client's own GAPIC layer), ReadModifyWrite (increment, append) and CheckAndMutate
// (row.filter), sampleRowKeys. Every answer is printed as one canonical JSON line, so the
// nodejs_client_test.sh driver can diff strata-node against the official emulator; key
// expectations are also asserted here, so a run without the emulator still proves something.
//
// Output lines: `{"step":NAME,"ok":RESULT}` or `{"step":NAME,"error":GRPC_CODE}`. Lines starting
// with `#` are printed but not compared: steps where the emulator is known to answer differently
// from Cloud Bigtable (docs/testing.md, diff_emulator_test exclusions). Timestamps are explicit
// (multiples of 1000 µs, small numbers) except where the server assigns them
// (ReadModifyWrite): those are checked to be within an hour of the local clock and printed
// as "now". Exit 0 when every expectation held, 1 otherwise (the failures go to stderr).
'use strict';

const {Bigtable, v2} = require('@google-cloud/bigtable');

const TARGET = process.argv[2] || 'server';
const T = 'nodejs_t1'; // main table: families created one by one in name order
const T2 = 'nodejs_t2'; // families through CreateTable's map, read back sorted
const NOW_US = Date.now() * 1000;
const HOUR_US = 3600 * 1e6;
let failures = 0;

// ---- canonical forms ------------------------------------------------------------------------

function bytes(b) {
  const buf = Buffer.isBuffer(b) ? b : Buffer.from(String(b));
  const printable = [...buf].every(c => c >= 0x20 && c < 0x7f);
  return printable ? 's:' + buf.toString('latin1') : 'x:' + buf.toString('hex');
}

function ts(t) {
  const n = Number(t);
  if (n > NOW_US - HOUR_US && n < NOW_US + HOUR_US && n % 1000 === 0) return 'now';
  return String(t);
}

// A row as the client hands it over ({family: {qualifier: [cells]}}), with the client's family
// and qualifier order kept. Runs of cells with one timestamp (only Interleave makes them; Cloud
// Bigtable leaves their order unspecified) are sorted by labels then value.
function canonRow(row) {
  const fams = [];
  for (const [fam, cols] of Object.entries(row.data)) {
    const qs = [];
    for (const [q, cells] of Object.entries(cols)) {
      const cs = cells.map(c => {
        const o = {ts: ts(c.timestamp), v: bytes(c.value)};
        if (c.labels && c.labels.length) o.labels = c.labels;
        return o;
      });
      cs.sort((a, b) => {
        if (a.ts !== b.ts) return 0;
        const ka = JSON.stringify([a.labels || [], a.v]);
        const kb = JSON.stringify([b.labels || [], b.v]);
        return ka < kb ? -1 : ka > kb ? 1 : 0;
      });
      qs.push([q, cs]);
    }
    fams.push([fam, qs]);
  }
  return [row.id, fams];
}

function canonRows(rows) {
  return rows.map(canonRow);
}

// GC rules as the admin API returns them, with the oneof's empty alternatives dropped.
function canonRule(r) {
  if (!r) return null;
  if (r.maxNumVersions) return {maxNumVersions: r.maxNumVersions};
  if (r.maxAge) return {maxAge: `${r.maxAge.seconds || 0}s${r.maxAge.nanos || 0}n`};
  if (r.union) return {union: r.union.rules.map(canonRule)};
  if (r.intersection) return {intersection: r.intersection.rules.map(canonRule)};
  return {};
}

function print(step, obj, divergent) {
  const line = JSON.stringify(Object.assign({step}, obj));
  console.log((divergent ? '# ' : '') + line);
}

function expect(step, cond, what) {
  if (!cond) {
    failures++;
    console.error(`EXPECTATION FAILED (${TARGET}) at ${step}: ${what}`);
  }
}

// Runs one step: prints its canonical result or its gRPC code, and returns {ok} or {error}.
// `opts.divergent` marks steps not compared with the emulator.
async function step(name, fn, canon, opts = {}) {
  let res;
  try {
    const v = await fn();
    res = {ok: canon ? canon(v) : v};
  } catch (e) {
    if (typeof e.code !== 'number' && !(e.errors && e.errors.length)) throw e; // a client bug
    res = {error: e.code};
    if (e.errors) res.entries = e.errors.map(x => [bytes(x.entry.key), x.code]);
  }
  print(name, res, opts.divergent);
  return res;
}

// ---- the scenario ---------------------------------------------------------------------------

async function admin(instance) {
  const table = instance.table(T);
  await step('create_table', async () => {
    const [t] = await table.create({families: [{name: 'cf1', rule: {versions: 2}}]});
    return t.id;
  });
  await step('create_family_cf2', async () => {
    const [f] = await table.createFamily('cf2', {rule: {age: {seconds: 86400}, versions: 1, union: true}});
    return f.id;
  });
  await step('create_family_cf3', async () => (await table.createFamily('cf3'))[0].id);
  const fams = await step('get_families', async () => (await table.getFamilies())[0],
    fs => fs.map(f => [f.id, canonRule(f.metadata && f.metadata.gcRule)]).sort());
  expect('get_families', fams.ok && fams.ok.length === 3 &&
    JSON.stringify(fams.ok[0]) === '["cf1",{"maxNumVersions":2}]', JSON.stringify(fams));

  const t2 = instance.table(T2);
  await step('create_table_map', async () => (await t2.create({
    families: ['a', {name: 'b', rule: {versions: 3}},
      {name: 'c', rule: {age: {seconds: 3600}, versions: 2}}],
    splits: ['m'],
  }))[0].id);
  await step('get_families_map', async () => (await t2.getFamilies())[0],
    fs => fs.map(f => [f.id, canonRule(f.metadata && f.metadata.gcRule)]).sort());
  await step('create_family_exists', () => table.createFamily('cf3'));
  await step('table_exists', async () => (await table.exists())[0]);
  const list = await step('list_tables', async () => (await instance.getTables())[0],
    ts_ => ts_.map(t => t.id).filter(id => id.startsWith('nodejs_')).sort());
  expect('list_tables', JSON.stringify(list.ok) === JSON.stringify([T, T2]), JSON.stringify(list));
  return table;
}

async function writes(table) {
  await step('insert', () => table.insert([
    {key: 'r1', data: {cf1: {a: {value: 'v1', timestamp: 1000}, b: {value: 'v2', timestamp: 1000}}}},
    {key: 'r1', data: {cf1: {a: {value: 'v3', timestamp: 2000}}}},
    {key: 'r2', data: {cf2: {c: {value: 'hello', timestamp: 3000}}, cf3: {x: {value: 'y', timestamp: 3000}}}},
    {key: 'r3', data: {cf1: {a: {value: Buffer.from([0, 1, 0xfe, 10]), timestamp: 4000}},
      cf3: {'': {value: 'empty-qualifier', timestamp: 4000}}}},
    {key: 's1', data: {cf1: {a: {value: 'sa', timestamp: 5000}}, cf3: {n: {value: 7, timestamp: 5000}}}},
    {key: 's2', data: {cf3: {x: {value: 's2x', timestamp: 6000}, y: {value: 's2y', timestamp: 6000}}}},
    {key: 'zz', data: {cf1: {a: {value: 'late', timestamp: 7000}}}},
  ]), () => 'done');
  await step('row_save', () => table.row('r4').save({
    cf1: {a: {value: 'saved', timestamp: 8000}},
    cf3: {q1: {value: 'one', timestamp: 8000}, q2: {value: 'two', timestamp: 9000}},
  }), () => 'done');
  // Three versions of one column, then deletes of each kind through table.mutate.
  await step('mutate_versions', () => table.mutate([
    {key: 'd1', method: 'insert', data: {cf3: {
      v: {value: 'old', timestamp: 1000}}}},
    {key: 'd1', method: 'insert', data: {cf3: {v: {value: 'mid', timestamp: 2000}}}},
    {key: 'd1', method: 'insert', data: {cf3: {v: {value: 'new', timestamp: 3000}, w: {value: 'w', timestamp: 3000}}, cf2: {k: {value: 'k', timestamp: 3000}}}},
    {key: 'd2', method: 'insert', data: {cf3: {v: {value: 'gone', timestamp: 1000}}}},
    {key: 'd3', method: 'insert', data: {cf1: {a: {value: 'a', timestamp: 1000}}, cf3: {b: {value: 'b', timestamp: 1000}}}},
  ]), () => 'done');
  await step('read_before_deletes', async () => (await table.getRows({prefix: 'd', decode: false}))[0], canonRows);
  await step('mutate_deletes', () => table.mutate([
    // DeleteFromColumn with a time range [2000, 3000): only "mid" goes.
    {key: 'd1', method: 'delete', data: [{column: 'cf3:v', time: {start: new Date(2), end: new Date(3)}}]},
    {key: 'd1', method: 'delete', data: ['cf2']}, // DeleteFromFamily
    {key: 'd2', method: 'delete'}, // DeleteFromRow
    {key: 'd3', method: 'delete', data: ['cf3:b']}, // DeleteFromColumn, all versions
  ]), () => 'done');
  const after = await step('read_after_deletes', async () => (await table.getRows({prefix: 'd', decode: false}))[0], canonRows);
  expect('read_after_deletes', JSON.stringify(after.ok) === JSON.stringify([
    ['d1', [['cf3', [['v', [{ts: '3000', v: 's:new'}, {ts: '1000', v: 's:old'}]], ['w', [{ts: '3000', v: 's:w'}]]]]]],
    ['d3', [['cf1', [['a', [{ts: '1000', v: 's:a'}]]]]]]]), JSON.stringify(after.ok));
  await step('row_delete_cells', () => table.row('r1').deleteCells(['cf1:b']), () => 'done');
  await step('row_get_r1', async () => (await table.row('r1').get({decode: false}))[0], canonRow);
  await step('row_get_columns', async () => (await table.row('r4').get(['cf3:q2'], {decode: false}))[0], canonRow);
  await step('row_exists_d3', async () => (await table.row('d3').exists())[0]);
  await step('row_delete_d3', () => table.row('d3').delete(), () => 'done');
  await step('row_exists_d3_after', async () => (await table.row('d3').exists())[0]);
  await step('row_get_missing', async () => (await table.row('nope').get())[0], canonRow);
}

async function reads(table) {
  const get = opts => async () => (await table.getRows(Object.assign({decode: false}, opts)))[0];
  const all = await step('read_all', get({}), canonRows);
  expect('read_all', all.ok && all.ok.map(r => r[0]).join() === 'd1,r1,r2,r3,r4,s1,s2,zz',
    JSON.stringify(all.ok && all.ok.map(r => r[0])));
  await step('read_keys', get({keys: ['r2', 's1', 'missing', 'r1']}), canonRows);
  await step('read_start_end', get({start: 'r2', end: 's1'}), canonRows);
  await step('read_ranges', get({ranges: [
    {start: {value: 'r1', inclusive: false}, end: {value: 'r3', inclusive: true}},
    {start: 's2'},
  ]}), canonRows);
  await step('read_prefix', get({prefix: 's'}), canonRows);
  await step('read_prefixes', get({prefixes: ['d', 'z']}), canonRows);
  const lim = await step('read_limit', get({limit: 3}), canonRows);
  expect('read_limit', lim.ok && lim.ok.length === 3, JSON.stringify(lim));
  await step('read_keys_and_ranges', get({keys: ['zz'], ranges: [{start: 'r3', end: 'r4'}], limit: 5}), canonRows);
  await step('read_decoded', async () => (await table.getRows({keys: ['s1']}))[0],
    rows => rows.map(r => [r.id, r.data.cf1.a[0].value, r.data.cf3.n[0].value]));

  const f = (name, filter, extra = {}) => step('filter_' + name, get(Object.assign({filter}, extra)), canonRows);
  await f('family', {family: 'cf3'});
  await f('family_regex', {family: /cf[12]/});
  await f('column', {column: 'a'});
  await f('column_regex', {column: /^q\d$/});
  await f('column_cell_limit', {column: {cellLimit: 1}});
  await f('column_range', {column: {family: 'cf3', start: 'q1', end: {value: 'x', inclusive: false}}});
  await f('value_regex', {value: /^s2.*/});
  await f('value_range', {value: {start: 'one', end: {value: 'two', inclusive: true}}});
  await f('strip', [{family: 'cf1'}, {value: {strip: true}}]);
  await f('row_key_regex', {row: /r[24]/});
  await f('row_cell_limit', [{family: 'cf3'}, {row: {cellLimit: 1}}]);
  await f('row_cell_offset', [{family: 'cf3'}, {row: {cellOffset: 1}}]);
  await f('time_range', {time: {start: new Date(2), end: new Date(6)}});
  await f('chain', [{family: 'cf1'}, {column: 'a'}, {value: /v.*/}]);
  await f('interleave_labels', {interleave: [
    [{family: 'cf1'}, {label: 'one'}],
    [{column: 'a'}, {label: 'two'}],
  ]});
  await f('condition_true', {condition: {
    test: [{column: 'x'}], pass: [{family: 'cf3'}, {label: 'had-x'}], fail: {family: 'cf1'},
  }});
  await f('block_all', {all: false});
  await f('pass_all', {all: true}, {keys: ['r1']});
  await f('bad_regex', {value: /(/});
}

async function rmwAndCheckAndMutate(table) {
  // ReadModifyWrite: increments from absent, negative, appends; timestamps are the server's.
  const inc1 = await step('increment_absent', async () => (await table.row('c1').increment('cf3:n', 5))[0]);
  expect('increment_absent', inc1.ok === 5, JSON.stringify(inc1));
  const inc2 = await step('increment_negative', async () => (await table.row('c1').increment('cf3:n', -8))[0]);
  expect('increment_negative', inc2.ok === -3, JSON.stringify(inc2));
  await step('increment_existing', async () => (await table.row('s1').increment('cf3:n'))[0]);
  const app = await step('append_twice', async () => (await table.row('c1').createRules([
    {column: 'cf3:s', append: 'ab'}, {column: 'cf3:s', append: 'cd'}]))[0],
  r => canonRow({id: 'c1', data: require('@google-cloud/bigtable/build/src/row-data-utils')
    .RowDataUtils.formatFamilies_Util(r.row.families, {decode: false})}));
  expect('append_twice', app.ok && JSON.stringify(app.ok).includes('s:abcd'), JSON.stringify(app));
  await step('append_existing', async () => (await table.row('r4').createRules({column: 'cf3:q1', append: '+more'}))[0],
    r => r.row.families.map(fm => [fm.name, fm.columns.map(c => [bytes(c.qualifier),
      c.cells.map(x => [ts(x.timestampMicros), bytes(x.value)])])]));
  await step('read_after_rmw', async () => (await table.getRows({keys: ['c1', 's1', 'r4'], decode: false}))[0], canonRows);
  // Cloud Bigtable answers INVALID_ARGUMENT; the emulator UNKNOWN (exclusion 6).
  const bad = await step('increment_not_8_bytes', () => table.row('r2').increment('cf3:x', 1), null, {divergent: true});
  if (TARGET === 'strata') expect('increment_not_8_bytes', bad.error === 3, JSON.stringify(bad));

  // CheckAndMutate through row.filter.
  const t1 = await step('check_and_mutate_true', async () => (await table.row('r2').filter(
    [{family: 'cf2'}, {value: 'hello'}],
    {onMatch: [{method: 'insert', data: {cf1: {m: {value: 'matched', timestamp: 10000}}}}],
      onNoMatch: [{method: 'insert', data: {cf1: {m: {value: 'not', timestamp: 10000}}}}]}))[0]);
  expect('check_and_mutate_true', t1.ok === true, JSON.stringify(t1));
  const t2 = await step('check_and_mutate_false', async () => (await table.row('r3').filter(
    {value: 'nothing-like-this'},
    {onMatch: [{method: 'delete'}],
      onNoMatch: [{method: 'insert', data: {cf1: {m: {value: 'not', timestamp: 11000}}}},
        {method: 'delete', data: ['cf3']}]}))[0]);
  expect('check_and_mutate_false', t2.ok === false, JSON.stringify(t2));
  await step('check_and_mutate_absent_row', async () => (await table.row('absent').filter(
    {all: true}, {onMatch: [{method: 'delete'}],
      onNoMatch: [{method: 'insert', data: {cf1: {m: {value: 'created', timestamp: 12000}}}}]}))[0]);
  await step('read_after_cam', async () => (await table.getRows({keys: ['r2', 'r3', 'absent'], decode: false}))[0], canonRows);
}

// Reversed reads: the handwritten layer of this client version has no `reverse` option, so the
// client's own generated (GAPIC) BigtableClient sends ReadRowsRequest.reversed, with the
// bigtable-features header announcing reverse_scans as newer clients do.
async function reversed(bigtable, table) {
  const gapic = new v2.BigtableClient(bigtable.options.BigtableClient);
  const features = Buffer.from([0x08, 0x01]).toString('base64'); // FeatureFlags{reverse_scans: true}
  const run = (req, headers) => new Promise((resolve, reject) => {
    const out = [];
    const s = gapic.readRows(Object.assign({tableName: table.name}, req),
      {otherArgs: {headers}, retry: null});
    s.on('data', resp => {
      for (const c of resp.chunks) {
        if (c.rowKey && c.rowKey.length) out.push(bytes(c.rowKey));
      }
    });
    s.on('error', reject);
    s.on('end', () => resolve(out));
  });
  const rev = await step('read_reversed', () => run({reversed: true, rows: {rowRanges: [{startKeyClosed: 'r', endKeyOpen: 't'}]}},
    {'bigtable-features': features}));
  expect('read_reversed', rev.ok && rev.ok.join() === 's:s2,s:s1,s:r4,s:r3,s:r2,s:r1', JSON.stringify(rev));
  await step('read_reversed_limit', () => run({reversed: true, rowsLimit: 2}, {'bigtable-features': features}));
  await gapic.close();
}

async function bulkAndDrop(instance, table) {
  const N = 3000;
  const entries = [];
  for (let i = 0; i < N; i++) {
    const k = 'bulk' + String(i).padStart(5, '0');
    entries.push({key: k, data: {cf1: {a: {value: 'v' + i, timestamp: 1000}},
      cf3: {b: {value: Buffer.alloc(100, i % 256), timestamp: 2000}}}});
  }
  await step('bulk_mutate', () => table.mutate(entries), () => N);
  const cnt = await step('bulk_count', async () => (await table.getRows({prefix: 'bulk',
    filter: [{row: {cellLimit: 1}}, {value: {strip: true}}]}))[0].length);
  expect('bulk_count', cnt.ok === N, JSON.stringify(cnt));
  await step('bulk_sample', async () => (await table.getRows({prefix: 'bulk', decode: false,
    filter: {column: 'a'}}))[0].filter((r, i) => i % 500 === 0 || i === N - 1), canonRows);
  // Per-entry statuses: an unknown family fails its own entry only (Cloud NOT_FOUND, the
  // emulator UNKNOWN: compared on the rows only).
  const part = await step('bulk_partial_failure', () => table.mutate([
    {key: 'pf1', data: {cf1: {a: {value: 'ok', timestamp: 1000}}}},
    {key: 'pf2', data: {nofamily: {a: {value: 'bad', timestamp: 1000}}}},
    {key: 'pf3', data: {cf1: {a: {value: 'ok', timestamp: 1000}}}},
  ]), () => 'done', {divergent: true});
  if (TARGET === 'strata') {
    expect('bulk_partial_failure', JSON.stringify(part.entries) === '[["s:pf2",5]]', JSON.stringify(part));
  }
  await step('read_partial_failure', get(table, {prefix: 'pf'}), canonRows);

  // sampleRowKeys: at least one key, ascending, the last the empty key (end of table). The keys
  // themselves are the server's choice, so only their shape is compared.
  await step('sample_row_keys', async () => (await table.sampleRowKeys())[0], ks => {
    const keys = ks.map(k => Buffer.from(k.key || []).toString('latin1'));
    const sorted = keys.slice(0, -1).every((k, i) => i === 0 || keys[i - 1] < k);
    return {nonEmpty: keys.length > 0, lastIsEnd: keys[keys.length - 1] === '', ascending: sorted};
  });

  await step('delete_rows_prefix', () => table.deleteRows('bulk'), () => 'done');
  const left = await step('count_after_drop', async () => (await table.getRows({prefix: 'bulk'}))[0].length);
  expect('count_after_drop', left.ok === 0, JSON.stringify(left));
  await step('rows_after_drop', async () => (await table.getRows({filter: {value: {strip: true}}}))[0].map(r => r.id));

  // Errors the emulator and Cloud Bigtable agree on.
  const missing = instance.table('nodejs_missing');
  const e1 = await step('read_unknown_table', async () => (await missing.getRows())[0], canonRows);
  expect('read_unknown_table', e1.error === 5, JSON.stringify(e1));
  await step('write_unknown_table', () => missing.row('k').save({cf1: {a: {value: 'v', timestamp: 1000}}}));
  // Cloud NOT_FOUND; the emulator UNKNOWN.
  const e3 = await step('write_unknown_family', () => table.row('k').save({nofam: {a: {value: 'v', timestamp: 1000}}}),
    null, {divergent: true});
  if (TARGET === 'strata') expect('write_unknown_family', e3.error === 5, JSON.stringify(e3));
  const e4 = await step('write_bad_timestamp', () => table.row('k').save({cf1: {a: {value: 'v', timestamp: 1500}}}),
    null, {divergent: true});
  if (TARGET === 'strata') expect('write_bad_timestamp', e4.error === 3, JSON.stringify(e4));

  await step('truncate', () => instance.table(T2).truncate(), () => 'done');
  await step('delete_table', () => table.delete(), () => 'done');
  await step('delete_table_map', () => instance.table(T2).delete(), () => 'done');
  const ex = await step('table_exists_after', async () => (await table.exists())[0]);
  expect('table_exists_after', ex.ok === false, JSON.stringify(ex));
  await step('list_tables_after', async () => (await instance.getTables())[0],
    ts_ => ts_.map(t => t.id).filter(id => id.startsWith('nodejs_')).sort());
}

function get(table, opts) {
  return async () => (await table.getRows(Object.assign({decode: false}, opts)))[0];
}

async function main() {
  if (!process.env.BIGTABLE_EMULATOR_HOST) {
    console.error('BIGTABLE_EMULATOR_HOST is not set');
    process.exit(2);
  }
  const bigtable = new Bigtable({projectId: 'p'});
  const instance = bigtable.instance('i');
  const table = await admin(instance);
  await writes(table);
  await reads(table);
  await rmwAndCheckAndMutate(table);
  await reversed(bigtable, table);
  await bulkAndDrop(instance, table);
  await bigtable.close();
  console.error(`client_test (${TARGET}): ${failures ? failures + ' expectation(s) failed' : 'all expectations held'}`);
  process.exit(failures ? 1 : 0);
}

main().catch(e => {
  console.error(`client_test (${TARGET}): unexpected error: ${e && e.stack || e}`);
  process.exit(3);
});
