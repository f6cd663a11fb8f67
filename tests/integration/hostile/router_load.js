// router_load.js — scans, batch and single writes through the official Cloud Bigtable Node.js
// client against a router while the caller splits, moves and kills (router_load_test.sh).
// Usage: node router_load.js TABLE SECONDS WRITERS SCANNERS OUT.json [PROFILE]
// Environment: KEY_PREFIX (before every key), VALUE_BYTES (600), EVENTUAL=1 (a multi-cluster
// profile: no check for missing rows).
// Every writer writes fresh rows w<writer>-<seq> (mutateRows batches of 20 and single
// mutations), every scanner loops over full scans, ranges, prefixes, limits and filters. A scan
// must come back sorted, without duplicates, and with every row acknowledged before it started
// that falls in its range (for a limit: below its last row). A write or scan error that reaches
// the caller after the client's own retries is counted by gRPC code. Prints one JSON summary;
// writes the acknowledged keys to OUT.json for the caller's read-back. Exit 1 on any
// inconsistency (missing, unsorted, duplicate row), 0 otherwise: errors are judged by the caller.
'use strict';
const fs = require('fs');
const {Bigtable, v2} = require('@google-cloud/bigtable');

const [TABLE, SECS, WRITERS, SCANNERS, OUT, PROFILE] = process.argv.slice(2);
const opts = {projectId: 'p'};
if (PROFILE) opts.appProfileId = PROFILE;
const bigtable = new Bigtable(opts);
const table = bigtable.instance('i').table(TABLE);
const gapic = new v2.BigtableClient(bigtable.options.BigtableClient);
// FeatureFlags{reverse_scans: true}, as client_test.js sends it.
const HEADERS = {'bigtable-features': Buffer.from([0x08, 0x01]).toString('base64')};
const PFX = process.env.KEY_PREFIX || '';
const VALUE = 'x'.repeat(Number(process.env.VALUE_BYTES || 600));
const end = Date.now() + Number(SECS) * 1000;
const acked = new Map(); // key -> ack time (ms)
const errors = {};
const bad = [];
const slow = [];
let maxMs = {};
function took(what, t0) {
  const ms = Date.now() - t0;
  if (ms > (maxMs[what] || 0)) maxMs[what] = ms;
  if (ms > 5000 && slow.length < 50) slow.push(`${what} ${ms} ms ending ${new Date().toISOString()}`);
}
let scans = 0, scannedRows = 0, batches = 0, singles = 0;

function countErr(what, e) {
  const k = what + ':' + (e && e.code !== undefined ? e.code : 'x');
  errors[k] = (errors[k] || 0) + 1;
  if (errors[k] <= 3) console.error(`# ${what} error code=${e && e.code}: ${e && e.message}`);
}

function key(w, i) {
  return `${PFX}w${w}-${String(i).padStart(7, '0')}`;
}

async function writer(w) {
  let i = 0;
  while (Date.now() < end) {
    if (i % 3 === 2) {
      const k = key(w, i++);
      const t0 = Date.now();
      try {
        await table.row(k).save({cf: {c: VALUE}});
        took('single', t0);
        acked.set(k, Date.now());
        singles++;
      } catch (e) {
        countErr('single', e);
      }
      continue;
    }
    const rows = [];
    for (let j = 0; j < 20; j++) rows.push({key: key(w, i++), data: {cf: {c: VALUE}}});
    const t0 = Date.now();
    try {
      await table.insert(rows);
      took('batch', t0);
      const t = Date.now();
      for (const r of rows) acked.set(r.key, t);
      batches++;
    } catch (e) {
      countErr('batch', e);
      // A partial failure acknowledges the entries that did not fail.
      if (e.errors) {
        const failed = new Set(e.errors.map(x => x.entry && x.entry.key).map(String));
        const t = Date.now();
        for (const r of rows) if (!failed.has(r.key)) acked.set(r.key, t);
      }
    }
  }
}

// A reversed scan through the generated client (the handwritten layer has no reverse option);
// no client retry, so every error is seen.
function reversedOnce(o) {
  return new Promise((resolve, reject) => {
    const req = {tableName: table.name, reversed: true, rowsLimit: o.limit || 0};
    if (PROFILE) req.appProfileId = PROFILE;
    if (o.prefix) {
      req.rows = {rowRanges: [{startKeyClosed: Buffer.from(o.prefix),
        endKeyOpen: Buffer.from(o.prefix.slice(0, -1) + String.fromCharCode(o.prefix.slice(-1).charCodeAt(0) + 1))}]};
    }
    const keys = [];
    let key = null;
    const s = gapic.readRows(req, {otherArgs: {headers: HEADERS}, retry: null});
    s.on('data', resp => {
      for (const ch of resp.chunks) {
        if (ch.rowKey && ch.rowKey.length) key = Buffer.from(ch.rowKey).toString();
        if (ch.commitRow) keys.push(key);
        if (ch.resetRow) key = null;
      }
    });
    s.on('error', reject);
    s.on('end', () => resolve(keys.reverse()));
  });
}

function scanOnce(o) {
  if (o.reversed) return reversedOnce(o);
  return new Promise((resolve, reject) => {
    const keys = [];
    table
      .createReadStream(o)
      .on('error', reject)
      .on('data', r => keys.push(r.id))
      .on('end', () => resolve(keys));
  });
}

// The scan kinds: [options, predicate of a key it must return, limit].
function pick(n) {
  const w = n % Number(WRITERS);
  switch (n % 8) {
    case 6:
      return [{reversed: true, prefix: `${PFX}w${w}-`}, k => k.startsWith(`${PFX}w${w}-`)];
    case 7:
      return [{reversed: true, limit: 300}, () => true, 300];
    case 0:
      return [{}, () => true];
    case 1:
      return [{start: `w${w}-0000500`, end: `w${w}-0003000`},
        k => k >= `w${w}-0000500` && k <= `w${w}-0003000`];
    case 2:
      return [{prefix: `w${w}-`}, k => k.startsWith(`w${w}-`)];
    case 3:
      return [{limit: 700}, () => true, 700];
    case 4:
      return [{filter: [{column: {cellLimit: 1}}, {value: /x.*/}]}, () => true];
    default:
      return [{ranges: [{start: 'w0-0000100', end: 'w0-0000400'}, {prefix: `w${w}-00010`}]},
        k => (k >= 'w0-0000100' && k <= 'w0-0000400') || k.startsWith(`w${w}-00010`)];
  }
}

async function scanner(s) {
  let n = s;
  while (Date.now() < end) {
    const [o, want, limit] = pick(n++);
    const started = Date.now();
    const before = [];
    for (const [k, t] of acked) if (t < started && want(k)) before.push(k);
    let keys;
    try {
      keys = await scanOnce(o);
      took('scan', started);
    } catch (e) {
      countErr('scan' + (n - 1) % 8, e);
      continue;
    }
    scans++;
    scannedRows += keys.length;
    for (let i = 1; i < keys.length; i++) {
      if (keys[i] <= keys[i - 1]) {
        bad.push(`scan ${JSON.stringify(o)}: ${keys[i - 1]} then ${keys[i]}`);
        break;
      }
    }
    if (limit && keys.length > limit) bad.push(`scan limit ${limit} returned ${keys.length}`);
    const got = new Set(keys);
    const last = keys.length ? keys[keys.length - 1] : '';
    const first = keys.length ? keys[0] : '';
    const inLimit = k => !limit || keys.length < limit || (o.reversed ? k > first : k < last);
    const missing = before.filter(k => !got.has(k) && inLimit(k));
    // A multi-cluster profile is eventually consistent: a scan may be served by a cluster that
    // has not received every acknowledged row yet (EVENTUAL=1 skips this check).
    if (missing.length && !process.env.EVENTUAL) {
      bad.push(`scan ${JSON.stringify(o)} (${keys.length} rows) misses ${missing.length} ` +
        `acknowledged rows, e.g. ${missing.slice(0, 3).join(' ')}`);
    }
  }
}

(async () => {
  const jobs = [];
  for (let w = 0; w < Number(WRITERS); w++) jobs.push(writer(w));
  for (let s = 0; s < Number(SCANNERS); s++) jobs.push(scanner(s));
  await Promise.all(jobs);
  fs.writeFileSync(OUT, JSON.stringify([...acked.keys()]));
  const sum = {acked: acked.size, batches, singles, scans, scannedRows, errors, maxMs, bad: bad.length};
  for (const x of slow) console.error('SLOW ' + x);
  console.log(JSON.stringify(sum));
  for (const b of bad.slice(0, 20)) console.error('BAD ' + b);
  process.exit(bad.length ? 1 : 0);
})();
