// bk_race.js — hostile backup requests through the official Node.js client (@google-cloud/bigtable) to
// the router named by BIGTABLE_EMULATOR_HOST (projects/p/instances/i, clusters east and west).
// Run with NODE_PATH=build/nodejs-deps/node_modules; see README.md in this directory.
const {Bigtable} = require('@google-cloud/bigtable');
const bt = new Bigtable({projectId: 'p'});
const inst = bt.instance('i');
(async () => {
  const mk = () => inst.cluster('east').createBackup('cc1', {table: 'ft', expireTime: new Date(Date.now() + 8 * 3600e3)})
      .then(([, op]) => op.promise()).then(r => 'ok ' + r[0].state, e => `ERR ${e.code}`);
  console.log(await Promise.all([mk(), mk(), mk(), mk()]));
  const rs = () => inst.cluster('east').backup('cc1').restore('rc1').then(([, op]) => op.promise()).then(() => 'ok', e => `ERR ${e.code}`);
  console.log(await Promise.all([rs(), rs(), rs()]));
  const [rows] = await inst.table('rc1').getRows(); console.log('rc1 rows', rows.length);
})().catch(e => { console.log('ERR', e.code, e.message); process.exit(1); });
