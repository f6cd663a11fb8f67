// router_rmw.js — one hot row through a single-cluster profile with transactional writes:
// WORKERS clients increment cf:n (readModifyWriteRow) and others advance cf:cas by
// checkAndMutateRow (set v+1 only if the cell is v) for SECONDS, while the caller kills the
// router and nodes. Every acknowledged increment returns a distinct value; the final counter
// lies in [acked, acked + unknown] where unknown counts calls that failed with a code that
// leaves the outcome open (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, INTERNAL, UNKNOWN).
// Usage: node router_rmw.js TABLE ROW PROFILE SECONDS WORKERS
'use strict';
const {Bigtable} = require('@google-cloud/bigtable');
const [TABLE, ROW, PROFILE, SECS, WORKERS] = process.argv.slice(2);
const table = new Bigtable({projectId: 'p', appProfileId: PROFILE}).instance('i').table(TABLE);
const row = table.row(ROW);
const end = Date.now() + Number(SECS) * 1000;
const OPEN = new Set([1, 2, 4, 13, 14]);
const st = {inc: 0, incUnknown: 0, incErr: {}, cas: 0, casMiss: 0, casUnknown: 0, casErr: {}};
const seen = new Map();
const bad = [];
const sleep = ms => new Promise(r => setTimeout(r, ms));

function num(v) {
  if (typeof v === 'number') return v;
  const b = Buffer.isBuffer(v) ? v : Buffer.from(v);
  return b.length === 8 ? Number(b.readBigInt64BE()) : Number(b.toString());
}

async function incWorker() {
  while (Date.now() < end) {
    try {
      const [r] = await row.increment('cf:n', 1);
      const v = num(r);
      if (seen.has(v)) bad.push(`increment returned ${v} twice`);
      seen.set(v, 1);
      st.inc++;
    } catch (e) {
      st.incErr[e.code] = (st.incErr[e.code] || 0) + 1;
      if (OPEN.has(e.code)) st.incUnknown++;
      else bad.push(`increment failed with code ${e.code}: ${e.message}`);
      await sleep(100);
    }
  }
}

async function casWorker() {
  while (Date.now() < end) {
    try {
      const [r] = await row.get(['cf:cas']);
      const d = r.data || r;
      const cur = d.cf && d.cf.cas ? Number(d.cf.cas[0].value) : 0;
      const filter = [{column: 'cas'}, {value: String(cur)}];
      const [matched] = await row.filter(filter, {
        onMatch: [{method: 'insert', data: {cf: {cas: String(cur + 1)}}}],
      });
      if (matched) st.cas++;
      else st.casMiss++;
    } catch (e) {
      st.casErr[e.code] = (st.casErr[e.code] || 0) + 1;
      if (OPEN.has(e.code)) st.casUnknown++;
      else bad.push(`check-and-mutate failed with code ${e.code}: ${e.message}`);
      await sleep(100);
    }
  }
}

(async () => {
  await row.save({cf: {cas: '0'}});
  const jobs = [];
  for (let i = 0; i < Number(WORKERS); i++) jobs.push(incWorker(), casWorker());
  await Promise.all(jobs);
  await sleep(500);
  let fin, cas;
  for (let i = 0; ; i++) {
    try {
      const [r] = await row.get(['cf:n', 'cf:cas']);
      const d = r.data || r;
      fin = d.cf.n ? num(d.cf.n[0].value) : 0;
      cas = Number(d.cf.cas[0].value);
      break;
    } catch (e) {
      if (i > 30) throw e;
      await sleep(1000);
    }
  }
  if (fin < st.inc || fin > st.inc + st.incUnknown)
    bad.push(`counter ${fin}, expected ${st.inc}..${st.inc + st.incUnknown}`);
  if (cas < st.cas || cas > st.cas + st.casUnknown)
    bad.push(`cas cell ${cas}, expected ${st.cas}..${st.cas + st.casUnknown}`);
  console.log(JSON.stringify({...st, counter: fin, casCell: cas, bad: bad.length}));
  for (const b of bad.slice(0, 20)) console.error('BAD ' + b);
  process.exit(bad.length ? 1 : 0);
})().catch(e => { console.error('ERROR ' + e.code + ' ' + e.message); process.exit(2); });
