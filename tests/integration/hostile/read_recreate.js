// read_recreate.js PORT STREAMS ROWS BYTES [recreate|delete|keep][1] — scans held while their table
// is deleted and created again (node:http2 only, no client library).
//
// Creates table `rc` (family cf, four tablets; one with a mode ending in 1), writes ROWS rows r000000.. of BYTES bytes of 'o',
// then opens STREAMS full scans on one connection and reads none of them, so the router pauses
// or parks them (its client stops taking bytes). Then the table is deleted and created again
// with the same keys holding 'N' (`delete`: only deleted; `keep`: left alone), and every scan is
// read to its end. A scan may fail, or end OK with every old row exactly once in order; a scan
// that ends OK short, brings a row of the new table ('N'), or never ends is a failure. With
// `keep` every scan must end OK with every row. Exit 0 when all scans pass, 1 otherwise.
const http2 = require('http2');
const [port, streamsArg, rowsArg, bytesArg, mode] = process.argv.slice(2);
const KIND = (mode || 'recreate').replace(/1$/, ''), ONE_TABLET = /1$/.test(mode || '');
const STREAMS = +streamsArg, ROWS = +rowsArg, BYTES = +bytesArg, KEEP = KIND === 'keep', RECREATE = KIND === 'recreate';
const INST = 'projects/p/instances/i', TABLE = INST + '/tables/rc';
const SPLITS = ONE_TABLET ? [] : ['r000100', 'r000200', 'r000300'].filter(k => +k.slice(1) < ROWS);

// ---- protobuf and gRPC framing (just what the calls below need) ----
const varint = v => { const b = []; do { let x = v % 128; v = Math.floor(v / 128); b.push(v ? x | 128 : x); } while (v); return Buffer.from(b); };
const fld = (n, v) => typeof v === 'number' ? Buffer.concat([varint(n * 8), varint(v)])
    : (v = Buffer.from(v), Buffer.concat([varint(n * 8 + 2), varint(v.length), v]));
const frame = body => { const h = Buffer.alloc(5); h.writeUInt32BE(body.length, 1); return Buffer.concat([h, body]); };

const session = http2.connect('http://127.0.0.1:' + port);
session.on('error', e => { console.log('connection failed: ' + e); process.exit(1); });

// One call: resolves {status, message, data}.
function call(method, body) {
  return new Promise(resolve => {
    const r = session.request({':method': 'POST', ':path': method, 'content-type': 'application/grpc', te: 'trailers'});
    const out = {status: null, message: '', chunks: []};
    r.on('response', h => { if (h['grpc-status'] !== undefined) { out.status = +h['grpc-status']; out.message = h['grpc-message'] || ''; } });
    r.on('trailers', h => { out.status = +h['grpc-status']; out.message = decodeURIComponent(h['grpc-message'] || ''); });
    r.on('data', d => out.chunks.push(d));
    r.on('close', () => resolve({status: out.status, message: out.message, data: Buffer.concat(out.chunks)}));
    r.end(frame(body));
  });
}

async function must(what, method, body) {
  const res = await call(method, body);
  if (res.status !== 0) { console.log(what + ' failed: ' + res.status + ' ' + res.message); process.exit(2); }
}

async function makeTable(value) {
  const splits = Buffer.concat(SPLITS.map(k => fld(4, fld(1, k)))); // initial_splits
  await must('CreateTable', '/google.bigtable.admin.v2.BigtableTableAdmin/CreateTable',
             Buffer.concat([fld(1, INST), fld(2, 'rc'), fld(3, fld(3, Buffer.concat([fld(1, 'cf'), fld(2, '')]))), splits]));
  const v = Buffer.alloc(BYTES, value);
  for (let i = 0; i < ROWS; i += 50) {
    const entries = [];
    for (let k = i; k < Math.min(ROWS, i + 50); k++) {
      const cell = Buffer.concat([fld(1, 'cf'), fld(2, 'q'), fld(3, 1000), fld(4, v)]);
      entries.push(fld(2, Buffer.concat([fld(1, 'r' + String(k).padStart(6, '0')), fld(2, fld(1, cell))])));
    }
    await must('MutateRows', '/google.bigtable.v2.Bigtable/MutateRows', Buffer.concat([fld(1, TABLE), ...entries]));
  }
}

const keyTag = /\n\x07(r\d{6})/g; // CellChunk.row_key of a key r000000..: the values hold no '\n'
const expected = Array.from({length: ROWS}, (_, i) => 'r' + String(i).padStart(6, '0')).join(',');

function verdict(s) {
  const text = s.data.toString('latin1');
  const keys = Array.from(text.matchAll(keyTag), m => m[1]).join(',');
  if (text.includes('NNNNNNNN')) return 'rows of the new table';
  if (s.status === null) return 'never ended';
  if (s.status !== 0) return KEEP ? 'failed: ' + s.status + ' ' + s.message : 'ok';
  return keys === expected ? 'ok' : 'ended OK with ' + (keys ? keys.split(',').length : 0) + ' of ' + ROWS + ' rows';
}

(async () => {
  await call('/google.bigtable.admin.v2.BigtableTableAdmin/DeleteTable', fld(1, TABLE));
  await makeTable('o');
  const scans = [];
  for (let i = 0; i < STREAMS; i++) {
    const r = session.request({':method': 'POST', ':path': '/google.bigtable.v2.Bigtable/ReadRows', 'content-type': 'application/grpc', te: 'trailers'});
    const s = {r, status: null, message: '', chunks: []};
    r.on('response', h => { if (h['grpc-status'] !== undefined) { s.status = +h['grpc-status']; s.message = h['grpc-message'] || ''; } });
    r.on('trailers', h => { s.status = +h['grpc-status']; s.message = decodeURIComponent(h['grpc-message'] || ''); });
    r.on('error', () => {});
    s.done = new Promise(res => r.on('close', res));
    r.pause(); // nothing is read: the router's queue for it fills and the node call pauses or parks
    r.end(frame(fld(1, TABLE)));
    scans.push(s);
  }
  await new Promise(res => setTimeout(res, 3000));
  if (!KEEP) {
    await must('DeleteTable', '/google.bigtable.admin.v2.BigtableTableAdmin/DeleteTable', fld(1, TABLE));
    if (RECREATE) await makeTable('N');
  }
  for (const s of scans) { s.r.on('data', d => s.chunks.push(d)); s.r.resume(); }
  await Promise.race([Promise.all(scans.map(s => s.done)), new Promise(res => setTimeout(res, 40000))]);
  const counts = {};
  for (const s of scans) {
    s.data = Buffer.concat(s.chunks);
    const v = verdict(s);
    counts[v] = (counts[v] || 0) + 1;
  }
  const codes = {};
  for (const s of scans) if (s.status !== 0) codes[s.status + ' ' + s.message] = (codes[s.status + ' ' + s.message] || 0) + 1;
  console.log(JSON.stringify(counts), 'non-OK endings:', JSON.stringify(codes));
  process.exit(Object.keys(counts).every(v => v === 'ok') ? 0 : 1);
})();
