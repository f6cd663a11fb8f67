// ops_list_client.js — google.longrunning ListOperations through the official Node.js client's
// operations client, against the router named by BIGTABLE_EMULATOR_HOST (projects/p/instances/i,
// cluster east):
//   - name "operations/<backup>" lists that backup's operations only, not those of a backup whose
//     id starts with the same letters (backup X and X2); the collection's name
//     ("operations/.../backups") lists the operations of every backup under it;
//   - page tokens name where a page ended: an operation started between two pages does not make
//     the next page repeat one, nor one deleted make it skip one; walking pages of one lists
//     every operation once;
//   - a malformed token ("-1", "abc") and one of another name's listing are INVALID_ARGUMENT;
//   - GetOperation, CancelOperation and DeleteOperation without a name are INVALID_ARGUMENT.
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

async function code(promise) {
  try {
    await promise;
    return 0;
  } catch (e) {
    return e.code;
  }
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

  // Pages of one over the backups' collection, an operation started between pages 1 and 2.
  const seen = [];
  let token = '';
  for (let page = 0; page < 1000; page++) {
    const [p, , resp] = await list(BK, {pageSize: 1, pageToken: token});
    seen.push(...p.map((o) => o.name));
    if (page === 0) await mk(t + '3');
    token = resp && resp.nextPageToken;
    if (!token) break;
  }
  const dup = seen.filter((n, i) => seen.indexOf(n) !== i);
  check('pages_no_repeat', dup.length === 0, 'repeated ' + dup.join(' '));
  const [all] = await list(BK);
  const missed = all.map((o) => o.name).filter((n) => !seen.includes(n) && !n.includes(`/${t}3/`));
  check('pages_none_missed', missed.length === 0, 'missed ' + missed.join(' '));

  // The last operation of a page deleted before the next page: that page starts with the one
  // that followed it.
  const [before] = await list(BK);
  const [q1, , r1] = await list(BK, {pageSize: 1});
  await ops.deleteOperation({name: q1[0].name}, O);
  const [q2] = await list(BK, {pageSize: 1, pageToken: r1.nextPageToken});
  check('pages_after_delete', q1[0].name === before[0].name && q2.length === 1 &&
    q2[0].name === before[1].name, `${q1[0].name} then ${q2.map((o) => o.name)}, ` +
    `expected ${before[1].name}`);
  for (const bad of ['-1', 'abc', '5']) {
    const c = await code(list(BK, {pageToken: bad}));
    check('page_token_' + bad, c === 3, 'code ' + c);
  }
  const other = await code(list(`${BK}/${t}`, {pageToken: r1.nextPageToken}));
  check('page_token_other_name', other === 3, 'code ' + other);
  for (const m of ['getOperation', 'cancelOperation', 'deleteOperation']) {
    const c = await code(ops[m]({name: ''}, O));
    check('empty_name_' + m, c === 3, 'code ' + c);
  }
  process.exit(failed ? 1 : 0);
})().catch((e) => {
  console.log('FAIL unexpected error: ' + (e.stack || e));
  process.exit(1);
});
