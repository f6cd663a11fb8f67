// split_fields_client.js ROUTER NODE — requests whose singular message field comes in two
// pieces (Mutation.set_cell, CreateTableRequest.table, RowFilter.Condition.predicate_filter,
// DeleteFromColumn.time_range), sent as raw protobuf bytes through grpc-js to the router and
// straight to a node. Protobuf merges such pieces; Strata refuses them with INVALID_ARGUMENT
// naming the field (docs/bigtable.md), where a split SetCell used to be acknowledged and stored
// without its qualifier and value. Both endpoints must give the same answer, nothing may be
// stored, and the same cell sent whole is stored as sent. Prints `ok NAME` or `FAIL NAME:
// detail`; exit 1 when one failed.
'use strict';
const grpc = require('@grpc/grpc-js');

const [ROUTER, NODE] = process.argv.slice(2);
const INST = 'projects/p/instances/i';
const TABLE = INST + '/tables/split_t';
const BT = '/google.bigtable.v2.Bigtable/';
const ADMIN = '/google.bigtable.admin.v2.BigtableTableAdmin/';
let failed = 0;

function check(name, cond, detail) {
  console.log(cond ? 'ok ' + name : 'FAIL ' + name + ': ' + detail);
  if (!cond) failed++;
}

// Protobuf encoding: a varint, a length-delimited field, a varint field.
function varint(n) {
  const out = [];
  let v = BigInt.asUintN(64, BigInt(n));
  do {
    const b = Number(v & 0x7fn);
    v >>= 7n;
    out.push(v ? b | 0x80 : b);
  } while (v);
  return Buffer.from(out);
}
const ld = (f, b) => {
  const v = Buffer.isBuffer(b) ? b : Buffer.from(b);
  return Buffer.concat([varint(f << 3 | 2), varint(v.length), v]);
};
const vi = (f, n) => Buffer.concat([varint(f << 3), varint(n)]);
const cat = (...b) => Buffer.concat(b);

const id = x => x;
const clients = {};
function client(addr) {
  if (!clients[addr]) clients[addr] = new grpc.Client(addr, grpc.credentials.createInsecure());
  return clients[addr];
}
const deadline = () => Date.now() + 30000;

// One unary call: {code, details}, code 0 on success.
function unary(addr, method, body) {
  return new Promise(resolve => client(addr).makeUnaryRequest(method, id, id, body,
    new grpc.Metadata(), {deadline: deadline()},
    (e, r) => resolve(e ? {code: e.code, details: e.details} : {code: 0, body: r})));
}

// One server-streaming call: {code, details, body (the messages joined)}.
function stream(addr, method, body) {
  return new Promise(resolve => {
    const parts = [];
    const s = client(addr).makeServerStreamRequest(method, id, id, body, new grpc.Metadata(),
      {deadline: deadline()});
    s.on('data', d => parts.push(d));
    s.on('error', e => resolve({code: e.code, details: e.details, body: Buffer.concat(parts)}));
    s.on('end', () => resolve({code: 0, body: Buffer.concat(parts)}));
  });
}

// A SetCell in two pieces: the qualifier and value first, the family and timestamp after.
const piece1 = cat(ld(2, 'qq'), ld(4, 'val'));
const piece2 = cat(ld(1, 'cf'), vi(3, 5000));
const splitSetCell = cat(ld(1, piece1), ld(1, piece2));
const wholeSetCell = ld(1, cat(piece2, piece1));
const mutateRow = (row, mut) => cat(ld(1, TABLE), ld(2, row), ld(3, mut));
const readRow = row => cat(ld(1, TABLE), ld(2, ld(1, row)));

// Both endpoints refuse body with INVALID_ARGUMENT naming field (a regular expression).
async function refusedByBoth(name, call, method, body, field) {
  for (const [where, addr] of [['router', ROUTER], ['node', NODE]]) {
    const r = await call(addr, method, body);
    check(name + '_' + where, r.code === 3 && field.test(r.details || '') &&
          /occurs more than once/.test(r.details), r.code + ' ' + r.details);
  }
}

async function main() {
  const fams = ld(3, cat(ld(1, 'cf'), ld(2, Buffer.alloc(0)))); // Table.column_families
  const made = await unary(ROUTER, ADMIN + 'CreateTable',
    cat(ld(1, INST), ld(2, 'split_t'), ld(3, fams)));
  check('create_table', made.code === 0, made.code + ' ' + made.details);

  await refusedByBoth('mutate_row_split_set_cell', unary, BT + 'MutateRow',
    mutateRow('sp', splitSetCell), /set_cell of google\.bigtable\.v2\.Mutation/);
  const entry = cat(ld(1, 'sp'), ld(2, splitSetCell));
  await refusedByBoth('mutate_rows_split_set_cell', stream, BT + 'MutateRows',
    cat(ld(1, TABLE), ld(2, entry)), /set_cell of google\.bigtable\.v2\.Mutation/);
  await refusedByBoth('check_and_mutate_split_set_cell', unary, BT + 'CheckAndMutateRow',
    cat(ld(1, TABLE), ld(2, 'sp'), ld(4, splitSetCell)),
    /set_cell of google\.bigtable\.v2\.Mutation/);
  for (const [where, addr] of [['router', ROUTER], ['node', NODE]]) {
    const r = await stream(addr, BT + 'ReadRows', readRow('sp'));
    check('nothing_stored_' + where, r.code === 0 && r.body.length === 0,
          r.code + ' ' + r.details + ' ' + r.body.toString('hex'));
  }

  // DeleteFromColumn.time_range twice, and a Condition's predicate_filter twice inside a
  // filter: the router forwards these requests unparsed, and the node refuses them.
  const range = ld(3, vi(1, 1000));
  const delCol = ld(2, cat(ld(1, 'cf'), ld(2, 'qq'), range, range));
  await refusedByBoth('mutate_row_split_time_range', unary, BT + 'MutateRow',
    mutateRow('sp', delCol), /time_range of google\.bigtable\.v2\.Mutation\.DeleteFromColumn/);
  const cond = ld(3, cat(ld(1, Buffer.alloc(0)), ld(1, Buffer.alloc(0)))); // RowFilter.condition
  await refusedByBoth('read_rows_split_predicate', stream, BT + 'ReadRows',
    cat(ld(1, TABLE), ld(3, ld(1, ld(1, cond)))),
    /predicate_filter of google\.bigtable\.v2\.RowFilter\.Condition/);

  // CreateTableRequest.table as {granularity} then {deletion_protection}.
  await refusedByBoth('create_table_split_table', unary, ADMIN + 'CreateTable',
    cat(ld(1, INST), ld(2, 'split_t2'), ld(3, vi(4, 1)), ld(3, vi(9, 1))),
    /table of google\.bigtable\.admin\.v2\.CreateTableRequest/);
  const got = await unary(ROUTER, ADMIN + 'GetTable', ld(1, INST + '/tables/split_t2'));
  check('split_table_not_created', got.code === 5, got.code + ' ' + got.details);

  // The same cell sent whole is stored as sent.
  const ok = await unary(ROUTER, BT + 'MutateRow', mutateRow('sp', wholeSetCell));
  check('mutate_row_whole', ok.code === 0, ok.code + ' ' + ok.details);
  const r = await stream(ROUTER, BT + 'ReadRows', readRow('sp'));
  const hex = r.body.toString('hex');
  check('whole_cell_read_back', r.code === 0 && hex.includes(Buffer.from('qq').toString('hex')) &&
        hex.includes(Buffer.from('val').toString('hex')), r.code + ' ' + hex);

  for (const c of Object.values(clients)) c.close();
  process.exit(failed ? 1 : 0);
}

main().catch(e => {
  console.log('FAIL exception: ' + (e.stack || e));
  process.exit(1);
});
