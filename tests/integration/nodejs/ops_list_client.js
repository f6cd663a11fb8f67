// ops_list_client.js — google.longrunning ListOperations through the official Node.js client's
// operations client, against the router named by BIGTABLE_EMULATOR_HOST (projects/p/instances/i,
// cluster east):
//   - name "operations/<backup>" lists that backup's operations only, not those of a backup whose
//     id starts with the same letters (backup X and X2); the collection's name
//     ("operations/.../backups") lists the operations of every backup under it.
// Prints `ok NAME` or `FAIL NAME: detail` per check; exit 1 when one failed.
'use strict';
const {Bigtable} = require('@google-cloud/bigtable');

const bt = new Bigtable({projectId: 'p'});
const inst = bt.instance('i');
const BK = 'operations/projects/p/instances/i/clusters/east/backups';
const O = {timeout: 10000, autoPaginate: false};
let failed = 0;

function check(name, cond, detail) {
  console.log(cond ? 'ok ' + name : 'FAIL ' + name + ': ' + detail);
  if (!cond) failed++;
}

(async () => {
  const t = 'ol' + Date.now();
  await inst.createTable(t, {families: ['cf']});
  const exp = new Date(Date.now() + 8 * 3600e3);
  const mk = async (id) => {
    const [, op] = await inst.cluster('east').createBackup(id, {table: t, expireTime: exp});
    await op.promise();
  };
  await mk(t);
  await mk(t + '2');
  const ops = bt.api.BigtableTableAdminClient.operationsClient;
  const list = async (name, extra) => ops.listOperations(Object.assign({name, filter: ''}, extra), O);

  const [own] = await list(`${BK}/${t}`);
  const names = own.map((o) => o.name);
  check('list_one_backup', names.length === 1 && names[0].startsWith(`${BK}/${t}/`),
    names.join(' '));
  const [slash] = await list(`${BK}/${t}/`);
  check('list_trailing_slash', slash.length === 1 && slash[0].name === names[0],
    slash.map((o) => o.name).join(' '));
  const [coll] = await list(BK);
  const cn = coll.map((o) => o.name);
  check('list_collection', cn.includes(names[0]) && cn.some((n) => n.startsWith(`${BK}/${t}2/`)),
    cn.join(' '));

  process.exit(failed ? 1 : 0);
})().catch((e) => {
  console.log('FAIL unexpected error: ' + (e.stack || e));
  process.exit(1);
});
