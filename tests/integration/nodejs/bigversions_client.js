// bigversions_client.js — a row grown past the 256 MiB read limit through versions (one column,
// 10 versions of 27 MiB between two small rows) read through the official Node.js client with
// the filters that ask for less: the latest version (cells_per_column_limit 1, also after a
// qualifier filter, also reversed), the first cell (cells_per_row_limit 1), the client's
// keys-only scan (cells_per_row_limit 1 then strip_value) over the whole table, and a chain that
// limits versions before an interleave. Each returns what it asks for. Without a filter the read
// still fails with Cloud Bigtable's FAILED_PRECONDITION "Read returned N MiB ...", and a filter
// that needs the whole raw row says so. Prints `ok NAME` or `FAIL NAME: detail`; exit 1 when one
// failed. Against BIGTABLE_EMULATOR_HOST.
'use strict';
const {Bigtable, v2} = require('@google-cloud/bigtable');

const bt = new Bigtable({projectId: 'p', metricsEnabled: false});
const data = new v2.BigtableClient(bt.options.BigtableClient);
const admin = new v2.BigtableTableAdminClient(bt.options.BigtableTableAdminClient);
const INST = 'projects/p/instances/i';
const T = 'bigversions';
const TN = INST + '/tables/' + T;
const MB = 1 << 20;
const VERSIONS = 10;
const VALUE_BYTES = 27 * MB; // 10 x 27 MiB = 270 MiB in row "b"
const B = s => Buffer.from(s);
let failed = 0;

function check(name, cond, detail) {
  console.log(cond ? 'ok ' + name : 'FAIL ' + name + ': ' + detail);
  if (!cond) failed++;
}

// Version i of b's column: every byte the letter of i, so the version read back is known.
const versionByte = i => 96 + i;

// ReadRows through the generated client: {rows: [{key, cells: [{ts, len, byte}]}]} or {err}.
function readRows(filter, reversed) {
  const req = {tableName: TN};
  if (filter) req.filter = filter;
  const opts = {retry: null};
  if (reversed) {
    req.reversed = true;
    // FeatureFlags{reverse_scans: true}: Cloud Bigtable refuses reversed reads without it.
    opts.otherArgs = {headers: {'bigtable-features': Buffer.from([8, 1]).toString('base64')}};
  }
  return new Promise(resolve => {
    const rows = [];
    let row = null, cell = null;
    const s = data.readRows(req, opts);
    s.on('data', r => {
      for (const c of r.chunks) {
        if (c.rowKey && c.rowKey.length) row = {key: String(c.rowKey), cells: []};
        if (c.timestampMicros !== undefined && c.timestampMicros !== null &&
            (!cell || cell.done)) {
          cell = {ts: Number(c.timestampMicros), len: 0, byte: -1, done: false};
          row.cells.push(cell);
        }
        if (c.value && c.value.length) {
          if (cell.byte < 0) cell.byte = c.value[0];
          cell.len += c.value.length;
        }
        if (!c.valueSize) cell.done = true;
        if (c.commitRow) rows.push(row);
      }
    });
    s.on('error', e => resolve({err: e}));
    s.on('end', () => resolve({rows}));
  });
}

const describe = r => r.err ? 'error ' + r.err.code + ' ' + (r.err.details || r.err.message)
                            : JSON.stringify(r.rows.map(x => [x.key, x.cells.map(c => [c.ts, c.len])]));

// The newest version of b, alone, between a and c (in the order asked for).
function latestOnly(r, keys) {
  if (r.err || r.rows.map(x => x.key).join(' ') !== keys) return false;
  const b = r.rows.find(x => x.key === 'b');
  return b.cells.length === 1 && b.cells[0].ts === VERSIONS * 1000 &&
         b.cells[0].len === VALUE_BYTES && b.cells[0].byte === versionByte(VERSIONS);
}

async function setup() {
  await admin.deleteTable({name: TN}).catch(() => {});
  await admin.createTable({parent: INST, tableId: T, table: {columnFamilies: {cf: {}}}});
  const set = (q, v, ts) => ({setCell: {familyName: 'cf', columnQualifier: B(q), timestampMicros: ts, value: v}});
  for (const k of ['a', 'c']) await data.mutateRow({tableName: TN, rowKey: B(k), mutations: [set('q', B('small'), 1000)]});
  for (let i = 1; i <= VERSIONS; i++)
    await data.mutateRow({tableName: TN, rowKey: B('b'),
                          mutations: [set('q', Buffer.alloc(VALUE_BYTES, versionByte(i)), i * 1000)]});
}

async function main() {
  await setup();
  let r = await readRows({cellsPerColumnLimitFilter: 1});
  check('cells_per_column_limit 1 returns the newest version', latestOnly(r, 'a b c'), describe(r));
  r = await readRows({chain: {filters: [{columnQualifierRegexFilter: B('q')}, {cellsPerColumnLimitFilter: 1}]}});
  check('qualifier then cells_per_column_limit 1', latestOnly(r, 'a b c'), describe(r));
  r = await readRows({cellsPerRowLimitFilter: 1});
  check('cells_per_row_limit 1 returns the first cell', latestOnly(r, 'a b c'), describe(r));
  r = await readRows({cellsPerColumnLimitFilter: 1}, true);
  check('reversed cells_per_column_limit 1', latestOnly(r, 'c b a'), describe(r));

  const t = bt.instance('i').table(T);
  t.maxRetries = 0;
  for (const [name, filter] of [['keys-only scan', [{row: {cellLimit: 1}}, {value: {strip: true}}]],
                                ['latest of every column', {column: {cellLimit: 1}}]]) {
    try {
      const [rows] = await t.getRows({filter});
      check(name + ' (Table.getRows)', rows.map(x => x.id).join(' ') === 'a b c',
            rows.map(x => x.id).join(' '));
    } catch (e) {
      check(name + ' (Table.getRows)', false, 'error ' + e.code + ' ' + (e.details || e.message));
    }
  }

  // The limit first, then a filter that needs the whole row: only the kept version is held.
  r = await readRows({chain: {filters: [{cellsPerColumnLimitFilter: 1},
                                        {interleave: {filters: [{passAllFilter: true}, {stripValueTransformer: true}]}}]}});
  const b = r.rows && r.rows.find(x => x.key === 'b');
  check('cells_per_column_limit 1 then an interleave',
        b && b.cells.length === 2 && b.cells.every(c => c.ts === VERSIONS * 1000) &&
        b.cells.map(c => c.len).sort((x, y) => x - y).join() === '0,' + VALUE_BYTES, describe(r));

  // Without a filter the row is over the limit: Cloud Bigtable's error, the size returned.
  r = await readRows(null);
  const msg = r.err ? (r.err.details || r.err.message) : '';
  check('no filter: FAILED_PRECONDITION with the returned size',
        r.err && r.err.code === 9 &&
        /Read returned 2[5-7][0-9]MiB from row 'b' which exceeds the limit of 256MiB\. Make sure you are setting an appropriate request filter/.test(msg),
        describe(r));
  // A filter that needs the whole raw row cannot read it, and the message says why.
  r = await readRows({interleave: {filters: [{cellsPerColumnLimitFilter: 1}, {stripValueTransformer: true}]}});
  const msg2 = r.err ? (r.err.details || r.err.message) : '';
  check('interleave over the raw row: FAILED_PRECONDITION naming the filter',
        r.err && r.err.code === 9 && /row 'b' holds more than 256MiB for the row filter's interleave/.test(msg2),
        describe(r));
  await admin.deleteTable({name: TN}).catch(() => {});
}

main().then(() => process.exit(failed ? 1 : 0), e => {
  console.log('FAIL unexpected: ' + (e.stack || e));
  process.exit(1);
});
