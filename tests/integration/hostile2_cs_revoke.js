// hostile2_cs_revoke.js PORT CA TOKEN ADMIN_TOKEN REMOVE_CMD... — a principal removed while its
// live change stream runs, through the official Node.js client over TLS (hostile2_sec_test.sh;
// docs/security.md, Rotation and revocation). TOKEN's principal opens ReadChangeStream (no end
// time) on table cs; a row written with ADMIN_TOKEN must arrive; then REMOVE_CMD removes the
// principal; once a new call with TOKEN is refused, another row is written. The open stream must
// end UNAUTHENTICATED (16) without delivering that row. It used to go on streaming every later
// change to the removed principal for as long as it stayed connected.
'use strict';
const fs = require('fs');
const {execFileSync} = require('child_process');
const {Bigtable} = require('@google-cloud/bigtable');
const grpc = require('@grpc/grpc-js');
const [port, caFile, tok, adminTok, ...remove] = process.argv.slice(2);
const client = (t) => {
  const ssl = grpc.credentials.createSsl(fs.readFileSync(caFile));
  const md = grpc.credentials.createFromMetadataGenerator((_p, cb) => {
    const m = new grpc.Metadata();
    m.add('authorization', 'Bearer ' + t);
    cb(null, m);
  });
  return new Bigtable({projectId: 'p', apiEndpoint: 'localhost:' + port,
                       sslCreds: grpc.credentials.combineChannelCredentials(ssl, md)});
};
const U = client(tok), A = client(adminTok);
const T = 'projects/p/instances/i/tables/cs';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const until = async (f, ms) => { for (let t = 0; t < ms && !(await f()); t += 100) await sleep(100); return f(); };
const admin = (method, reqOpts) => new Promise((res, rej) => A.request(
    {client: 'BigtableTableAdminClient', method, reqOpts, gaxOpts: {}}, (e) => (e ? rej(e) : res())));
let bad = 0;
const check = (what, ok, got) => { console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}: ${got}`); if (!ok) bad++; };
(async () => {
  await admin('createTable', {parent: 'projects/p/instances/i', tableId: 'cs',
                              table: {columnFamilies: {cf: {}}, changeStreamConfig: {retentionPeriod: {seconds: 86400}}}});
  const parts = [];
  await new Promise((res, rej) => U.request({client: 'BigtableClient', method: 'generateInitialChangeStreamPartitions',
                                             reqOpts: {tableName: T}, gaxOpts: {}})
      .on('data', (d) => parts.push(d.partition)).on('end', res).on('error', rej));
  const got = [];
  let ended = null;
  const s = U.request({client: 'BigtableClient', method: 'readChangeStream', gaxOpts: {},
                       reqOpts: {tableName: T, partition: parts[0], heartbeatDuration: {seconds: 1}}});
  s.on('data', (d) => {
    if (d.dataChange) for (const c of d.dataChange.chunks) if (c.mutation.setCell) got.push(c.mutation.setCell.value.toString());
  });
  s.on('error', (e) => { ended = e.code; });
  s.on('end', () => { if (ended === null) ended = 0; });
  const table = A.instance('i').table('cs');
  await table.insert([{key: 'k1', data: {cf: {c: 'before'}}}]);
  check('the stream delivers a change', await until(() => got.includes('before'), 30000), JSON.stringify(got));
  execFileSync(remove[0], remove.slice(1), {stdio: 'inherit'});
  const refused = async () => { try { await U.instance('i').table('cs').getRows({limit: 1}); return false; } catch (e) { return e.code === 16; } };
  check('a new call of the removed principal', await until(refused, 10000), 'refused');
  await table.insert([{key: 'k2', data: {cf: {c: 'after'}}}]);
  await until(() => ended !== null, 15000);
  check('the open stream ends UNAUTHENTICATED', ended === 16, `ended ${ended}`);
  check('no change written after the removal reached it', !got.includes('after'), JSON.stringify(got));
  s.destroy();
  process.exit(bad ? 1 : 0);
})().catch((e) => { console.log('FAIL', e.code, e.message); process.exit(1); });
