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
  // The client turns every 8-byte value into a number when it is a safe integer, even with
  // decode: false.
  if (typeof b === 'number') return 'n:' + b;
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
  return [bytes(row.id), fams];
}

function canonRows(rows) {
  return rows.map(canonRow);
}

// GC rules as the admin API returns them, with the oneof's empty alternatives dropped. "No
// rule" is null whether the family's gc_rule is absent (the emulator) or an empty GcRule
// (strata-node); rawRules shows which.
function canonRule(r) {
  if (!r || !(r.maxNumVersions || r.maxAge || r.union || r.intersection)) return null;
  if (r.maxNumVersions) return {maxNumVersions: r.maxNumVersions};
  if (r.maxAge) return {maxAge: `${r.maxAge.seconds || 0}s${r.maxAge.nanos || 0}n`};
  if (r.union) return {union: r.union.rules.map(canonRule)};
  if (r.intersection) return {intersection: r.intersection.rules.map(canonRule)};
  return {};
}

// A ReadModifyWriteRow answer: the row's new cells (families, qualifiers, cells as sent).
function canonRmw(resp) {
  return resp.row.families.map(fm => [fm.name, fm.columns.map(c => [bytes(c.qualifier),
    c.cells.map(x => ({ts: ts(x.timestampMicros), v: bytes(x.value)}))])]);
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
    res = {error: typeof e.code === 'number' ? e.code : e.name};
    console.error(`${TARGET} ${name}: code ${e.code}: ${String(e.message).split('\n')[0]}`);
    if (e.errors) res.entries = e.errors.map(x => [x.entry ? bytes(x.entry.key) : null, x.code]);
  }
  print(name, res, opts.divergent);
  return res;
}

// ---- the scenario ---------------------------------------------------------------------------

// A cell with an explicit timestamp (µs, a multiple of 1000: the table has millisecond
// granularity), as table.insert / row.save / table.mutate take it.
const c = (value, timestamp) => ({value, timestamp});
const ins = (key, data) => ({key, method: 'insert', data});
const rowsOf = (table, opts) => async () =>
  (await table.getRows(Object.assign({decode: false}, opts)))[0];
const familiesOf = table => async () => (await table.getFamilies())[0];
const canonFamilies = fs => fs.map(f => [f.id, canonRule(f.metadata && f.metadata.gcRule)]).sort();
const ourTables = ts_ => ts_.map(t => t.id).filter(id => id.startsWith('nodejs_')).sort();

async function admin(instance) {
  const table = instance.table(T);
  await step('create_table', async () => {
    const [t] = await table.create({families: [{name: 'cf1', rule: {versions: 2}}]});
    return t.id;
  });
  await step('create_family_cf2', async () => {
    // GC never applies to the data below (cells a century younger than max age, at most three
    // versions): Cloud Bigtable collects lazily, so expired cells may or may not be read.
    const rule = {age: {seconds: 100 * 365 * 86400}, versions: 3, union: true};
    return (await table.createFamily('cf2', {rule}))[0].id;
  });
  await step('create_family_cf3', async () => (await table.createFamily('cf3'))[0].id);
  await step('get_families_raw_empty_rule', familiesOf(table),
    fs => fs.map(f => [f.id, f.metadata && f.metadata.gcRule ? 'gc_rule set' : 'gc_rule absent']),
    {divergent: true});
  const fams = await step('get_families', familiesOf(table), canonFamilies);
  expect('get_families', fams.ok && fams.ok.length === 3 &&
    JSON.stringify(fams.ok[0]) === '["cf1",{"maxNumVersions":2}]', JSON.stringify(fams));

  const t2 = instance.table(T2);
  await step('create_table_map', async () => (await t2.create({
    families: ['a', {name: 'b', rule: {versions: 3}},
      {name: 'c', rule: {age: {seconds: 3600}, versions: 2}}],
    splits: [Buffer.from('m')], // a string would be sent as base64 by protobufjs
  }))[0].id);
  await step('get_families_map', familiesOf(t2), canonFamilies);
  await step('create_family_exists', () => table.createFamily('cf3'));
  await step('table_exists', async () => (await table.exists())[0]);
  const list = await step('list_tables', async () => (await instance.getTables())[0], ourTables);
  expect('list_tables', JSON.stringify(list.ok) === JSON.stringify([T, T2]), JSON.stringify(list));
  return table;
}

async function writes(table) {
  await step('insert', () => table.insert([
    {key: 'r1', data: {cf1: {a: c('v1', 1000), b: c('v2', 1000)}}},
    {key: 'r1', data: {cf1: {a: c('v3', 2000)}}},
    {key: 'r2', data: {cf2: {c: c('hello', 3000)}, cf3: {x: c('y', 3000)}}},
    {key: 'r3', data: {cf1: {a: c(Buffer.from([0, 1, 0xfe, 10]), 4000)},
      cf3: {'': c('empty-qualifier', 4000)}}},
    {key: 's1', data: {cf1: {a: c('sa', 5000)}, cf3: {n: c(7, 5000)}}}, // 7: 8 bytes big-endian
    {key: 's2', data: {cf3: {x: c('s2x', 6000), y: c('s2y', 6000)}}},
    {key: 'zz', data: {cf1: {a: c('late', 7000)}}},
    {key: 'u1', data: {cf1: {a: 'client-time'}}}, // the client stamps its clock (masked "now")
  ]), () => 'done');
  await step('row_save', () => table.row('r4').save({
    cf1: {a: c('saved', 8000)}, cf3: {q1: c('one', 8000), q2: c('two', 9000)},
  }), () => 'done');
  // Three versions of one column, then deletes of each kind through table.mutate.
  await step('mutate_versions', () => table.mutate([
    ins('d1', {cf3: {v: c('old', 1000)}}),
    ins('d1', {cf3: {v: c('mid', 2000)}}),
    ins('d1', {cf3: {v: c('new', 3000), w: c('w', 3000)}, cf2: {k: c('k', 3000)}}),
    ins('d2', {cf3: {v: c('gone', 1000)}}),
    ins('d3', {cf1: {a: c('a', 1000)}, cf3: {b: c('b', 1000)}}),
  ]), () => 'done');
  await step('read_before_deletes', rowsOf(table, {prefix: 'd'}), canonRows);
  await step('mutate_deletes', () => table.mutate([
    // DeleteFromColumn with a time range [2000, 3000) (the client takes Dates): only "mid" goes.
    {key: 'd1', method: 'delete',
      data: [{column: 'cf3:v', time: {start: new Date(2), end: new Date(3)}}]},
    {key: 'd1', method: 'delete', data: ['cf2']}, // DeleteFromFamily
    {key: 'd2', method: 'delete'}, // DeleteFromRow
    {key: 'd3', method: 'delete', data: ['cf3:b']}, // DeleteFromColumn, all versions
  ]), () => 'done');
  const after = await step('read_after_deletes', rowsOf(table, {prefix: 'd'}), canonRows);
  expect('read_after_deletes', JSON.stringify(after.ok) === JSON.stringify([
    ['s:d1', [['cf3', [['v', [{ts: '3000', v: 's:new'}, {ts: '1000', v: 's:old'}]],
      ['w', [{ts: '3000', v: 's:w'}]]]]]],
    ['s:d3', [['cf1', [['a', [{ts: '1000', v: 's:a'}]]]]]]]), JSON.stringify(after.ok));
  await step('row_delete_cells', () => table.row('r1').deleteCells(['cf1:b']), () => 'done');
  await step('row_get_r1', async () => (await table.row('r1').get({decode: false}))[0], canonRow);
  await step('row_get_columns',
    async () => (await table.row('r4').get(['cf3:q2'], {decode: false}))[0],
    data => canonRow({id: 'r4', data})); // with columns, get() answers the row's data only
  await step('row_exists_d3', async () => (await table.row('d3').exists())[0]);
  await step('row_delete_d3', () => table.row('d3').delete(), () => 'done');
  await step('row_exists_d3_after', async () => (await table.row('d3').exists())[0]);
  await step('row_get_missing', async () => (await table.row('nope').get())[0], canonRow);
}

async function reads(table) {
  const get = opts => rowsOf(table, opts);
  const all = await step('read_all', get({}), canonRows);
  const keys = all.ok && all.ok.map(r => r[0]).join();
  expect('read_all', keys === 's:d1,s:r1,s:r2,s:r3,s:r4,s:s1,s:s2,s:u1,s:zz', keys);
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
  await step('read_keys_and_ranges',
    get({keys: ['zz'], ranges: [{start: 'r3', end: 'r4'}], limit: 5}), canonRows);
  await step('read_decoded', async () => (await table.getRows({keys: ['s1']}))[0],
    rows => rows.map(r => [r.id, r.data.cf1.a[0].value, r.data.cf3.n[0].value]));

  const f = (name, filter, extra = {}) =>
    step('filter_' + name, get(Object.assign({filter}, extra)), canonRows);
  await f('family', {family: 'cf3'});
  await f('family_regex', {family: /cf[12]/});
  await f('column', {column: 'a'});
  await f('column_regex', {column: /^q\d$/});
  await f('column_cell_limit', {column: {cellLimit: 1}});
  await f('column_range',
    {column: {family: 'cf3', start: 'q1', end: {value: 'x', inclusive: false}}});
  await f('value_regex', {value: /^s2.*/});
  await f('value_range', {value: {start: 'one', end: {value: 'two', inclusive: true}}});
  await f('strip', [{family: 'cf1'}, {value: {strip: true}}]);
  await f('row_key_regex', {row: /r[24]/});
  // Cells per row only over one family (the emulator counts families in random order).
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
  await f('bad_regex', {value: '('});
}

async function readModifyWrite(table) {
  // Increments from absent, negative, of an existing counter, appends; the server stamps them.
  const incr = (key, col, by) => async () => (await table.row(key).increment(col, by))[0];
  const rules = (key, r) => async () => (await table.row(key).createRules(r))[0];
  const inc1 = await step('increment_absent', incr('c1', 'cf3:n', 5));
  expect('increment_absent', inc1.ok === 5, JSON.stringify(inc1));
  const inc2 = await step('increment_negative', incr('c1', 'cf3:n', -8));
  expect('increment_negative', inc2.ok === -3, JSON.stringify(inc2));
  await step('increment_existing', incr('s1', 'cf3:n', 1));
  const app = await step('append_twice', rules('c1',
    [{column: 'cf3:s', append: 'ab'}, {column: 'cf3:s', append: 'cd'}]), canonRmw);
  expect('append_twice', app.ok && JSON.stringify(app.ok).includes('s:abcd'), JSON.stringify(app));
  await step('append_existing', rules('r4', {column: 'cf3:q1', append: '+more'}), canonRmw);
  await step('read_after_rmw', rowsOf(table, {keys: ['s1', 'r4']}), canonRows);
  // Two increments within one millisecond share a timestamp (the second replaces the first):
  // only the latest version of c1's cells is deterministic.
  await step('read_after_rmw_latest',
    rowsOf(table, {keys: ['c1'], filter: {column: {cellLimit: 1}}}), canonRows);
  // Cloud Bigtable answers FAILED_PRECONDITION ("Cannot increment value ... The increment
  // operation can only be performed on 64-bit values"); the emulator UNKNOWN.
  const bad = await step('increment_not_8_bytes', incr('r2', 'cf3:x', 1), null, {divergent: true});
  if (TARGET === 'strata') expect('increment_not_8_bytes', bad.error === 9, JSON.stringify(bad));
}

async function checkAndMutate(table) {
  const cam = (key, filter, config) => async () => (await table.row(key).filter(filter, config))[0];
  const set = (q, v, t) => ({method: 'insert', data: {cf1: {[q]: c(v, t)}}});
  const t1 = await step('check_and_mutate_true', cam('r2', [{family: 'cf2'}, {value: 'hello'}],
    {onMatch: [set('m', 'matched', 10000)], onNoMatch: [set('m', 'not', 10000)]}));
  expect('check_and_mutate_true', t1.ok === true, JSON.stringify(t1));
  const t2 = await step('check_and_mutate_false', cam('r3', {value: 'nothing-like-this'},
    {onMatch: [{method: 'delete'}],
      onNoMatch: [set('m', 'not', 11000), {method: 'delete', data: ['cf3']}]}));
  expect('check_and_mutate_false', t2.ok === false, JSON.stringify(t2));
  await step('check_and_mutate_absent_row', cam('absent', {all: true},
    {onMatch: [{method: 'delete'}], onNoMatch: [set('m', 'created', 12000)]}));
  await step('read_after_cam', rowsOf(table, {keys: ['r2', 'r3', 'absent']}), canonRows);
}

// Reversed reads: the handwritten layer of this client version has no `reverse` option, so the
// client's own generated (GAPIC) BigtableClient sends ReadRowsRequest.reversed, with the
// bigtable-features header announcing reverse_scans as newer clients do.
async function reversed(bigtable, table) {
  const gapic = new v2.BigtableClient(bigtable.options.BigtableClient);
  // FeatureFlags{reverse_scans: true}: field 1, varint 1.
  const headers = {'bigtable-features': Buffer.from([0x08, 0x01]).toString('base64')};
  const run = req => () => new Promise((resolve, reject) => {
    const out = [];
    const s = gapic.readRows(Object.assign({tableName: table.name, reversed: true}, req),
      {otherArgs: {headers}, retry: null});
    let key = null; // a server may repeat the row key on every chunk of a row
    s.on('data', resp => {
      for (const ch of resp.chunks) {
        if (ch.rowKey && ch.rowKey.length) key = bytes(ch.rowKey);
        if (ch.commitRow) out.push(key);
      }
    });
    s.on('error', reject);
    s.on('end', () => resolve(out));
  });
  const range = {startKeyClosed: Buffer.from('r'), endKeyOpen: Buffer.from('t')};
  const rev = await step('read_reversed', run({rows: {rowRanges: [range]}}));
  expect('read_reversed', rev.ok && rev.ok.join() === 's:s2,s:s1,s:r4,s:r3,s:r2,s:r1',
    JSON.stringify(rev));
  await step('read_reversed_limit', run({rowsLimit: 2}));
  await gapic.close();
}

async function bulk(table) {
  const N = 3000;
  const entries = [];
  for (let i = 0; i < N; i++) {
    entries.push(ins('bulk' + String(i).padStart(5, '0'),
      {cf1: {a: c('v' + i, 1000)}, cf3: {b: c(Buffer.alloc(100, i % 256), 2000)}}));
  }
  await step('bulk_mutate', () => table.mutate(entries), () => N);
  // A 3 MiB value: the answer is cut into chunks, which the client's chunk transformer checks.
  const big = Buffer.alloc(3 << 20);
  for (let i = 0; i < big.length; i++) big[i] = (i * 7 + (i >> 11)) & 0xff;
  const digest = b => require('crypto').createHash('sha256').update(b).digest('hex');
  await step('big_value_write',
    () => table.row('bulkbig').save({cf3: {big: c(big, 1000)}}), () => 'done');
  const bigRead = await step('big_value_read',
    async () => (await table.row('bulkbig').get({decode: false}))[0].data.cf3.big[0].value,
    v => ({len: v.length, sha256: digest(v)}));
  expect('big_value_read', bigRead.ok && bigRead.ok.sha256 === digest(big),
    JSON.stringify(bigRead));
  const cnt = await step('bulk_count', async () => (await table.getRows({prefix: 'bulk',
    filter: [{row: {cellLimit: 1}}, {value: {strip: true}}]}))[0].length);
  expect('bulk_count', cnt.ok === N + 1, JSON.stringify(cnt));
  await step('bulk_sample', rowsOf(table, {prefix: 'bulk', filter: {column: 'a'}}),
    rows => canonRows(rows.filter((r, i) => i % 500 === 0 || i === N - 1)));
  // Per-entry statuses: an unknown family fails its own entry only (Cloud NOT_FOUND, the
  // emulator INTERNAL: the codes are not compared, the rows are).
  const part = await step('bulk_partial_failure', () => table.mutate([
    ins('pf1', {cf1: {a: c('ok', 1000)}}),
    ins('pf2', {nofamily: {a: c('bad', 1000)}}),
    ins('pf3', {cf1: {a: c('ok', 1000)}}),
  ]), () => 'done', {divergent: true});
  if (TARGET === 'strata') {
    expect('bulk_partial_failure', JSON.stringify(part.entries) === '[["s:pf2",5]]',
      JSON.stringify(part));
  }
  await step('read_partial_failure', rowsOf(table, {prefix: 'pf'}), canonRows);

  // sampleRowKeys: at least one key, ascending, the last the empty key (end of table). The keys
  // themselves are the server's choice, so only their shape is compared.
  await step('sample_row_keys', async () => (await table.sampleRowKeys())[0], ks => {
    const keys = ks.map(k => Buffer.from(k.key || []).toString('latin1'));
    const sorted = keys.slice(0, -1).every((k, i) => i === 0 || keys[i - 1] < k);
    return {nonEmpty: keys.length > 0, lastIsEnd: keys[keys.length - 1] === '', ascending: sorted};
  });
  await step('delete_rows_prefix', () => table.deleteRows('bulk'), () => 'done');
  const left = await step('count_after_drop',
    async () => (await table.getRows({prefix: 'bulk'}))[0].length);
  expect('count_after_drop', left.ok === 0, JSON.stringify(left));
  await step('rows_after_drop',
    async () => (await table.getRows({filter: {value: {strip: true}}}))[0].map(r => r.id));
}

async function errorsAndDrop(instance, table) {
  // The emulator and Cloud Bigtable agree on these.
  const missing = instance.table('nodejs_missing');
  const e1 = await step('read_unknown_table', rowsOf(missing, {}), canonRows);
  expect('read_unknown_table', e1.error === 5, JSON.stringify(e1));
  await step('write_unknown_table', () => missing.row('k').save({cf1: {a: c('v', 1000)}}));
  // Cloud NOT_FOUND and INVALID_ARGUMENT; the emulator INTERNAL.
  const e3 = await step('write_unknown_family',
    () => table.row('k').save({nofam: {a: c('v', 1000)}}), null, {divergent: true});
  const e4 = await step('write_bad_timestamp',
    () => table.row('k').save({cf1: {a: c('v', 1500)}}), null, {divergent: true});
  if (TARGET === 'strata') {
    const codes = e => JSON.stringify(e.entries);
    expect('write_unknown_family', codes(e3) === '[["s:k",5]]', JSON.stringify(e3));
    expect('write_bad_timestamp', codes(e4) === '[["s:k",3]]', JSON.stringify(e4));
  }

  await step('truncate', () => instance.table(T2).truncate(), () => 'done');
  await step('delete_table', () => table.delete(), () => 'done');
  await step('delete_table_map', () => instance.table(T2).delete(), () => 'done');
  const ex = await step('table_exists_after', async () => (await table.exists())[0]);
  expect('table_exists_after', ex.ok === false, JSON.stringify(ex));
  await step('list_tables_after', async () => (await instance.getTables())[0], ourTables);
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
  await readModifyWrite(table);
  await checkAndMutate(table);
  await reversed(bigtable, table);
  await bulk(table);
  await errorsAndDrop(instance, table);
  await bigtable.close();
  const verdict = failures ? `${failures} expectation(s) failed` : 'all expectations held';
  console.error(`client_test (${TARGET}): ${verdict}`);
  process.exit(failures ? 1 : 0);
}

main().catch(e => {
  console.error(`client_test (${TARGET}): unexpected error: ${e && e.stack || e}`);
  process.exit(3);
});
