// bk_hostile.js — hostile backup admin requests through the official Node.js client
// (@google-cloud/bigtable) to the router named by BIGTABLE_EMULATOR_HOST (projects/p/instances/i,
// clusters east and west, table ft with rows). Each case asserts the status code; run by
// backup_hostile_rpc_test.sh. Prints one line per case; exits 1 on the first mismatch.
const {Bigtable} = require('@google-cloud/bigtable');
const bt = new Bigtable({projectId: 'p'});
const inst = bt.instance('i');
const I = 'projects/p/instances/i', E = I + '/clusters/east', T = I + '/tables/ft';
const later = (h) => ({seconds: Math.floor(Date.now() / 1000) + h * 3600});
function call(method, reqOpts) {
  return new Promise((res) => bt.request({client: 'BigtableTableAdminClient', method, reqOpts,
      gaxOpts: {timeout: 30000, autoPaginate: false}},
      (err, r) => res(err ? {code: err.code, msg: String(err.message)} : {code: 0, r})));
}
async function expect(label, method, reqOpts, codes) {
  const got = await call(method, reqOpts);
  const ok = codes.includes(got.code);
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${label}: ${got.code} ${(got.msg || '').slice(0, 140)}`);
  if (!ok) { console.log(`expected one of ${codes}`); process.exit(1); }
  return got;
}
const mkb = (id, extra) => ({parent: E, backupId: id,
  backup: Object.assign({sourceTable: T, expireTime: later(8)}, extra || {})});
(async () => {
  const L = 'listBackups', C = 'createBackup', A = I + '/clusters/-';
  for (const t of ['-1', '0', '99999999999999999999999', 'abc', ' 1', '+1', '1e3', '0x1', 'z'.repeat(4000)])
    await expect(`page_token '${t.slice(0, 24)}'`, L, {parent: A, pageToken: t}, [3]);
  await expect('page_size -5', L, {parent: A, pageSize: -5}, [3]);
  await expect('page_size 2^31-1', L, {parent: A, pageSize: 2147483647}, [0]);
  await expect('order_by 100k commas', L, {parent: A, orderBy: ','.repeat(100000)}, [3]);
  await expect('order_by unknown field', L, {parent: A, orderBy: 'nope desc'}, [3]);
  await expect('filter 300k', L, {parent: A, filter: 'name:x OR '.repeat(30000) + 'name:y'}, [3]);
  await expect('filter unterminated', L, {parent: A, filter: 'name = "abc'}, [3]);
  await expect('parent ..', L, {parent: I + '/clusters/../east'}, [3]);
  await expect('parent unknown cluster', L, {parent: I + '/clusters/nope'}, [5]);
  for (const id of ['a/b', '..', '.x', '-x', 'a b', 'é', 'a'.repeat(51), '', 'x\u0000y'])
    await expect(`backup_id ${JSON.stringify(id).slice(0, 20)}`, C, mkb(id), [3]);
  await expect('unknown table', C, Object.assign(mkb('u1'), {backup: {sourceTable: I + '/tables/nope', expireTime: later(8)}}), [5]);
  await expect('unknown cluster', C, Object.assign(mkb('u2'), {parent: I + '/clusters/nope'}), [5]);
  await expect('another instance', C, Object.assign(mkb('u3'), {parent: 'projects/p/instances/zz/clusters/east'}), [5]);
  await expect('expire in the past', C, mkb('u4', {expireTime: {seconds: 1}}), [3]);
  await expect('expire 91 days', C, mkb('u5', {expireTime: later(91 * 24)}), [3]);
  await expect('expire negative nanos', C, mkb('u6', {expireTime: {seconds: later(8).seconds, nanos: -5}}), [3]);
  await expect('expire nanos 1e9', C, mkb('u7', {expireTime: {seconds: later(8).seconds, nanos: 1e9}}), [3]);
  await expect('expire far future', C, mkb('u8', {expireTime: {seconds: 253402300800}}), [3]);
  // seconds whose microseconds overflow int64 and wrap into the 6 h .. 90 d window
  const wrap = Number((BigInt(Date.now() + 8 * 3600e3) * 1000n + 2n ** 64n) / 1000000n + 1n);
  await expect('expire wrapping int64', C, mkb('u0', {expireTime: {seconds: wrap}}), [3]);
  await expect('expire -1e14 s', C, mkb('u0', {expireTime: {seconds: -99999999999999}}), [3]);
  await expect('backup_type 99', C, mkb('u9', {backupType: 99}), [3]);
  // none of the refused creates left a backup
  const [bs] = await inst.getBackups();
  const left = bs.map((b) => b.id).filter((id) => /^u[0-9]$/.test(id));
  if (left.length) { console.log('FAIL refused creates left backups', left); process.exit(1); }
  // four CreateBackups of one id at once: one READY, three ALREADY_EXISTS
  const mk = () => inst.cluster('east').createBackup('twin', {table: 'ft', expireTime: new Date(Date.now() + 8 * 3600e3)})
      .then(([, op]) => op.promise()).then((r) => 'ok ' + r[0].state, (e) => `ERR ${e.code}`);
  const got = (await Promise.all([mk(), mk(), mk(), mk()])).sort();
  console.log(`${got.join(',') === 'ERR 6,ERR 6,ERR 6,ok 2' ? 'ok  ' : 'FAIL'} four creates of twin: ${got}`);
  if (got.join(',') !== 'ERR 6,ERR 6,ERR 6,ok 2') process.exit(1);
})().catch((e) => { console.log('FAIL', e.code, e.message); process.exit(1); });
