// backup_reuse.js — driven by backup_reuse_test.sh (see there). Args: DIR STRATA: the `strata up`
// directory and binary. Through the official Node.js client at BIGTABLE_EMULATOR_HOST. Exit 1: a
// backup or copy made again under a deleted one's id restored rows of the deleted one.
const {Bigtable} = require('@google-cloud/bigtable');
const {execSync} = require('child_process');
const fs = require('fs');
const bt = new Bigtable({projectId: 'p'});
const inst = bt.instance('i');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const I = 'projects/p/instances/i';
const [DIR, STRATA] = process.argv.slice(2);
const keys = 'abcdefghijklmnop'.split('');
const exp = new Date(Date.now() + 8 * 3600e3);

function call(method, reqOpts) {
  return new Promise((res) => bt.request({client: 'BigtableTableAdminClient', method, reqOpts,
      gaxOpts: {timeout: 30000}}, (err, r) => res(err ? {code: err.code, msg: err.message} : {code: 0, r})));
}
// 16 tablets (initial_splits as raw bytes: the client reads string keys as base64), one row each.
async function table(t) {
  const g = await call('createTable', {parent: I, tableId: t, table: {columnFamilies: {cf: {}}},
      initialSplits: keys.slice(1).map((k) => ({key: Buffer.from(k)}))});
  if (g.code) throw new Error('createTable ' + g.msg);
}
const write = (t, v) => inst.table(t).insert(keys.map((k) => ({key: k + '-row', data: {cf: {c: v}}})));
async function backup(t, id) {
  const [, op] = await inst.cluster('east').createBackup(id, {table: t, expireTime: exp});
  await op.promise();
}
async function copy(src, id) {
  const [, op] = await inst.cluster('east').backup(src).copy({cluster: inst.cluster('west'), id, expireTime: exp});
  await op.promise();
}
// Kills the node, deletes the backup (OK: the record goes, the node's pieces stay), restarts.
async function deleteWhileDown(node, cluster, id) {
  execSync(`kill -9 $(cat ${DIR}/run/${node}.pid)`);
  await sleep(500);
  await inst.cluster(cluster).backup(id).delete();
  console.log(`deleted ${id} while ${node} was down`);
  execSync(`${STRATA} up --dir ${DIR} >/dev/null 2>&1`);
}
// Rows written until the restarted node serves its tablets again (bounded).
async function writeAgain(t, v) {
  for (let i = 0; i < 60; i++) {
    try { await write(t, v); return; } catch (e) { await sleep(1000); }
  }
  throw new Error('the restarted node did not take writes');
}
// The restore of backup id (on cluster) must read v2 in every row.
async function restoreAllV2(cluster, id, what, suffix = '') {
  const name = 'r' + suffix + id;
  const [, rop] = await inst.createTableFromBackup({table: name, backup: inst.cluster(cluster).backup(id)});
  await rop.promise();
  const [rows] = await inst.table(name).getRows();
  console.log(`${what}: restored`, rows.map((r) => r.data.cf.c[0].value).join(''));
  const stale = rows.filter((r) => r.data.cf.c[0].value !== 'v2').map((r) => r.id);
  if (rows.length !== keys.length || stale.length) {
    console.log(`FAIL ${what}: ${rows.length} rows, ${stale.length} from the deleted backup: ${stale.join(' ')}`);
    process.exit(1);
  }
}

async function createCase() {
  const t = 'st' + Date.now();
  await table(t);
  await write(t, 'v1');
  await backup(t, 'sb' + t);
  await deleteWhileDown('east-1', 'east', 'sb' + t);
  await writeAgain(t, 'v2');
  await backup(t, 'sb' + t);
  await restoreAllV2('east', 'sb' + t, 'create');
  return ['east', 'sb' + t, 'create'];
}

async function copyCase() {
  const t = 'sc' + Date.now();
  await table(t);
  await write(t, 'v1');
  await backup(t, 'a1' + t);
  await copy('a1' + t, 'c' + t);
  await deleteWhileDown('west-1', 'west', 'c' + t);
  await writeAgain(t, 'v2');
  await backup(t, 'a2' + t);
  await copy('a2' + t, 'c' + t);
  await restoreAllV2('west', 'c' + t, 'copy');
  return ['west', 'c' + t, 'copy'];
}

// Piece directories of backup id on node (sealed ones: no dot in the name).
function pieces(node, cluster, id) {
  try {
    return fs.readdirSync(`${DIR}/${node}/backups/i/${cluster}/${id}`).filter((e) => !e.includes('.'));
  } catch (e) {
    return [];
  }
}

// A delete that missed east-1: the router's sweep (every 10 s) deletes the pieces once the node
// is back, and only that making's (the backups made again above keep theirs: restored again).
async function cleanupCase(again) {
  const t = 'sd' + Date.now();
  await table(t);
  await write(t, 'v1');
  await backup(t, 'sd' + t);
  const had = pieces('east-1', 'east', 'sd' + t).length;
  await deleteWhileDown('east-1', 'east', 'sd' + t);
  const left = pieces('east-1', 'east', 'sd' + t).length;
  console.log(`cleanup: east-1 held ${had} pieces, ${left} after the delete it missed`);
  for (let i = 0; i < 60 && pieces('east-1', 'east', 'sd' + t).length; i++) await sleep(1000);
  const still = pieces('east-1', 'east', 'sd' + t).length;
  console.log(`cleanup: ${still} pieces left after the sweep`);
  if (!had || still) {
    console.log('FAIL cleanup: the pieces the delete missed stayed on east-1');
    process.exit(1);
  }
  for (const [cluster, id, what] of again) await restoreAllV2(cluster, id, what + ' after the sweeps', 'x');
}

(async () => {
  const a = await createCase();
  const b = await copyCase();
  await cleanupCase([a, b]);
  console.log('held: no backup made again took a deleted one\'s pieces');
})().catch((e) => { console.error('ERROR', e.code, e.message); process.exit(2); });
