// bk_restore_temp_leak.js — driven by bk_restore_temp_leak.sh (see there). Args: DIR
// STRATA ROUNDS. Through the official Node.js client at BIGTABLE_EMULATOR_HOST.
const {Bigtable} = require('@google-cloud/bigtable');
const {execSync} = require('child_process');
const fs = require('fs');
const bt = new Bigtable({projectId: 'p'});
const inst = bt.instance('i');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const [DIR, STRATA, ROUNDS] = process.argv.slice(2);
// the client sometimes looks for credentials while the router restarts: not Strata's concern
process.on('unhandledRejection', (e) => console.log('(client: ' + String(e && e.message).slice(0, 60) + ')'));
// restore-<n> piece directories under every node's data directory
function temps() {
  const out = [];
  for (const node of fs.readdirSync(DIR)) {
    const base = `${DIR}/${node}/backups/i`;
    if (!fs.existsSync(base)) continue;
    for (const cl of fs.readdirSync(base))
      for (const b of fs.readdirSync(`${base}/${cl}`)) if (b.startsWith('restore-')) out.push(`${node}/${cl}/${b}`);
  }
  return out;
}
(async () => {
  const t = 'tl' + Date.now();
  await inst.createTable(t, {families: ['cf']});
  await inst.table(t).insert([...Array(50).keys()].map((i) => ({key: 'k' + i, data: {cf: {c: 'v' + i}}})));
  await sleep(2000); // replicated to west
  const [, bop] = await inst.cluster('west').createBackup('b' + t, {table: t, expireTime: new Date(Date.now() + 8 * 3600e3)});
  await bop.promise();
  const oc = bt.api.BigtableTableAdminClient.operationsClient;
  for (let round = 0; round < +ROUNDS; round++) {
    const ops = [];
    for (let i = 0; i < 8; i++) {
      const [, op] = await inst.createTableFromBackup({table: `${t}r${round}x${i}`, backup: inst.cluster('west').backup('b' + t)});
      ops.push(op.name);
    }
    execSync(`kill -9 $(cat ${DIR}/run/router.pid)`);
    await sleep(300);
    execSync(`${STRATA} up --dir ${DIR} >/dev/null 2>&1`);
    const ends = [];
    for (const name of ops) {
      let o;
      for (let i = 0; i < 150; i++) {
        try { [o] = await oc.getOperation({name}, {timeout: 10000}); } catch (e) { await sleep(1000); continue; }
        if (o.done) break;
        await sleep(1000);
      }
      ends.push(o && o.done ? (o.error ? 'E' + o.error.code : 'ok') : 'STUCK');
    }
    await sleep(15000); // a sweep or two: any cleanup still due has run
    const left = temps();
    console.log(`round ${round}: operations ${ends.join(',')}; restore-* piece directories left: ${left.length}`);
    if (left.length) {
      console.log('  ' + left.join('\n  '));
      console.log('REPRODUCED: temporary pieces of finished restores stay on the nodes');
      process.exit(1);
    }
  }
  console.log('held');
})().catch((e) => { console.error('ERROR', e.code, e.message); process.exit(2); });
