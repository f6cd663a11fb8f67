// sweep_client.js — differential sweep of the data API's edges: the same sequence of calls
// (row ranges and row sets, filters, every mutation kind, CheckAndMutateRow,
// ReadModifyWriteRow, SampleRowKeys, MutateRows with a failing entry) goes through the
// official Node.js client's generated clients to two servers, Strata (argv[2]) and the
// official emulator (argv[3]) — BIGTABLE_EMULATOR_HOST is set to each address before its
// client is made — and the answers are compared: rows, cells, timestamps, labels and status
// codes (never message text).
//
// Where the emulator is known to differ from Cloud Bigtable, the case lists Cloud Bigtable's
// answer in DIFFERENCES: Strata must give exactly that answer, and the emulator's answer is
// printed but not compared (docs/bigtable.md, "Where Strata and the emulator differ", says why
// each is Cloud Bigtable's). With argv[3] = "-" only Strata runs, checked against those answers
// only. SWEEP_ONLY=REGEX runs the cases whose names match; SWEEP_VERBOSE=1 prints each answer.
//
// Output: `ok NAME`, `known NAME (RULE): strata ... emulator ...` or `FAIL NAME: ...`; exit 1
// when a case failed. Timestamps the server picks (SetCell -1, ReadModifyWriteRow) are checked
// to be multiples of 1000 within an hour of the local clock and shown as "now".
'use strict';
const {Bigtable, v2} = require('@google-cloud/bigtable');

const INST = 'projects/p/instances/i';
const TN = t => INST + '/tables/' + t;
const B = s => Buffer.from(s, 'latin1');
const NOW_US = Date.now() * 1000;
const HOUR_US = 3600e6;
// No retries: a status is seen as the server sent it. (Without retryRequestOptions the client
// holds a streaming call's error for about 7 s.)
const NO_RETRY = {retry: null, retryRequestOptions: {retries: 0, noResponseRetries: 0}};
// FeatureFlags{reverse_scans: true} (field 1, varint 1), as newer clients announce it.
const REVERSE = Object.assign({otherArgs: {headers: {'bigtable-features':
  Buffer.from([8, 1]).toString('base64')}}}, NO_RETRY);

// ---- clients --------------------------------------------------------------------------------

function side(addr) {
  process.env.BIGTABLE_EMULATOR_HOST = addr;
  const bt = new Bigtable({projectId: 'p'});
  return {addr, data: new v2.BigtableClient(bt.options.BigtableClient),
    admin: new v2.BigtableTableAdminClient(bt.options.BigtableTableAdminClient)};
}

// ---- canonical answers ----------------------------------------------------------------------

function show(b) {
  const buf = Buffer.isBuffer(b) ? b : Buffer.from(b || '');
  return [...buf].every(c => c >= 0x20 && c < 0x7f) ? buf.toString('latin1')
    : '0x' + buf.toString('hex');
}

function ts(t) {
  const n = Number(t);
  if (n > NOW_US - HOUR_US && n < NOW_US + HOUR_US && n % 1000 === 0) return 'now';
  return String(t);
}

// A cell as "fam:qual@ts=value[labels]".
function cellStr(f, q, t, v, labels) {
  const l = labels && labels.length ? '[' + labels.join(',') + ']' : '';
  return f + ':' + show(q) + '@' + ts(t) + '=' + show(v) + l;
}

// Runs of cells of one column and timestamp (only an interleave makes them; their order is
// unspecified) are sorted.
function canonCells(cells) {
  const out = [];
  let run = [];
  const flush = () => { out.push(...run.sort()); run = []; };
  for (const c of cells) {
    const col = c.slice(0, c.indexOf('='));
    if (run.length && run[0].slice(0, run[0].indexOf('=')) !== col) flush();
    run.push(c);
  }
  flush();
  return out;
}

const clip = s => (s.length > 400 ? s.slice(0, 400) + '...' : s);
const codeOf = e => (typeof e.code === 'number' ? 'code ' + e.code : 'error ' + e.message);

// ReadRows through the generated client: "key: cells" per row, or the status code. Values
// split over chunks are joined; reset_row drops the row. `raw` keeps the order of an
// interleave's duplicates as sent.
function readRows(s, table, req, opts, raw) {
  return new Promise(resolve => {
    const rows = [];
    let row = null;
    let fam;
    let qual;
    let cell = null;
    const st = s.data.readRows(Object.assign({tableName: TN(table)}, req), opts || NO_RETRY);
    st.on('data', r => {
      for (const c of r.chunks) {
        if (c.resetRow) { row = null; cell = null; continue; }
        if (!row) row = {k: c.rowKey, cells: []};
        if (c.familyName) fam = c.familyName.value;
        if (c.qualifier) qual = c.qualifier.value;
        if (!cell) cell = {f: fam, q: qual, t: c.timestampMicros, l: c.labels, v: []};
        cell.v.push(Buffer.from(c.value || []));
        if (!(+c.valueSize > 0)) {
          row.cells.push(cellStr(cell.f, cell.q, cell.t, Buffer.concat(cell.v), cell.l));
          cell = null;
        }
        if (c.commitRow) {
          rows.push(show(row.k) + ': ' + (raw ? row.cells : canonCells(row.cells)).join(' '));
          row = null;
        }
      }
    });
    st.on('error', e => resolve(codeOf(e)));
    st.on('end', () => resolve(rows));
  });
}

const call = p => p.then(r => r, e => codeOf(e));

function mutateRows(s, table, entries) {
  return new Promise(resolve => {
    const codes = new Array(entries.length).fill('none');
    const st = s.data.mutateRows({tableName: TN(table), entries}, NO_RETRY);
    st.on('data', r => { for (const e of r.entries) codes[+e.index] = e.status.code; });
    st.on('error', e => resolve(codeOf(e)));
    st.on('end', () => resolve(codes));
  });
}

// ---- mutations ------------------------------------------------------------------------------

const set = (f, q, v, t) => ({setCell: {familyName: f, columnQualifier: B(q), value: B(v),
  timestampMicros: t}});
const delCol = (f, q, range) => ({deleteFromColumn: {familyName: f, columnQualifier: B(q),
  timeRange: range}});
const delFam = f => ({deleteFromFamily: {familyName: f}});
const delRow = () => ({deleteFromRow: {}});
const ctr = n => { const b = Buffer.alloc(8); b.writeBigInt64BE(BigInt(n)); return b; };
const setRaw = (f, q, v, t) => ({setCell: {familyName: f, columnQualifier: B(q), value: v,
  timestampMicros: t}});

async function mutate(s, table, key, mutations) {
  return call(s.data.mutateRow({tableName: TN(table), rowKey: B(key), mutations}, NO_RETRY)
    .then(() => 'OK'));
}

// A table whose families are created one by one in the order given (the emulator orders a
// row's families by creation, Cloud Bigtable and Strata by name: the same when created in name
// order).
async function makeTable(s, id, fams, splits) {
  await s.admin.deleteTable({name: TN(id)}).catch(() => {});
  await s.admin.createTable({parent: INST, tableId: id, table: {},
    initialSplits: (splits || []).map(k => ({key: B(k)}))});
  for (const f of fams) {
    await s.admin.modifyColumnFamilies({name: TN(id), modifications: [{id: f, create: {}}]});
  }
}

// ---- the data read by the read and filter cases ---------------------------------------------

const R = 'sweep_r';
// Tablet boundaries of table R on Strata, so reads cross them (the emulator has none).
const R_SPLITS = ['b', 'c', 'c\x00', 'e'];
const R_ROWS = [
  ['a', [set('cf1', 'q1', 'v1', 1000), set('cf1', 'q1', 'v2', 2000), set('cf1', 'q2', '', 1000),
    set('cf2', '', 'e', 3000), set('cf3', 'q1', 'v9', 1000)]],
  ['b', [set('cf1', 'q1', 'abc', 5000), set('cf2', 'q3', 'zz', 1000), set('cf2', 'q3', 'zero', 0)]],
  ['ba', [set('cf1', 'q1', 'b1', 1000)]],
  ['bb', [set('cf2', 'q1', 'b2', 1000)]],
  ['c', [set('cf1', 'a', '1', 1000), set('cf1', 'b', '2', 1000), set('cf1', 'c', '3', 1000),
    set('cf2', 'a', '4', 1000), set('cf2', 'b', '5', 1000), set('cf3', 'a', '6', 1000)]],
  ['c\x00', [set('cf1', 'q', 'x', 1000)]],
  ['d', [set('cf3', 'q', 'dd', 7000)]],
  ['e', [set('cf1', 'q', 'e1', 1000), set('cf1', 'q', 'v1\nv2', 2000)]],
  ['\xff', [set('cf1', 'q', 'ff', 1000)]],
];

async function setup(s) {
  await makeTable(s, R, ['cf1', 'cf2', 'cf3'], R_SPLITS);
  for (const [k, m] of R_ROWS) await s.data.mutateRow({tableName: TN(R), rowKey: B(k), mutations: m});
  await makeTable(s, M, ['cf1', 'cf2'], ['b5', 'c', 'm2', 'w']);
  await makeTable(s, EMPTY, ['cf1']);
}

// ---- the cases ------------------------------------------------------------------------------

const CASES = [];
const rr = o => {
  const r = {};
  for (const [k, v] of Object.entries(o)) r[k] = B(v);
  return r;
};
// A read of table R with the row set {keys, ranges}.
function rowsCase(name, keys, ranges, extra) {
  CASES.push([name, s => readRows(s, R, Object.assign({rows: {rowKeys: (keys || []).map(B),
    rowRanges: (ranges || []).map(rr)}}, extra || {}), extra && extra.reversed ? REVERSE : null)]);
}
function filterCase(name, filter, keys) {
  CASES.push([name, s => readRows(s, R, {filter, rows: {rowKeys: (keys || []).map(B)}})]);
}

// Row ranges: bounds of every kind, empty keys, empty and reversed ranges.
rowsCase('range/all', [], []);
rowsCase('range/no_bounds', [], [{}]);
rowsCase('range/start_closed', [], [{startKeyClosed: 'b'}]);
rowsCase('range/start_open_end_open', [], [{startKeyOpen: 'b', endKeyOpen: 'd'}]);
rowsCase('range/start_closed_end_closed', [], [{startKeyClosed: 'b', endKeyClosed: 'c'}]);
rowsCase('range/end_open_only', [], [{endKeyOpen: 'c'}]);
rowsCase('range/end_closed_only', [], [{endKeyClosed: 'c'}]);
rowsCase('range/empty_start_closed', [], [{startKeyClosed: '', endKeyOpen: 'b'}]);
rowsCase('range/empty_start_open', [], [{startKeyOpen: '', endKeyOpen: 'b'}]);
rowsCase('range/empty_end_open', [], [{startKeyClosed: 'd', endKeyOpen: ''}]);
rowsCase('range/empty_end_closed', [], [{startKeyClosed: 'd', endKeyClosed: ''}]);
rowsCase('range/empty_both_closed', [], [{startKeyClosed: '', endKeyClosed: ''}]);
rowsCase('range/start_after_end', [], [{startKeyClosed: 'c', endKeyOpen: 'b'}]);
rowsCase('range/start_after_end_closed', [], [{startKeyOpen: 'c', endKeyClosed: 'b'}]);
rowsCase('range/one_key_closed', [], [{startKeyClosed: 'b', endKeyClosed: 'b'}]);
rowsCase('range/same_key_half_open', [], [{startKeyClosed: 'b', endKeyOpen: 'b'}]);
rowsCase('range/same_key_open_closed', [], [{startKeyOpen: 'b', endKeyClosed: 'b'}]);
rowsCase('range/same_key_open_open', [], [{startKeyOpen: 'b', endKeyOpen: 'b'}]);
rowsCase('range/open_to_successor', [], [{startKeyOpen: 'c', endKeyOpen: 'c\x00'}]);
rowsCase('range/closed_to_successor', [], [{startKeyClosed: 'c', endKeyOpen: 'c\x00'}]);
rowsCase('range/open_start_ff', [], [{startKeyOpen: 'e'}]);
rowsCase('range/overlapping', [], [{startKeyClosed: 'a', endKeyOpen: 'c'},
  {startKeyClosed: 'b', endKeyOpen: 'd'}]);
rowsCase('range/touching', [], [{startKeyClosed: 'a', endKeyOpen: 'b'},
  {startKeyClosed: 'b', endKeyOpen: 'c'}]);
rowsCase('range/nested_unordered', [], [{startKeyClosed: 'd'}, {startKeyClosed: 'a', endKeyOpen: 'b'},
  {startKeyOpen: 'd', endKeyClosed: 'e'}]);
rowsCase('range/one_valid_one_reversed', [], [{startKeyClosed: 'a', endKeyOpen: 'b'},
  {startKeyClosed: 'e', endKeyOpen: 'd'}]);
rowsCase('range/split_keys_open', [], [{startKeyOpen: 'b', endKeyOpen: 'c\x00'}]);
rowsCase('range/split_keys_closed', [], [{startKeyClosed: 'c', endKeyClosed: 'c\x00'}]);
rowsCase('range/split_key_closed_end', [], [{startKeyOpen: 'c\x00', endKeyClosed: 'e'}]);
rowsCase('reversed/split_keys', [], [{startKeyOpen: 'b', endKeyClosed: 'e'}], {reversed: true,
  rowsLimit: 4});
rowsCase('reversed/split_keys_filtered', [], [{startKeyClosed: 'b', endKeyClosed: 'e'}],
  {reversed: true, rowsLimit: 2, filter: {familyNameRegexFilter: 'cf1'}});
rowsCase('range/start_open_ff', [], [{startKeyOpen: '\xff'}]);
rowsCase('keys/duplicates', ['b', 'b', 'a'], []);
rowsCase('keys/missing', ['zz', 'b0'], []);
rowsCase('keys/empty_key', [''], []);
rowsCase('keys/empty_key_and_row', ['', 'd'], []);
rowsCase('keys/nul_and_ff', ['c\x00', '\xff'], []);
rowsCase('keys_ranges/overlap', ['b', 'e', 'zz'], [{startKeyClosed: 'a', endKeyClosed: 'ba'}]);
rowsCase('keys/too_long', ['k'.repeat(4097)], []);
rowsCase('range/duplicate_ranges', [], [{startKeyClosed: 'a', endKeyOpen: 'b'},
  {startKeyClosed: 'a', endKeyOpen: 'b'}]);
rowsCase('profile/missing', ['a'], [], {appProfileId: 'nope'});
rowsCase('profile/default_by_name', ['a'], [], {appProfileId: 'default'});
rowsCase('limit/2', [], [], {rowsLimit: 2});
rowsCase('limit/over_rows', [], [], {rowsLimit: 100});
rowsCase('limit/negative', [], [], {rowsLimit: -1});
rowsCase('limit/keys', ['e', 'a', 'c'], [], {rowsLimit: 2});
rowsCase('limit/filtered_out_rows', [], [], {rowsLimit: 2,
  filter: {familyNameRegexFilter: 'cf3'}});
rowsCase('reversed/all', [], [], {reversed: true});
rowsCase('reversed/limit', [], [], {reversed: true, rowsLimit: 3});
rowsCase('reversed/ranges_limit', [], [{startKeyClosed: 'a', endKeyClosed: 'b'},
  {startKeyClosed: 'd'}], {reversed: true, rowsLimit: 3});
rowsCase('reversed/keys_duplicates', ['b', 'a', 'b', 'zz'], [], {reversed: true});
rowsCase('reversed/keys_and_range', ['e'], [{startKeyOpen: 'b', endKeyClosed: 'c'}],
  {reversed: true, rowsLimit: 4});
rowsCase('reversed/filter_limit', [], [], {reversed: true, rowsLimit: 1,
  filter: {familyNameRegexFilter: 'cf3'}});
rowsCase('reversed/cells_per_column_limit', ['a', 'e'], [], {reversed: true,
  filter: {cellsPerColumnLimitFilter: 1}});
rowsCase('reversed/row_limit_one_family', ['a', 'c'], [], {reversed: true,
  filter: {chain: {filters: [{familyNameRegexFilter: 'cf1'}, {cellsPerRowLimitFilter: 2}]}}});
rowsCase('reversed/empty_range', [], [{startKeyClosed: 'b', endKeyOpen: 'b'}], {reversed: true});
rowsCase('reversed/empty_end_closed', [], [{startKeyClosed: 'd', endKeyClosed: ''}],
  {reversed: true});

// Filters.
const chain = (...filters) => ({chain: {filters}});
const inter = (...filters) => ({interleave: {filters}});
const label = l => ({applyLabelTransformer: l});
const fam = r => ({familyNameRegexFilter: r});
const qre = r => ({columnQualifierRegexFilter: B(r)});
const vre = r => ({valueRegexFilter: B(r)});
const colRange = (f, o) => ({columnRangeFilter: Object.assign({familyName: f}, rr(o))});
const valRange = o => ({valueRangeFilter: rr(o)});
const tsRange = (start, end) => ({timestampRangeFilter: {startTimestampMicros: start,
  endTimestampMicros: end}});
const cond = (predicateFilter, trueFilter, falseFilter) => ({condition: {predicateFilter,
  trueFilter, falseFilter}});
const STRIP = {stripValueTransformer: true};
const PASS = {passAllFilter: true};
const BLOCK = {blockAllFilter: true};

filterCase('filter/chain_family_label', chain(fam('cf1'), label('la')));
filterCase('filter/interleave_labels', inter(chain(fam('cf1'), label('la')),
  chain(qre('q1'), label('lb'))));
filterCase('filter/interleave_pass_twice', inter(PASS, PASS), ['b']);
filterCase('filter/interleave_in_chain_labels', chain(qre('q.*'), inter(label('x'),
  chain(fam('cf2'), label('y')))));
filterCase('filter/chain_label_then_interleave', chain(label('la'), inter(fam('cf1'), fam('cf2'))));
filterCase('filter/cells_per_row_offset_families', {cellsPerRowOffsetFilter: 2}, ['c']);
filterCase('filter/cells_per_row_limit_families', {cellsPerRowLimitFilter: 4}, ['c']);
filterCase('filter/offset_then_limit_families', chain({cellsPerRowOffsetFilter: 1},
  {cellsPerRowLimitFilter: 3}), ['c', 'a']);
filterCase('filter/limit_then_offset', chain({cellsPerRowLimitFilter: 3},
  {cellsPerRowOffsetFilter: 1}), ['a']);
filterCase('filter/offset_one_family', chain(fam('cf1'), {cellsPerRowOffsetFilter: 1}));
filterCase('filter/offset_zero', {cellsPerRowOffsetFilter: 0}, ['a']);
filterCase('filter/offset_negative', {cellsPerRowOffsetFilter: -1}, ['a']);
filterCase('filter/row_limit_zero', {cellsPerRowLimitFilter: 0}, ['a']);
filterCase('filter/column_limit_one', {cellsPerColumnLimitFilter: 1});
filterCase('filter/column_limit_zero', {cellsPerColumnLimitFilter: 0});
filterCase('filter/col_range_family_only', colRange('cf1', {}));
filterCase('filter/col_range_missing_family', colRange('nope', {}));
filterCase('filter/col_range_no_family', colRange('', {startQualifierClosed: 'a'}));
filterCase('filter/col_range_empty_start_closed', colRange('cf2', {startQualifierClosed: '',
  endQualifierOpen: 'b'}));
filterCase('filter/col_range_empty_start_open', colRange('cf2', {startQualifierOpen: '',
  endQualifierOpen: 'b'}));
filterCase('filter/col_range_empty_end_open', colRange('cf2', {startQualifierClosed: 'a',
  endQualifierOpen: ''}));
filterCase('filter/col_range_empty_end_closed', colRange('cf2', {startQualifierClosed: '',
  endQualifierClosed: ''}));
filterCase('filter/col_range_closed_closed', colRange('cf1', {startQualifierClosed: 'a',
  endQualifierClosed: 'b'}));
filterCase('filter/col_range_open_open', colRange('cf1', {startQualifierOpen: 'a',
  endQualifierOpen: 'c'}));
filterCase('filter/col_range_open_closed_same', colRange('cf1', {startQualifierOpen: 'b',
  endQualifierClosed: 'b'}));
filterCase('filter/col_range_reversed', colRange('cf1', {startQualifierClosed: 'c',
  endQualifierClosed: 'a'}));
filterCase('filter/val_range_all', valRange({}));
filterCase('filter/val_range_empty_start_closed', valRange({startValueClosed: '',
  endValueOpen: 'b'}));
filterCase('filter/val_range_empty_start_open', valRange({startValueOpen: '', endValueOpen: 'b'}));
filterCase('filter/val_range_empty_end_open', valRange({startValueClosed: 'v', endValueOpen: ''}));
filterCase('filter/val_range_empty_end_closed', valRange({endValueClosed: ''}));
filterCase('filter/val_range_closed_closed', valRange({startValueClosed: 'v1',
  endValueClosed: 'v2'}));
filterCase('filter/val_range_open_open', valRange({startValueOpen: 'v1', endValueOpen: 'v9'}));
filterCase('filter/val_range_reversed', valRange({startValueClosed: 'v9', endValueClosed: 'v1'}));
filterCase('filter/val_range_same_open', valRange({startValueOpen: 'zz', endValueClosed: 'zz'}));
filterCase('filter/ts_range_zero_zero', tsRange(0, 0));
filterCase('filter/ts_range_start_only', tsRange(2000, 0));
filterCase('filter/ts_range_end_only', tsRange(0, 2000));
filterCase('filter/ts_range_empty', tsRange(1000, 1000));
filterCase('filter/ts_range_reversed', tsRange(3000, 1000));
filterCase('filter/ts_range_not_millis', tsRange(1500, 2500));
filterCase('filter/ts_range_negative', tsRange(-1000, 2000));
filterCase('filter/pass_all', PASS, ['a']);
filterCase('filter/duplicates_then_column_limit', chain(inter(PASS, PASS),
  {cellsPerColumnLimitFilter: 1}), ['e']);
filterCase('filter/duplicates_then_row_limit', chain(inter(PASS, PASS),
  {cellsPerRowLimitFilter: 3}), ['e']);
filterCase('filter/duplicates_then_row_offset', chain(inter(PASS, PASS),
  {cellsPerRowOffsetFilter: 1}), ['e']);
filterCase('filter/interleave_block_pass', inter(BLOCK, PASS), ['b']);
filterCase('filter/chain_pass_block', chain(PASS, BLOCK), ['b']);
filterCase('filter/label_then_strip', chain(label('la'), STRIP), ['b']);
filterCase('filter/cond_offset_predicate', cond({cellsPerRowOffsetFilter: 5}, label('many'),
  label('few')), ['a', 'b']);
filterCase('filter/block_all', BLOCK);
filterCase('filter/empty_filter', {}, ['a']);
filterCase('filter/sink_label', chain(label('la'), {sink: true}), ['b']);
filterCase('filter/sink_in_interleave', inter(chain(fam('cf2'), {sink: true}),
  chain(fam('cf1'), label('x'))), ['b']);
filterCase('filter/cond_both_branches', cond(qre('q2'), label('t'), label('f')));
filterCase('filter/cond_true_only', cond(fam('cf3'), PASS));
filterCase('filter/cond_false_only', cond(fam('cf3'), undefined, STRIP));
filterCase('filter/cond_no_branches', cond(fam('cf3')));
filterCase('filter/cond_predicate_labels', cond(chain(fam('cf1'), label('p')), fam('cf2')));
filterCase('filter/cond_predicate_block', cond(BLOCK, PASS, label('no')));
filterCase('filter/cond_in_chain_with_label', chain(label('outer'),
  cond(qre('q1'), fam('cf1'), BLOCK)));
filterCase('filter/strip_then_value_regex_empty', chain(STRIP, vre('')));
filterCase('filter/value_regex_then_strip', chain(vre('v.*'), STRIP));
filterCase('filter/value_regex_empty', vre(''));
filterCase('filter/value_regex_newline', vre('v1.v2'));
filterCase('filter/value_regex_any_byte', vre('v1(?s:.)v2'));
filterCase('filter/strip_then_label', chain(STRIP, label('s')), ['a']);
filterCase('filter/qualifier_regex_empty', qre(''));
filterCase('filter/row_regex_nul', {rowKeyRegexFilter: B('c\\x00')});
filterCase('filter/row_regex_ff', {rowKeyRegexFilter: B('\\xff')});
filterCase('filter/bad_row_regex', {rowKeyRegexFilter: B('(')});
filterCase('filter/bad_family_regex', fam('['));
filterCase('filter/bad_qualifier_regex', qre('a**'));
filterCase('filter/bad_value_regex', vre('[z-a]'));
filterCase('filter/bad_regex_in_condition', cond(PASS, vre('(')), ['a']);
filterCase('filter/empty_family_regex', fam(''), ['a']);
filterCase('filter/label_empty', label(''), ['a']);
filterCase('filter/label_too_long', label('abcdefghijklmnop'), ['a']);
filterCase('filter/label_upper', label('A'), ['a']);
filterCase('filter/row_sample_one', {rowSampleFilter: 1}, ['a']);
filterCase('filter/row_sample_zero', {rowSampleFilter: 0}, ['a']);
// A filter is validated whole before any row is read, also where no row reaches it (the
// emulator checks only what it evaluates on a row).
filterCase('filter/row_sample_one_unreached', chain(BLOCK, {rowSampleFilter: 1}), ['a']);
filterCase('filter/row_sample_zero_untaken_branch', cond(BLOCK, {rowSampleFilter: 0}, PASS),
  ['a']);
filterCase('filter/two_labels_in_chain', chain(label('la'), label('lb')), ['a']);
// A predicate's labels never reach the output, however deep; a branch's label followed by
// strip_value does (a random filter of this shape looked like a predicate's label leaking).
filterCase('filter/cond_nested_predicate_labels', cond(cond(label('p1'),
  chain(qre('q1'), label('p2'))), qre('q1'), label('f')), ['a', 'b']);
filterCase('filter/cond_branch_label_then_strip', cond(BLOCK, label('t'),
  chain(label('f'), STRIP)), ['b']);

// Mutations: each case writes its own row of table M, then reads it back.
const M = 'sweep_m';
const EMPTY = 'sweep_empty';
const readRow = (s, key) => readRows(s, M, {rows: {rowKeys: [B(key)]}});
function mutCase(name, key, steps) {
  CASES.push([name, async s => {
    const out = [];
    for (const m of steps) out.push(await mutate(s, M, key, m));
    out.push(await readRow(s, key));
    return out;
  }]);
}
const FOUR = [set('cf1', 'q', 'v1', 1000), set('cf1', 'q', 'v2', 2000), set('cf1', 'q', 'v3', 3000),
  set('cf1', 'q', 'v4', 4000), set('cf2', 'q', 'w', 1000)];
mutCase('mut/server_time', 'm1', [[set('cf1', 'q', 'v', -1)]]);
mutCase('mut/server_time_twice', 'm1b', [[set('cf1', 'q', 'a', -1), set('cf1', 'r', 'b', -1)]]);
mutCase('mut/ts_not_millis', 'm2', [[set('cf1', 'q', 'v', 1500)]]);
mutCase('mut/ts_negative', 'm3', [[set('cf1', 'q', 'v', -2000)]]);
mutCase('mut/ts_minus_1000', 'm3b', [[set('cf1', 'q', 'v', -1000)]]);
mutCase('mut/ts_unset', 'm4', [[{setCell: {familyName: 'cf1', columnQualifier: B('q'),
  value: B('v')}}]]);
mutCase('mut/ts_large', 'm4b', [[set('cf1', 'q', 'v', '9000000000000000')]]);
mutCase('mut/empty_qualifier_and_value', 'm5', [[set('cf1', '', '', 1000)]]);
mutCase('mut/replace_same_ts', 'm5b', [[set('cf1', 'q', 'old', 1000)], [set('cf1', 'q', 'new', 1000)]]);
mutCase('mut/del_col_range', 'm6', [FOUR, [delCol('cf1', 'q', {startTimestampMicros: 2000,
  endTimestampMicros: 4000})]]);
mutCase('mut/del_col_zero_zero', 'm7', [FOUR, [delCol('cf1', 'q', {startTimestampMicros: 0,
  endTimestampMicros: 0})]]);
mutCase('mut/del_col_start_only', 'm8', [FOUR, [delCol('cf1', 'q', {startTimestampMicros: 2000})]]);
mutCase('mut/del_col_end_only', 'm9', [FOUR, [delCol('cf1', 'q', {endTimestampMicros: 3000})]]);
mutCase('mut/del_col_no_range', 'm10', [FOUR, [delCol('cf1', 'q')]]);
mutCase('mut/del_col_empty_range', 'm11', [FOUR, [delCol('cf1', 'q', {startTimestampMicros: 2000,
  endTimestampMicros: 2000})]]);
mutCase('mut/del_col_reversed', 'm12', [FOUR, [delCol('cf1', 'q', {startTimestampMicros: 3000,
  endTimestampMicros: 2000})]]);
mutCase('mut/del_col_not_millis', 'm13', [FOUR, [delCol('cf1', 'q', {startTimestampMicros: 1500,
  endTimestampMicros: 3500})]]);
mutCase('mut/del_col_negative', 'm13b', [FOUR, [delCol('cf1', 'q', {startTimestampMicros: -1000,
  endTimestampMicros: 2000})]]);
mutCase('mut/del_col_missing_column', 'm14', [FOUR, [delCol('cf1', 'nope')]]);
mutCase('mut/del_col_missing_family', 'm15', [FOUR, [delCol('nope', 'q')]]);
mutCase('mut/del_family_missing', 'm16', [FOUR, [delFam('nope')]]);
mutCase('mut/del_family', 'm17', [FOUR, [delFam('cf1')]]);
mutCase('mut/del_family_empty_name', 'm17b', [FOUR, [delFam('')]]);
mutCase('mut/del_row_missing', 'm18', [[delRow()]]);
mutCase('mut/set_then_del_row', 'm19', [[set('cf1', 'q', 'v', 1000), delRow()]]);
mutCase('mut/del_row_then_set', 'm20', [FOUR, [delRow(), set('cf2', 'q', 'n', 5000)]]);
mutCase('mut/del_family_then_set', 'm21', [FOUR, [delFam('cf1'), set('cf1', 'q', 'n', 1000)]]);
mutCase('mut/set_missing_family', 'm22', [[set('nope', 'q', 'v', 1000)]]);
mutCase('mut/set_empty_family', 'm22b', [[set('', 'q', 'v', 1000)]]);
mutCase('mut/one_bad_among_good', 'm23', [[set('cf1', 'q', 'v', 1000), set('nope', 'q', 'v', 1000)]]);
mutCase('mut/empty_mutation', 'm24', [[{}]]);
mutCase('mut/set_then_del_col', 'm26', [[set('cf1', 'q', 'v', 1000), delCol('cf1', 'q')]]);
mutCase('mut/del_col_then_set', 'm27', [FOUR, [delCol('cf1', 'q'), set('cf1', 'q', 'n', 1000)]]);
mutCase('mut/set_twice_same_cell', 'm28', [[set('cf1', 'q', 'a', 1000), set('cf1', 'q', 'b', 1000)]]);
mutCase('mut/server_time_then_del', 'm29', [[set('cf1', 'q', 'v', -1), delCol('cf1', 'q',
  {startTimestampMicros: 1000})]]);
mutCase('mut/server_time_over_explicit', 'm30', [[set('cf1', 'q', 'x', '9000000000000000')],
  [set('cf1', 'q', 'v', -1)]]);
mutCase('mut/qualifier_16k_plus_1', 'm31', [[set('cf1', 'x'.repeat(16385), 'v', 1000)]]);
mutCase('mut/row_key_4k_plus_1', 'k'.repeat(4097), [[set('cf1', 'q', 'v', 1000)]]);
mutCase('mut/no_mutations', 'm25', [[]]);
mutCase('mut/empty_row_key', '', [[set('cf1', 'q', 'v', 1000)]]);
// A 3 MiB value comes back whole (split over chunks; the reader joins them); shown by size.
CASES.push(['mut/value_3mib', async s => {
  const v = Buffer.alloc(3 << 20, 'v');
  const w = await mutate(s, M, 'big', [setRaw('cf1', 'q', v, 1000), set('cf1', 'r', 's', 1000)]);
  const back = await readRows(s, M, {rows: {rowKeys: [B('big')]}}, REVERSE);
  return [w, Array.isArray(back) ? back.map(r => r.replace(/=(v{1000,})/, (_, x) => '=' + x.length + ' x v'))
    : back];
}]);
CASES.push(['mut/other_instance', s => call(s.data.mutateRow({tableName:
  'projects/p/instances/other/tables/' + M, rowKey: B('k'), mutations: [set('cf1', 'q', 'v', 1000)]},
NO_RETRY).then(() => 'OK'))]);
CASES.push(['mut/malformed_table_name', s => call(s.data.mutateRow({tableName: INST + '/tables/',
  rowKey: B('k'), mutations: [set('cf1', 'q', 'v', 1000)]}, NO_RETRY).then(() => 'OK'))]);
CASES.push(['mut/missing_table', s => call(s.data.mutateRow({tableName: TN('nope'),
  rowKey: B('k'), mutations: [set('cf1', 'q', 'v', 1000)]}, NO_RETRY).then(() => 'OK'))]);

// CheckAndMutateRow.
function camCase(name, key, seed, req) {
  CASES.push([name, async s => {
    const out = [];
    if (seed) out.push(await mutate(s, M, key, seed));
    out.push(await call(s.data.checkAndMutateRow(Object.assign({tableName: TN(M), rowKey: B(key)},
      req), NO_RETRY).then(([r]) => 'matched=' + r.predicateMatched)));
    out.push(await readRow(s, key));
    return out;
  }]);
}
const SEED = [set('cf1', 'q', 'seed', 1000)];
camCase('cam/predicate_true', 'c1', SEED, {predicateFilter: qre('q'),
  trueMutations: [set('cf1', 't', 'T', 1000)], falseMutations: [set('cf1', 'f', 'F', 1000)]});
camCase('cam/predicate_false', 'c2', SEED, {predicateFilter: qre('x'),
  trueMutations: [set('cf1', 't', 'T', 1000)], falseMutations: [set('cf1', 'f', 'F', 1000)]});
camCase('cam/no_predicate_row_exists', 'c3', SEED, {trueMutations: [delRow()]});
camCase('cam/no_predicate_row_missing', 'c4', null, {trueMutations: [set('cf1', 't', 'T', 1000)],
  falseMutations: [set('cf1', 'f', 'F', 1000)]});
camCase('cam/true_empty_false_set', 'c5', SEED, {predicateFilter: PASS,
  falseMutations: [set('cf1', 'f', 'F', 1000)]});
camCase('cam/false_empty_no_match', 'c6', SEED, {predicateFilter: BLOCK,
  trueMutations: [set('cf1', 't', 'T', 1000)]});
camCase('cam/no_mutations', 'c7', SEED, {predicateFilter: PASS});
camCase('cam/bad_predicate_regex', 'c8', SEED, {predicateFilter: vre('('),
  trueMutations: [set('cf1', 't', 'T', 1000)]});
camCase('cam/missing_family_in_branch', 'c9', SEED, {predicateFilter: PASS,
  trueMutations: [set('nope', 't', 'T', 1000)]});
camCase('cam/missing_family_in_other_branch', 'c10', SEED, {predicateFilter: PASS,
  trueMutations: [set('cf1', 't', 'T', 1000)], falseMutations: [set('nope', 'f', 'F', 1000)]});
camCase('cam/predicate_label_strip', 'c11', SEED, {predicateFilter: chain(STRIP, label('l')),
  trueMutations: [set('cf1', 't', 'T', -1)]});
camCase('cam/server_time', 'c13', SEED, {predicateFilter: qre('q'),
  trueMutations: [set('cf1', 't', 'T', -1), set('cf1', 'q', 'seed2', -1)]});
camCase('cam/sink_in_predicate', 'c14', SEED, {predicateFilter: chain(PASS, {sink: true}),
  trueMutations: [set('cf1', 't', 'T', 1000)]});
camCase('cam/empty_row_key', '', null, {trueMutations: [set('cf1', 't', 'T', 1000)]});
camCase('cam/ts_not_millis', 'c12', SEED, {predicateFilter: PASS,
  trueMutations: [set('cf1', 't', 'T', 1500)]});

// ReadModifyWriteRow: the answer's cells, then the row.
function rmwCase(name, key, seed, rules) {
  CASES.push([name, async s => {
    const out = [];
    if (seed) out.push(await mutate(s, M, key, seed));
    out.push(await call(s.data.readModifyWriteRow({tableName: TN(M), rowKey: B(key), rules},
      NO_RETRY).then(([r]) => {
      const cells = [];
      for (const f of r.row.families) {
        for (const c of f.columns) {
          for (const cell of c.cells) {
            cells.push(cellStr(f.name, c.qualifier, cell.timestampMicros, cell.value, cell.labels));
          }
        }
      }
      return show(r.row.key) + ': ' + cells.join(' ');
    })));
    out.push(await readRow(s, key));
    return out;
  }]);
}
const app = (f, q, v) => ({familyName: f, columnQualifier: B(q), appendValue: B(v)});
const inc = (f, q, n) => ({familyName: f, columnQualifier: B(q), incrementAmount: n});
rmwCase('rmw/append_missing', 'w1', null, [app('cf1', 'q', 'x')]);
rmwCase('rmw/increment_missing', 'w2', null, [inc('cf1', 'n', 5)]);
rmwCase('rmw/increment_counter', 'w3', [setRaw('cf1', 'n', ctr(41), 1000)], [inc('cf1', 'n', 1)]);
rmwCase('rmw/increment_negative_wrap', 'w4', [setRaw('cf1', 'n', ctr(-9223372036854775808n), 1000)],
  [inc('cf1', 'n', -1)]);
rmwCase('rmw/increment_not_8_bytes', 'w5', [set('cf1', 'n', 'abc', 1000)], [inc('cf1', 'n', 1)]);
rmwCase('rmw/increment_empty_value', 'w5b', [set('cf1', 'n', '', 1000)], [inc('cf1', 'n', 1)]);
rmwCase('rmw/append_to_newest', 'w6', [set('cf1', 'q', 'old', 1000), set('cf1', 'q', 'new', 2000)],
  [app('cf1', 'q', '+')]);
rmwCase('rmw/empty_qualifier', 'w7', null, [app('cf1', '', 'e'), inc('cf2', '', 2)]);
rmwCase('rmw/append_empty', 'w8', [set('cf1', 'q', 'v', 1000)], [app('cf1', 'q', '')]);
rmwCase('rmw/append_empty_missing', 'w8b', null, [app('cf1', 'q', '')]);
rmwCase('rmw/increment_zero', 'w9', [setRaw('cf1', 'n', ctr(7), 1000)], [inc('cf1', 'n', 0)]);
rmwCase('rmw/two_rules_same_cell', 'w10', null, [app('cf1', 'q', 'a'), app('cf1', 'q', 'b'),
  inc('cf1', 'n', 1), inc('cf1', 'n', 2)]);
rmwCase('rmw/future_timestamp', 'w11', [setRaw('cf1', 'n', ctr(1), '9000000000000000')],
  [inc('cf1', 'n', 1)]);
rmwCase('rmw/no_rules', 'w12', null, []);
rmwCase('rmw/rule_without_kind', 'w13', null, [{familyName: 'cf1', columnQualifier: B('q')}]);
rmwCase('rmw/missing_family', 'w14', null, [app('nope', 'q', 'x')]);
rmwCase('rmw/empty_row_key', '', null, [app('cf1', 'q', 'x')]);

// SampleRowKeys.
function sample(s, table) {
  return new Promise(resolve => {
    const out = [];
    const st = s.data.sampleRowKeys({tableName: TN(table)}, NO_RETRY);
    st.on('data', r => out.push(r.rowKey));
    st.on('error', e => resolve(codeOf(e)));
    st.on('end', () => resolve(sampleContract(out)));
  });
}
// Which keys sample a table is the server's choice (Strata: its tablet boundaries; the
// emulator: every few rows): compared is the contract — ascending keys, the last one the empty
// "end of table" key.
function sampleContract(keys) {
  const sorted = keys.every((k, i) => i === 0 || Buffer.compare(keys[i - 1], k) < 0 ||
    (i === keys.length - 1 && k.length === 0));
  const last = keys.length ? keys[keys.length - 1] : null;
  return {sorted, endsWithEmptyKey: last !== null && last.length === 0};
}
CASES.push(['sample/empty_table', s => sample(s, EMPTY)]);
CASES.push(['sample/missing_table', s => sample(s, 'nope')]);

// MutateRows with entries that fail among good ones: per-entry status codes, then the rows.
function bulkCase(name, entries, keys) {
  CASES.push([name, async s => [await mutateRows(s, M, entries),
    await readRows(s, M, {rows: {rowKeys: keys.map(B)}})]]);
}
const entry = (k, m) => ({rowKey: B(k), mutations: m});
bulkCase('bulk/missing_family_entry', [entry('b1', [set('cf1', 'q', 'v', 1000)]),
  entry('b2', [set('nope', 'q', 'v', 1000)]), entry('b3', [set('cf2', 'q', 'v', 1000)])],
['b1', 'b2', 'b3']);
bulkCase('bulk/not_millis_entry', [entry('b4', [set('cf1', 'q', 'v', 1000)]),
  entry('b5', [set('cf1', 'q', 'v', 1500)])], ['b4', 'b5']);
bulkCase('bulk/empty_key_entry', [entry('b6', [set('cf1', 'q', 'v', 1000)]),
  entry('', [set('cf1', 'q', 'v', 1000)])], ['b6']);
bulkCase('bulk/no_mutations_entry', [entry('b7', [set('cf1', 'q', 'v', 1000)]), entry('b8', [])],
  ['b7', 'b8']);
bulkCase('bulk/reversed_delete_entry', [entry('b9', [set('cf1', 'q', 'v', 1000)]),
  entry('b10', [delCol('cf1', 'q', {startTimestampMicros: 3000, endTimestampMicros: 2000})])],
['b9', 'b10']);
bulkCase('bulk/across_tablets', [entry('z1', [set('cf1', 'q', 'v', 1000)]),
  entry('a1', [set('nope', 'q', 'v', 1000)]), entry('m1x', [set('cf1', 'q', 'v', 1000)]),
  entry('b1x', [set('cf1', 'q', 'v', 1500)]), entry('y9', [set('cf2', 'q', 'v', 1000)]),
  entry('c0', [set('cf1', 'q', 'v', 1000)])], ['z1', 'a1', 'm1x', 'b1x', 'y9', 'c0']);
bulkCase('bulk/no_entries', [], ['none']);
bulkCase('bulk/all_entries_fail', [entry('b12', [set('nope', 'q', 'v', 1000)]),
  entry('b13', [set('cf1', 'q', 'v', 1500)])], ['b12', 'b13']);
bulkCase('bulk/server_time_same_row', [entry('b14', [set('cf1', 'q', 'v1', -1)]),
  entry('b15', [set('cf1', 'q', 'v2', -1), set('cf2', 'q', 'v3', -1)])], ['b14', 'b15']);
bulkCase('bulk/same_row_twice', [entry('b11', [set('cf1', 'q', 'v1', 1000)]),
  entry('b11', [set('cf1', 'r', 'v2', 1000)])], ['b11']);
CASES.push(['bulk/missing_table', s => mutateRows(s, 'nope', [entry('k', [set('cf1', 'q', 'v', 1000)])])]);
CASES.push(['sample/rows', s => sample(s, R)]);
// An interleave's copies of one cell over a column of 8 versions, in the order sent: Strata's
// branch order (docs/filters.md); the emulator's order varies (its per-column sort is not stable).
const EIGHT = [1, 2, 3, 4, 5, 6, 7, 8].map(i => set('cf1', 'q', 'v' + i, i * 1000));
CASES.push(['filter/interleave_strip_order', async s => [await mutate(s, M, 'iv', EIGHT),
  await readRows(s, M, {rows: {rowKeys: [B('iv')]}, filter: inter(PASS, STRIP)}, null, true)]]);

// ---- known differences ----------------------------------------------------------------------

// Cases where Strata answers as Cloud Bigtable does and the emulator does not: Strata's answer
// must be exactly `want` (a JSON value, or {sameAs: CASE}: what Strata answered to that case);
// the emulator's is printed, not compared. `why` names the rule; docs/bigtable.md ("Where
// Strata and the emulator differ") gives the reasons.
const C3 = 'code 3'; // INVALID_ARGUMENT
const C5 = 'code 5'; // NOT_FOUND
const C9 = 'code 9'; // FAILED_PRECONDITION
const FOUR_LEFT = k => [k + ': cf1:q@4000=v4 cf1:q@3000=v3 cf1:q@2000=v2 cf1:q@1000=v1 cf2:q@1000=w'];
const D = (want, why) => ({want, why});
const EMPTY_END = 'an empty end key means no end, closed or open';
const EMPTY_RANGE = 'a range that selects no key is INVALID_ARGUMENT';
const FAMILY_ORDER = 'cells per row counted in output order (the emulator: random family order)';
const EMU_UNKNOWN = 'refused by both; the emulator answers UNKNOWN (a plain Go error)';
const WHOLE_FILTER = 'a filter is validated whole (the emulator: only where a row reaches it)';
const BRANCH_ORDER = [8, 7, 6, 5, 4, 3, 2, 1].map(i => 'cf1:q@' + i + '000=v' + i + ' cf1:q@' + i +
  '000=').join(' ');
const DIFFERENCES = {
  'range/empty_end_closed': D({sameAs: 'range/empty_end_open'}, EMPTY_END),
  'range/empty_both_closed': D({sameAs: 'range/all'}, EMPTY_END),
  'reversed/empty_end_closed': D({sameAs: 'reversed/limit'}, EMPTY_END),
  'range/same_key_half_open': D(C3, EMPTY_RANGE),
  'range/same_key_open_closed': D(C3, EMPTY_RANGE),
  'range/same_key_open_open': D(C3, EMPTY_RANGE),
  'range/open_to_successor': D(C3, EMPTY_RANGE),
  'reversed/empty_range': D(C3, EMPTY_RANGE),
  'keys/too_long': D(C3, 'row keys are at most 4 KiB'),
  'profile/missing': D(C5, 'an app profile the instance lacks (the emulator has none)'),
  'limit/negative': D(C3, 'rows_limit must not be negative'),
  'filter/cells_per_row_offset_families': D(['c: cf1:c@1000=3 cf2:a@1000=4 cf2:b@1000=5 cf3:a@1000=6'],
    FAMILY_ORDER),
  'filter/cells_per_row_limit_families': D(['c: cf1:a@1000=1 cf1:b@1000=2 cf1:c@1000=3 cf2:a@1000=4'],
    FAMILY_ORDER),
  'filter/offset_then_limit_families': D(['a: cf1:q1@1000=v1 cf1:q2@1000= cf2:@3000=e',
    'c: cf1:b@1000=2 cf1:c@1000=3 cf2:a@1000=4'], FAMILY_ORDER),
  'filter/limit_then_offset': D(['a: cf1:q1@1000=v1 cf1:q2@1000='], FAMILY_ORDER),
  'filter/offset_negative': D(C3, 'cells_per_row_offset must not be negative (crashes the emulator)'),
  'filter/col_range_no_family': D(C3, 'column_range needs a family'),
  'filter/ts_range_negative': D(C3, 'timestamps are not negative'),
  'filter/label_then_strip': D(['b: cf1:q1@5000=[la] cf2:q3@1000=[la] cf2:q3@0=[la]'],
    'strip_value keeps labels (the emulator drops them)'),
  'filter/cond_branch_label_then_strip': D(['b: cf1:q1@5000=[f] cf2:q3@1000=[f] cf2:q3@0=[f]'],
    'strip_value keeps labels (the emulator drops them)'),
  'filter/row_sample_one_unreached': D(C3, WHOLE_FILTER),
  'filter/row_sample_zero_untaken_branch': D(C3, WHOLE_FILTER),
  'filter/two_labels_in_chain': D(C3, 'a chain holds at most one label-applying sub-filter'),
  'filter/interleave_strip_order': D(['OK', ['iv: ' + BRANCH_ORDER]],
    'an interleave\'s copies of one cell come in branch order (unspecified by Cloud Bigtable)'),
  'filter/empty_family_regex': D(C3, 'an empty family regex is INVALID_ARGUMENT'),
  'filter/label_too_long': D(C3, 'labels are at most 15 characters'),
  'mut/ts_not_millis': D([C3, []], 'timestamps are whole milliseconds; ' + EMU_UNKNOWN),
  'mut/ts_negative': D([C3, []], 'only -1 of the negative timestamps is allowed; ' + EMU_UNKNOWN),
  'mut/ts_minus_1000': D([C3, []], 'only -1 of the negative timestamps is allowed; ' + EMU_UNKNOWN),
  'mut/del_col_empty_range': D(['OK', C3, FOUR_LEFT('m11')], 'an empty time range; ' + EMU_UNKNOWN),
  'mut/del_col_reversed': D(['OK', C3, FOUR_LEFT('m12')], 'start after end; ' + EMU_UNKNOWN),
  'mut/del_col_not_millis': D(['OK', C3, FOUR_LEFT('m13')], 'whole milliseconds; ' + EMU_UNKNOWN),
  'mut/del_col_negative': D(['OK', C3, FOUR_LEFT('m13b')], 'negative time; ' + EMU_UNKNOWN),
  'mut/del_col_missing_family': D(['OK', C5, FOUR_LEFT('m15')], 'NOT_FOUND; ' + EMU_UNKNOWN),
  'mut/del_family_missing': D(['OK', C5, FOUR_LEFT('m16')],
    'a mutation naming a family the table lacks is NOT_FOUND, DeleteFromFamily too'),
  'mut/del_family_empty_name': D(['OK', C5, FOUR_LEFT('m17b')],
    'a mutation naming a family the table lacks is NOT_FOUND, DeleteFromFamily too'),
  'mut/set_missing_family': D([C5, []], 'NOT_FOUND; ' + EMU_UNKNOWN),
  'mut/set_empty_family': D([C5, []], 'NOT_FOUND; ' + EMU_UNKNOWN),
  'mut/one_bad_among_good': D([C5, []], 'a row\'s mutations are atomic: none is applied ' +
    '(the emulator applies the ones before the bad one)'),
  'mut/empty_mutation': D([C3, []], 'a mutation with no kind; ' + EMU_UNKNOWN),
  'mut/qualifier_16k_plus_1': D([C3, []], 'qualifiers are at most 16 KiB'),
  'mut/row_key_4k_plus_1': D([C3, C3], 'row keys are at most 4 KiB'),
  'mut/malformed_table_name': D(C3, 'a malformed table name is INVALID_ARGUMENT'),
  'cam/no_mutations': D(['OK', C3, ['c7: cf1:q@1000=seed']], 'CheckAndMutateRow needs a mutation'),
  'cam/missing_family_in_branch': D(['OK', C5, ['c9: cf1:q@1000=seed']], 'NOT_FOUND; ' + EMU_UNKNOWN),
  'cam/missing_family_in_other_branch': D(['OK', C5, ['c10: cf1:q@1000=seed']],
    'both branches are checked before the predicate runs'),
  'cam/ts_not_millis': D(['OK', C3, ['c12: cf1:q@1000=seed']], 'whole milliseconds; ' + EMU_UNKNOWN),
  'rmw/increment_not_8_bytes': D(['OK', C9, ['w5: cf1:n@1000=abc']],
    'FAILED_PRECONDITION; ' + EMU_UNKNOWN),
  'rmw/increment_empty_value': D(['OK', C9, ['w5b: cf1:n@1000=']],
    'FAILED_PRECONDITION; ' + EMU_UNKNOWN),
  'rmw/no_rules': D([C3, []], 'ReadModifyWriteRow needs a rule'),
  'rmw/rule_without_kind': D([C3, []], 'a rule with neither append nor increment; ' + EMU_UNKNOWN),
  'rmw/missing_family': D([C5, []], 'NOT_FOUND; ' + EMU_UNKNOWN),
  'rmw/empty_row_key': D([C3, []], 'row keys are not empty (the emulator writes the row)'),
  'bulk/missing_family_entry': D([[0, 5, 0], ['b1: cf1:q@1000=v', 'b3: cf2:q@1000=v']],
    'an entry fails with MutateRow\'s code (the emulator: INTERNAL)'),
  'bulk/not_millis_entry': D([[0, 3], ['b4: cf1:q@1000=v']],
    'an entry fails with MutateRow\'s code (the emulator: INTERNAL)'),
  'bulk/empty_key_entry': D([[0, 3], ['b6: cf1:q@1000=v']],
    'an entry fails with MutateRow\'s code (the emulator: INTERNAL)'),
  'bulk/across_tablets': D([[0, 5, 0, 3, 0, 0], ['c0: cf1:q@1000=v', 'm1x: cf1:q@1000=v',
    'y9: cf2:q@1000=v', 'z1: cf1:q@1000=v']],
  'an entry fails with MutateRow\'s code (the emulator: INTERNAL)'),
  'bulk/all_entries_fail': D([[5, 3], []],
    'an entry fails with MutateRow\'s code (the emulator: INTERNAL)'),
  'bulk/no_mutations_entry': D([[0, 3], ['b7: cf1:q@1000=v']],
    'an entry needs a mutation (the emulator accepts it)'),
  'bulk/reversed_delete_entry': D([[0, 3], ['b9: cf1:q@1000=v']],
    'the entry is refused as MutateRow refuses it (the emulator accepts it in a batch)'),
};
// Requests that crash the emulator (a Go panic ends the process): never sent to it.
const CRASHES_EMULATOR = new Set(['filter/offset_negative']);

// ---- driver ---------------------------------------------------------------------------------

(async () => {
  const [strataAddr, emuAddr] = process.argv.slice(2);
  const only = process.env.SWEEP_ONLY ? new RegExp(process.env.SWEEP_ONLY) : null;
  const sides = [side(strataAddr)];
  if (emuAddr && emuAddr !== '-') sides.push(side(emuAddr));
  for (const s of sides) await setup(s);
  let failed = 0;
  const answers = {};
  for (const [name, fn] of CASES) {
    if (only && !only.test(name)) continue;
    const got = [];
    for (const s of sides) {
      if (s !== sides[0] && CRASHES_EMULATOR.has(name)) break;
      got.push(JSON.stringify(await fn(s)));
    }
    answers[name] = got[0];
    const diff = DIFFERENCES[name];
    if (process.env.SWEEP_VERBOSE) console.log('# ' + name + ' strata ' + got[0]);
    if (diff !== undefined) {
      const ref = diff.want.sameAs;
      if (ref && answers[ref] === undefined) {
        answers[ref] = JSON.stringify(await CASES.find(c => c[0] === ref)[1](sides[0]));
      }
      const want = ref ? JSON.parse(answers[ref]) : diff.want;
      const good = got[0] === JSON.stringify(want);
      console.log((good ? 'known ' : 'FAIL ') + name + ' (' + diff.why + '): strata ' + clip(got[0]) + ' emulator ' +
        clip(got[1] || '(not run)') + (good ? '' : ' want ' + clip(JSON.stringify(want))));
      if (!good) failed++;
    } else if (got.length < 2 || got[0] === got[1]) {
      console.log('ok ' + name);
    } else {
      console.log('FAIL ' + name + ': strata ' + clip(got[0]) + ' emulator ' + clip(got[1]));
      failed++;
    }
  }
  console.log(failed ? failed + ' case(s) failed' : 'all cases agree');
  process.exit(failed ? 1 : 0);
})().catch(e => {
  console.log('FAIL unexpected error: ' + (e.stack || e));
  process.exit(1);
});
