// full_disk.js — writes and checks for full_disk_test.sh, through the official Cloud Bigtable
// Node.js client's generated clients against BIGTABLE_EMULATOR_HOST (no retries: every answer
// is the server's own).
//
//   node full_disk.js fill TABLE PROFILE PREFIX N OKFILE [STOP_AFTER]
//     MutateRow PREFIX00000.. one 64 KiB value each (cf:q, derived from the key), in order, until
//     N rows or STOP_AFTER failures (default 5); acknowledged keys are appended to OKFILE, failed
//     ones to OKFILE.failed. Prints `ok N` and one `err CODE MESSAGE` line per distinct error.
//   node full_disk.js bulk TABLE PROFILE PREFIX N OKFILE
//     the same with MutateRows, 16 entries a call; each entry's own status counts.
//   node full_disk.js check TABLE PROFILE OKFILE
//     reads the table through PROFILE: every key of OKFILE has its whole value, and no key of
//     OKFILE.failed has anything else. Prints `rows N missing M bad B` and exits 1 on a defect.
//   node full_disk.js consistent TABLE
//     GenerateConsistencyToken, then CheckConsistency until consistent (at most 90 s).
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const {Bigtable, v2} = require('@google-cloud/bigtable');

const bt = new Bigtable({projectId: 'p'});
const data = new v2.BigtableClient(bt.options.BigtableClient);
const admin = new v2.BigtableTableAdminClient(bt.options.BigtableTableAdminClient);
const TN = t => 'projects/p/instances/i/tables/' + t;
const VALUE_BYTES = 65536;
const NO_RETRY = {maxRetries: 0, timeout: 30000};
const [mode, table, a3, a4, a5, a6, a7] = process.argv.slice(2);

// Incompressible (so tables on disk are as large as the values) and derived from the key alone:
// AES-CTR keystream under a key hashed from the row key.
function value(key) {
  const k = crypto.createHash('sha256').update(key).digest().subarray(0, 16);
  const c = crypto.createCipheriv('aes-128-ctr', k, Buffer.alloc(16));
  return Buffer.concat([c.update(Buffer.alloc(VALUE_BYTES)), c.final()]);
}

function key(prefix, i) {
  return prefix + String(i).padStart(5, '0');
}

const entry = k => ({rowKey: Buffer.from(k), mutations: [{setCell: {familyName: 'cf',
  columnQualifier: Buffer.from('q'), value: value(k), timestampMicros: -1}}]});

// Counts errors by code and message; prints each distinct one once.
function errorLog() {
  const seen = new Map();
  return {
    add(code, msg) {
      const k = code + ' ' + String(msg).replace(/\s+/g, ' ').slice(0, 300);
      if (!seen.has(k)) console.log('err ' + k);
      seen.set(k, (seen.get(k) || 0) + 1);
    },
    summary() {
      for (const [k, n] of seen) console.log(`errcount ${n} ${k}`);
    },
  };
}

async function fill(profile, prefix, n, okFile, stopAfter) {
  const errs = errorLog();
  let ok = 0, failed = 0;
  for (let i = 0; i < n && failed < stopAfter; i++) {
    const k = key(prefix, i);
    try {
      await data.mutateRow(Object.assign({tableName: TN(table), appProfileId: profile}, entry(k)),
        NO_RETRY);
      fs.appendFileSync(okFile, k + '\n');
      ok++;
    } catch (e) {
      fs.appendFileSync(okFile + '.failed', k + '\n');
      errs.add(e.code, e.details || e.message);
      failed++;
    }
  }
  console.log('ok ' + ok);
  errs.summary();
}

function mutateRows(profile, entries) {
  return new Promise((resolve, reject) => {
    const statuses = [];
    const s = data.mutateRows({tableName: TN(table), appProfileId: profile, entries}, NO_RETRY);
    s.on('data', r => {
      for (const e of r.entries) statuses[Number(e.index)] = e.status;
    });
    s.on('error', reject);
    s.on('end', () => resolve(statuses));
  });
}

async function bulk(profile, prefix, n, okFile) {
  const errs = errorLog();
  let ok = 0;
  for (let i = 0; i < n; i += 16) {
    const keys = [];
    for (let j = i; j < Math.min(n, i + 16); j++) keys.push(key(prefix, j));
    let st;
    try {
      st = await mutateRows(profile, keys.map(entry));
    } catch (e) {
      errs.add(e.code, e.details || e.message);
      fs.appendFileSync(okFile + '.failed', keys.join('\n') + '\n');
      continue;
    }
    keys.forEach((k, j) => {
      const s = st[j] || {code: -1, message: 'no status'};
      if (!s.code) {
        fs.appendFileSync(okFile, k + '\n');
        ok++;
      } else {
        fs.appendFileSync(okFile + '.failed', k + '\n');
        errs.add(s.code, s.message);
      }
    });
  }
  console.log('ok ' + ok);
  errs.summary();
}

function readAll(profile) {
  return new Promise((resolve, reject) => {
    const rows = new Map();
    let k = null, f = null, q = null, parts = [];
    const s = data.readRows({tableName: TN(table), appProfileId: profile}, {retry: null});
    s.on('data', r => {
      for (const c of r.chunks) {
        if (c.rowKey && c.rowKey.length) k = String(c.rowKey);
        if (c.familyName) f = c.familyName.value;
        if (c.qualifier) q = String(c.qualifier.value);
        parts.push(Buffer.from(c.value || []));
        if (c.valueSize > 0) continue;
        if (!rows.has(k)) rows.set(k, []);
        rows.get(k).push({col: f + ':' + q, v: Buffer.concat(parts)});
        parts = [];
        if (c.resetRow) rows.delete(k);
      }
    });
    s.on('error', reject);
    s.on('end', () => resolve(rows));
  });
}

function lines(file) {
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, 'utf8').split('\n').filter(Boolean);
}

async function check(profile, okFile) {
  const rows = await readAll(profile);
  let missing = 0, bad = 0, ghosts = 0;
  for (const k of lines(okFile)) {
    const r = rows.get(k);
    if (!r) {
      if (missing++ < 5) console.log('missing ' + k);
    } else if (r.length !== 1 || r[0].col !== 'cf:q' || !r[0].v.equals(value(k))) {
      if (bad++ < 5) console.log(`bad ${k}: ${r.length} cells, ${r[0].col} ${r[0].v.length} bytes`);
    }
  }
  // a write that failed is not applied (the commit that would have held it failed as a whole)
  for (const k of lines(okFile + '.failed')) {
    if (rows.has(k) && ghosts++ < 5) console.log('failed write visible ' + k);
  }
  console.log(`rows ${rows.size} missing ${missing} bad ${bad} failed_visible ${ghosts}`);
  process.exitCode = missing || bad ? 1 : 0;
}

async function consistent() {
  const [tok] = await admin.generateConsistencyToken({name: TN(table)});
  const end = Date.now() + 90000;
  while (Date.now() < end) {
    const [r] = await admin.checkConsistency({name: TN(table),
      consistencyToken: tok.consistencyToken});
    if (r.consistent) {
      console.log('consistent');
      return;
    }
    await new Promise(res => setTimeout(res, 200));
  }
  console.log('not consistent after 90 s');
  process.exitCode = 1;
}

async function main() {
  if (mode === 'fill') await fill(a3, a4, Number(a5), a6, Number(a7 || 5));
  else if (mode === 'bulk') await bulk(a3, a4, Number(a5), a6);
  else if (mode === 'check') await check(a3, a4);
  else if (mode === 'consistent') await consistent();
  else throw new Error('usage: see the head of full_disk.js');
}

main().catch(e => {
  console.log(`error ${e.code} ${e.details || e.message}`);
  process.exitCode = 2;
});
