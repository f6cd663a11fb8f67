// backup_client.js — Cloud Bigtable backups through the official Node.js client
// (@google-cloud/bigtable) against the server named by BIGTABLE_EMULATOR_HOST: a strata-router
// of an instance with clusters east and west (projects/p/instances/i).
//
//   node backup_client.js
//
// Creates table bt, writes rows, then: cluster.createBackup (waits on the operation), backup.get /
// getMetadata, the error codes of Cloud Bigtable, table.createBackup (GetTable REPLICATION_VIEW),
// cluster.getBackups and instance.getBackups with a filter, order and pages, setMetadata
// (expireTime), restore and restoreTo (rows as at the backup, not after; restore_info; an
// existing table id refused), copy to west (and a copy of a copy refused), delete.
// Prints one line per step; exit 0 when all pass, 1 with the failure on stderr.
'use strict';

const {Bigtable} = require('@google-cloud/bigtable');

const bt = new Bigtable({projectId: 'p'});
const instance = bt.instance('i');
const east = instance.cluster('east');
const west = instance.cluster('west');
const HOUR = 3600 * 1000;

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

async function code(promise, want, what) {
  try {
    await promise;
  } catch (e) {
    check(e.code === want, `${what}: code ${e.code} (${e.message}), expected ${want}`);
    return;
  }
  throw new Error(`${what}: succeeded, expected code ${want}`);
}

async function rows(tableId) {
  const [rs] = await instance.table(tableId).getRows();
  const out = {};
  for (const r of rs) out[r.id] = r.data.cf.c[0].value;
  return out;
}

// Enums come back as names from some calls and as numbers from decoded operations.
function ready(state) {
  return state === 'READY' || state === 2;
}

function later(ms) {
  return new Date(Date.now() + ms);
}

async function main() {
  const [table] = await instance.createTable('bt', {families: [{name: 'cf', rule: {versions: 3}}]});
  const entries = [];
  for (let i = 0; i < 20; i++) {
    entries.push({key: `r${String(i).padStart(2, '0')}`, data: {cf: {c: `v${i}`}}});
  }
  await table.insert(entries);
  console.log('table bt: 20 rows');

  const [b1, op1] = await east.createBackup('b1', {table: 'bt', expireTime: later(8 * HOUR)});
  const [done1] = await op1.promise();
  check(ready(done1.state), `b1 state ${done1.state}`);
  const [md] = await b1.getMetadata();
  check(ready(md.state) && Number(md.sizeBytes) > 0, `b1 metadata ${JSON.stringify(md)}`);
  check(md.sourceTable === 'projects/p/instances/i/tables/bt', `source ${md.sourceTable}`);
  check(b1.startDate <= b1.endDate, 'start after end');
  const [got] = await b1.get();
  check(got.name === 'projects/p/instances/i/clusters/east/backups/b1', `name ${got.name}`);
  console.log(`createBackup b1: READY, ${md.sizeBytes} bytes`);

  await table.insert([{key: 'r00', data: {cf: {c: 'changed'}}}, {key: 'zz', data: {cf: {c: 'new'}}}]);

  await code(east.createBackup('b1', {table: 'bt', expireTime: later(8 * HOUR)}), 6, 'same id');
  await code(east.createBackup('-bad', {table: 'bt', expireTime: later(8 * HOUR)}), 3, 'bad id');
  await code(east.createBackup('b9', {table: 'bt', expireTime: later(8 * HOUR), backupType: 99}), 3,
             'unknown backup_type');
  await code(east.createBackup('b9', {table: 'bt', expireTime: later(HOUR)}), 3, 'expire 1 h');
  await code(east.createBackup('b9', {table: 'bt', expireTime: later(91 * 24 * HOUR)}), 3,
             'expire 91 d');
  await code(east.createBackup('b9', {table: 'nope', expireTime: later(8 * HOUR)}), 5,
             'no table');
  await code(east.backup('nope').getMetadata(), 5, 'no backup');
  console.log('errors: ALREADY_EXISTS, INVALID_ARGUMENT, NOT_FOUND as Cloud Bigtable');

  const [b2, op2] = await table.createBackup('b2', {expireTime: later(9 * HOUR)});
  await op2.promise();
  check(b2.cluster.id === 'east' || b2.cluster.name.endsWith('/east'), 'b2 cluster');
  console.log('table.createBackup b2: done');

  const [all] = await east.getBackups();
  check(all.length === 2, `east has ${all.length} backups`);
  const [named] = await instance.getBackups({filter: 'name:b1'});
  check(named.length === 1 && named[0].id === 'b1', `filter name:b1 gave ${named.length}`);
  const [big] = await instance.getBackups({filter: 'state:READY AND size_bytes > 0'});
  check(big.length === 2, `filter state/size gave ${big.length}`);
  const [ordered] = await instance.getBackups({orderBy: 'name desc'});
  check(ordered.map(b => b.id).join() === 'b2,b1', `order ${ordered.map(b => b.id)}`);
  const [page, next] = await instance.getBackups({pageSize: 1, autoPaginate: false});
  check(page.length === 1 && next && next.pageToken, 'page of 1 with a next token');
  const [page2] = await instance.getBackups({...next, autoPaginate: false});
  check(page2.length === 1 && page2[0].id !== page[0].id, 'second page');
  console.log('getBackups: cluster, instance, filter, orderBy, pages');

  const newExp = later(20 * HOUR);
  const [upd] = await b1.setMetadata({expireTime: newExp});
  check(Math.abs(Number(upd.expireTime.seconds) * 1000 - newExp.getTime()) < 2000,
        'expireTime updated');
  await code(b1.setMetadata({expireTime: later(HOUR)}), 3, 'expireTime 1 h');
  console.log('setMetadata: expireTime');

  const [rt, rop] = await b1.restore('restored');
  await rop.promise();
  const got1 = await rows('restored');
  check(Object.keys(got1).length === 20, `restored has ${Object.keys(got1).length} rows`);
  check(got1.r00 === 'v0' && !got1.zz, `restored rows as at the backup: r00=${got1.r00}`);
  const [meta] = await rt.getMetadata();
  check(meta.restoreInfo && meta.restoreInfo.backupInfo.backup === b1.name, 'restoreInfo');
  check(Object.keys(meta.columnFamilies).join() === 'cf', 'families');
  console.log('restore: 20 rows as at the backup, restoreInfo, families');

  const [, rop2] = await b1.restoreTo({tableId: 'restored2', instance: 'i'});
  await rop2.promise();
  check(Object.keys(await rows('restored2')).length === 20, 'restoreTo rows');
  await code(b1.restore('bt'), 6, 'restore onto an existing table');
  console.log('restoreTo: done; an existing table id refused');

  const [c1, cop] = await b1.copy({cluster: west, id: 'c1', expireTime: later(10 * HOUR)});
  await cop.promise();
  const [cmd] = await c1.getMetadata();
  check(ready(cmd.state) && cmd.sourceBackup === b1.name, `copy ${JSON.stringify(cmd)}`);
  await code(c1.copy({cluster: east, id: 'c2', expireTime: later(10 * HOUR)}), 9, 'copy of copy');
  await code(b1.copy({cluster: west, id: 'c3', expireTime: later(31 * 24 * HOUR)}), 3,
             'copy expire 31 d');
  const [, cr] = await c1.restore('fromcopy');
  await cr.promise();
  check((await rows('fromcopy')).r05 === 'v5', 'restore from the copy');
  console.log('copy to west: READY, restorable; copy of a copy refused');

  await b2.delete();
  await code(b2.getMetadata(), 5, 'deleted backup');
  const [left] = await instance.getBackups();
  check(left.length === 2, `${left.length} backups left`);
  console.log('delete: done');
}

main().then(
  () => console.log('PASS'),
  e => {
    console.error(e && e.stack ? e.stack : e);
    process.exit(1);
  });
