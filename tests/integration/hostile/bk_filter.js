// bk_filter.js — hostile backup requests through the official Node.js client (@google-cloud/bigtable) to
// the router named by BIGTABLE_EMULATOR_HOST (projects/p/instances/i, clusters east and west).
// Run with NODE_PATH=build/nodejs-deps/node_modules; see README.md in this directory.
const {Bigtable} = require('@google-cloud/bigtable');
const bt = new Bigtable({projectId: 'p'});
const inst = bt.instance('i');
function list(req, timeout) {
  return new Promise((res) => {
    bt.request({client: 'BigtableTableAdminClient', method: 'listBackups',
                reqOpts: Object.assign({parent: 'projects/p/instances/i/clusters/-'}, req),
                gaxOpts: {timeout: timeout || 20000, autoPaginate: false}},
               (err, r) => res(err ? `ERR ${err.code} ${String(err.message).slice(0, 150)}` : `OK ${r.length}`));
  });
}
(async () => {
  const what = process.argv[2];
  if (what === 'setup') {
    const [t] = await inst.createTable('ft', {families: ['cf']});
    await t.insert([{key: 'a', data: {cf: {c: 'v'}}}]);
    const [, op] = await inst.cluster('east').createBackup('fb', {table: 'ft', expireTime: new Date(Date.now() + 8 * 3600e3)});
    await op.promise();
    console.log('setup done');
    return;
  }
  const N = Number(process.argv[3] || 1000);
  let f;
  if (what === 'andchain') f = Array(N).fill('name:fb').join(' ');
  else if (what === 'orchain') f = Array(N).fill('name:fb').join(' OR ');
  else if (what === 'nest') f = '('.repeat(N) + 'name:fb' + ')'.repeat(N);
  else if (what === 'not') f = 'NOT '.repeat(N) + 'name:fb';
  else if (what === 'dash') f = '-'.repeat(N) + 'name:fb';
  else if (what === 'longstr') f = 'name:"' + 'x'.repeat(N) + '"';
  else if (what === 'unterminated') f = 'name:"' + 'x'.repeat(N);
  else f = what;
  const t0 = Date.now();
  console.log(what, N, f.length, await list({filter: f}, 60000), (Date.now() - t0) + 'ms');
})().catch(e => { console.error(e); process.exit(1); });
