// bk_probe.js — hostile backup requests through the official Node.js client (@google-cloud/bigtable) to
// the router named by BIGTABLE_EMULATOR_HOST (projects/p/instances/i, clusters east and west).
// Run with NODE_PATH=build/nodejs-deps/node_modules; see README.md in this directory.
const {Bigtable} = require('@google-cloud/bigtable');
const bt = new Bigtable({projectId: 'p'});
function call(method, reqOpts) {
  return new Promise((res) => bt.request({client: 'BigtableTableAdminClient', method, reqOpts,
      gaxOpts: {timeout: 15000, autoPaginate: false}},
      (err, r) => res(err ? `ERR ${err.code} ${String(err.message).slice(0, 160)}` : `OK ${JSON.stringify(r).slice(0, 160)}`)));
}
const P = 'projects/p/instances/i/clusters/east';
(async () => {
  const cases = [
    ['listBackups', {parent: 'projects/p/instances/i/clusters/-', pageToken: '-1'}],
    ['listBackups', {parent: 'projects/p/instances/i/clusters/-', pageToken: '99999999999999999999999'}],
    ['listBackups', {parent: 'projects/p/instances/i/clusters/-', pageToken: 'abc'}],
    ['listBackups', {parent: 'projects/p/instances/i/clusters/-', pageSize: -5}],
    ['listBackups', {parent: 'projects/p/instances/i/clusters/-', orderBy: 'name desc desc'}],
    ['listBackups', {parent: 'projects/p/instances/i/clusters/-', orderBy: ','.repeat(100000)}],
    ['listBackups', {parent: 'projects/p/instances/i/clusters/../east'}],
    ['getBackup', {name: P + '/backups/' + 'a'.repeat(100000)}],
    ['getBackup', {name: P + '/backups/../../x'}],
    ['getBackup', {name: P + '/backups/fb/extra'}],
    ['createBackup', {parent: P, backupId: 'a'.repeat(51), backup: {sourceTable: 'projects/p/instances/i/tables/ft', expireTime: {seconds: Math.floor(Date.now()/1000) + 8*3600}}}],
    ['createBackup', {parent: P, backupId: 'a'.repeat(50), backup: {sourceTable: 'projects/p/instances/i/tables/ft', expireTime: {seconds: Math.floor(Date.now()/1000) + 8*3600}}}],
    ['createBackup', {parent: P, backupId: 'x1', backup: {sourceTable: 'projects/q/instances/i/tables/ft', expireTime: {seconds: Math.floor(Date.now()/1000) + 8*3600}}}],
    ['createBackup', {parent: P, backupId: 'x2', backup: {sourceTable: 'projects/p/instances/i/tables/ft', expireTime: {seconds: 99999999999999, nanos: -5}}}],
    ['createBackup', {parent: P, backupId: 'x3', backup: {sourceTable: 'projects/p/instances/i/tables/ft', expireTime: {seconds: -99999999999999}}}],
    ['createBackup', {parent: P, backupId: 'x4', backup: {sourceTable: 'projects/p/instances/i/tables/ft'}}],
    ['createBackup', {parent: P, backupId: 'x5', backup: {sourceTable: 'projects/p/instances/i/tables/ft', expireTime: {seconds: Math.floor(Date.now()/1000) + 8*3600}, backupType: 99}}],
    ['updateBackup', {backup: {name: P + '/backups/fb', expireTime: {seconds: Math.floor(Date.now()/1000) + 9*3600}}, updateMask: {paths: ['size_bytes']}}],
    ['updateBackup', {backup: {name: P + '/backups/fb', expireTime: {seconds: Math.floor(Date.now()/1000) + 9*3600}}, updateMask: {paths: []}}],
    ['updateBackup', {backup: {name: P + '/backups/fb', expireTime: {seconds: 1}}, updateMask: {paths: ['expire_time']}}],
    ['updateBackup', {backup: {name: P + '/backups/fb', expireTime: {seconds: Math.floor(Date.now()/1000) + 9*3600}}, updateMask: {paths: ['expire_time', 'expire_time', 'name']}}],
    ['restoreTable', {parent: 'projects/p/instances/i', tableId: 'ft', backup: P + '/backups/fb'}],
    ['restoreTable', {parent: 'projects/p/instances/i', tableId: '../ft', backup: P + '/backups/fb'}],
    ['restoreTable', {parent: 'projects/p/instances/i', tableId: 'r1', backup: P + '/backups/nope'}],
    ['restoreTable', {parent: 'projects/p/instances/zz', tableId: 'r1', backup: P + '/backups/fb'}],
    ['copyBackup', {parent: 'projects/p/instances/i/clusters/nope', backupId: 'c1', sourceBackup: P + '/backups/fb', expireTime: {seconds: Math.floor(Date.now()/1000) + 8*3600}}],
    ['copyBackup', {parent: 'projects/p/instances/i/clusters/west', backupId: 'c1', sourceBackup: P + '/backups/fb', expireTime: {seconds: Math.floor(Date.now()/1000) + 31*24*3600}}],
    ['deleteBackup', {name: P + '/backups/nope'}],
  ];
  for (const [m, r] of cases) console.log(m, JSON.stringify(r).slice(0, 90), '=>', await call(m, r));
})().catch(e => { console.error(e); process.exit(1); });
