// router_limit.js — rows_limit reads through the official Node.js client (router_limit_test.sh).
//   write TABLE N: rows k00000..k(N-1), 1000-byte values, in MutateRows batches of 50;
//   scan TABLE N LIMIT [forward|reversed]: a forward scan and a reversed scan (the generated client, as
//   client_test.js sends it), each with rows_limit LIMIT, must end without error with exactly
//   min(LIMIT, N) rows, the first (last) ones in order.
//   samples TABLE: the row keys of SampleRowKeys, one JSON array.
// Exit 0 when every expectation held, 1 otherwise (the failures go to stderr).
'use strict';
const {Bigtable, v2} = require('@google-cloud/bigtable');
const [WHAT, TABLE, N, LIMIT, DIRECTION] = process.argv.slice(2);
const bigtable = new Bigtable({projectId: 'p'});
const table = bigtable.instance('i').table(TABLE);
const key = i => 'k' + String(i).padStart(5, '0');

async function write() {
  const v = 'v'.repeat(1000);
  for (let i = 0; i < Number(N); i += 50) {
    const rows = [];
    for (let j = i; j < Math.min(i + 50, Number(N)); j++) rows.push({key: key(j), data: {cf: {c: v}}});
    await table.insert(rows);
  }
}

function forward(limit) {
  return new Promise((resolve, reject) => {
    const keys = [];
    table.createReadStream({limit}).on('error', reject).on('data', r => keys.push(r.id))
      .on('end', () => resolve(keys));
  });
}

function reversed(limit) {
  const gapic = new v2.BigtableClient(bigtable.options.BigtableClient);
  const headers = {'bigtable-features': Buffer.from([0x08, 0x01]).toString('base64')};
  return new Promise((resolve, reject) => {
    const keys = [];
    let k = null;
    const s = gapic.readRows({tableName: table.name, reversed: true, rowsLimit: limit},
      {otherArgs: {headers}, retry: null});
    s.on('data', resp => {
      for (const ch of resp.chunks) {
        if (ch.rowKey && ch.rowKey.length) k = Buffer.from(ch.rowKey).toString();
        if (ch.commitRow) keys.push(k);
      }
    });
    s.on('error', reject);
    s.on('end', () => resolve(keys));
  }).finally(() => gapic.close());
}

async function scan() {
  const n = Number(N), limit = Number(LIMIT), want = Math.min(n, limit);
  let bad = 0;
  const check = (what, keys, expect) => {
    const ok = keys.length === want && keys.every((k, i) => k === expect(i));
    console.log(JSON.stringify({scan: what, rows: keys.length, ok}));
    if (!ok) {
      console.error(`${what}: ${keys.length} rows (want ${want}), first ${keys.slice(0, 3)}`);
      bad++;
    }
  };
  for (const [what, run, expect] of [
    ['forward', forward, i => key(i)],
    ['reversed', reversed, i => key(n - 1 - i)],
  ]) {
    if (DIRECTION && DIRECTION !== what) continue;
    try {
      check(what, await run(limit), expect);
    } catch (e) {
      console.log(JSON.stringify({scan: what, error: e.code}));
      console.error(`${what} scan with limit ${limit} failed: ${e.code} ${e.message}`);
      bad++;
    }
  }
  return bad;
}

(async () => {
  if (WHAT === 'write') await write();
  else if (WHAT === 'samples') console.log(JSON.stringify((await table.sampleRowKeys())[0].map(x => String(x.key))));
  else process.exitCode = (await scan()) ? 1 : 0;
})().catch(e => { console.error(`ERROR ${e.code} ${e.message}`); process.exit(2); });
