// router_check.js — after router_load.js: waits for replication through the Node.js client's
// table.waitForReplication() (GenerateConsistencyToken + CheckConsistency), unless the first
// argument after the table is "nowait", then reads the whole table through each app profile
// given and reports the acknowledged keys (from the ACK files) each one lacks.
// Usage: node router_check.js TABLE wait|nowait PROFILES(comma) ACK.json...
// Prints one JSON line per profile; exit 1 when any profile lacks an acknowledged row.
'use strict';
const fs = require('fs');
const {Bigtable} = require('@google-cloud/bigtable');
const [TABLE, WAIT, PROFILES, ...ACKS] = process.argv.slice(2);

function keysOf(table) {
  return new Promise((resolve, reject) => {
    const keys = new Set();
    table.createReadStream({filter: [{row: {cellLimit: 1}}, {value: {strip: true}}]})
      .on('error', reject).on('data', r => keys.add(r.id)).on('end', () => resolve(keys));
  });
}

(async () => {
  const acked = new Set();
  for (const f of ACKS) for (const k of JSON.parse(fs.readFileSync(f))) acked.add(k);
  if (WAIT === 'wait') {
    const t = new Bigtable({projectId: 'p'}).instance('i').table(TABLE);
    const [ok] = await t.waitForReplication();
    console.log(JSON.stringify({waitForReplication: ok}));
  }
  let bad = 0;
  for (const p of PROFILES.split(',')) {
    const t = new Bigtable({projectId: 'p', appProfileId: p}).instance('i').table(TABLE);
    const got = await keysOf(t);
    const missing = [...acked].filter(k => !got.has(k)).sort();
    console.log(JSON.stringify({profile: p, rows: got.size, acked: acked.size,
      missing: missing.length, first: missing.slice(0, 5)}));
    if (missing.length) bad = 1;
  }
  process.exit(bad);
})().catch(e => { console.error('ERROR ' + e.code + ' ' + e.message); process.exit(2); });
