// cs_hostile2_values.js — change stream values at the message budget's edges through the
// official Node.js client (@google-cloud/bigtable): its table.insert / mutate writes and its
// generated BigtableClient.generateInitialChangeStreamPartitions / readChangeStream (through
// bigtable.request()), against the router named by BIGTABLE_EMULATOR_HOST.
//
//   node cs_hostile2_values.js write TABLE PROFILE   writes the rows below, prints "T0 <us>,<us>",
//       then checks them as `check` does through PROFILE
//   node cs_hostile2_values.js check TABLE PROFILE[,PROFILE...] T0
//       reads every partition from T0 to now through each PROFILE, checks each message as the
//       official Java client's ChangeStreamStateMachine would (chunk offsets, sizes, done with a
//       token and a watermark, USER with a source cluster, only SetCell / DeleteFromColumn /
//       DeleteFromFamily), joins chunked values and compares every record with what was written.
//
// Rows: values of 63, 64 (stored by reference from 64 bytes), 1 MiB - 1, 1 MiB (one chunk,
// the budget), 1 MiB + 1 (two chunks), 3 MiB + 7 and 8 MiB; two 700 KB values in one row (two
// messages); 300 qualifiers of 16 KB; an empty value; a whole-row delete of a row in 40 families
// (41 DeleteFromFamily: one per family of the table). Exit 0 when every record is as written, 1 otherwise.
'use strict';

const {Bigtable} = require('@google-cloud/bigtable');

const [mode, tableId, profile, t0Arg] = process.argv.slice(2);
const bt = new Bigtable({projectId: 'p'});
const tableName = `projects/p/instances/i/tables/${tableId}`;
const MiB = 1 << 20;
const SIZES = [63, 64, MiB - 1, MiB, MiB + 1, 3 * MiB + 7, 8 * MiB];
const FAMS = 40;

function ts(us) {
  return {seconds: Math.floor(us / 1e6), nanos: (us % 1e6) * 1000};
}

function pattern(n) {
  const v = Buffer.alloc(n, 0x5a);
  for (let i = 0; i + 4 <= n; i += 4096) v.writeUInt32BE((i * 2654435761) >>> 0, i);
  return v;
}

// row -> the list of mods its record must hold ("set fam q len sha" / "delfam fam").
function expected() {
  const want = {};
  for (const n of SIZES) want['big' + n] = [{k: 'set', fam: 'cf', q: 'q', v: pattern(n)}];
  want.two = [{k: 'set', fam: 'cf', q: 'qa', v: Buffer.alloc(700000, 'a')},
              {k: 'set', fam: 'cf', q: 'qb', v: Buffer.alloc(700000, 'b')}];
  want.quals = [];
  for (let i = 0; i < 300; i++) want.quals.push({k: 'set', fam: 'cf', q: 'q'.repeat(16000) + i, v: Buffer.from('x')});
  want.empty = [{k: 'set', fam: 'cf', q: 'e', v: Buffer.alloc(0)}];
  // every family of the table (cf and f0..f39), in the order of their names
  want.wide = ['cf'].concat([...Array(FAMS).keys()].map(f => 'f' + f)).sort().map(fam => ({k: 'delfam', fam}));
  return want;
}

function call(method, reqOpts) {
  return new Promise((resolve, reject) => {
    const out = [];
    const s = bt.request({client: 'BigtableClient', method, reqOpts, gaxOpts: {timeout: 60000}});
    s.on('data', d => out.push(d));
    s.on('error', reject);
    s.on('end', () => resolve(out));
  });
}

// The Java client's rules, then the records: [{row, type, cluster, mods}].
function fold(msgs) {
  const recs = [];
  let cur = null, chunked = null;
  const bad = why => { throw new Error(`protocol: ${why}`); };
  for (const m of msgs) {
    if (!m.dataChange) continue;
    const d = m.dataChange, t = String(d.type);
    if (t !== 'CONTINUATION') {
      if (cur) bad('a new change before the last one was done');
      if (t === 'USER' && !d.sourceClusterId) bad('USER without source_cluster_id');
      if (t === 'GARBAGE_COLLECTION' && d.sourceClusterId) bad('GARBAGE_COLLECTION with a source');
      const ct = d.commitTimestamp || {};
      cur = {row: d.rowKey.toString(), type: t, cluster: d.sourceClusterId, mods: [],
             commitUs: Number(ct.seconds || 0) * 1e6 + Math.floor(Number(ct.nanos || 0) / 1000)};
    } else if (!cur) bad('CONTINUATION without a change');
    for (const c of d.chunks || []) {
      const mu = c.mutation || bad('a chunk without a mutation');
      if (mu.setCell) {
        const sc = mu.setCell;
        if (!c.chunkInfo) {
          if (chunked) bad('a whole SetCell inside a chunked value');
          cur.mods.push({k: 'set', fam: sc.familyName, q: sc.columnQualifier.toString(), v: Buffer.from(sc.value)});
          continue;
        }
        const ci = c.chunkInfo, off = Number(ci.chunkedValueOffset || 0);
        if (off === 0) chunked = {fam: sc.familyName, q: sc.columnQualifier.toString(), parts: [], have: 0,
                                  size: Number(ci.chunkedValueSize)};
        if (!chunked || chunked.have !== off) bad(`chunk at offset ${off}, expected ${chunked && chunked.have}`);
        if (Number(ci.chunkedValueSize) !== chunked.size) bad('chunked_value_size changed between chunks');
        chunked.parts.push(Buffer.from(sc.value));
        chunked.have += sc.value.length;
        if (ci.lastChunk) {
          if (chunked.have !== chunked.size) bad(`chunked value of ${chunked.have} bytes, announced ${chunked.size}`);
          cur.mods.push({k: 'set', fam: chunked.fam, q: chunked.q, v: Buffer.concat(chunked.parts)});
          chunked = null;
        }
      } else if (mu.deleteFromColumn) {
        cur.mods.push({k: 'delcol', fam: mu.deleteFromColumn.familyName});
      } else if (mu.deleteFromFamily) {
        cur.mods.push({k: 'delfam', fam: mu.deleteFromFamily.familyName});
      } else {
        bad('a mod that is not SetCell, DeleteFromColumn or DeleteFromFamily');
      }
    }
    if (d.done) {
      if (chunked) bad('done inside a chunked value');
      if (!d.token || !d.estimatedLowWatermark) bad('done without token and watermark');
      recs.push(cur);
      cur = null;
    }
  }
  if (cur) bad('the stream ended inside a change');
  return recs;
}

async function write() {
  const table = bt.instance('i').table(tableId);
  const t0 = Date.now() * 1000;
  const want = expected();
  const wide = {};
  for (let f = 0; f < FAMS; f++) wide['f' + f] = {q: 'v'};
  await table.insert({key: 'wide', data: wide});
  const t1 = Date.now() * 1000;
  for (const [row, mods] of Object.entries(want)) {
    if (row === 'wide') continue;
    const data = {};
    for (const m of mods) (data[m.fam] = data[m.fam] || {})[m.q] = {value: m.v, timestamp: 1000};
    await table.insert({key: row, data});
  }
  await table.mutate({key: 'wide', method: 'delete'});
  console.log(`T0 ${t0},${t1}`);
  return `${t0},${t1}`;
}

async function check(profile, t0Arg) {
  const [t0, t1] = t0Arg.split(',').map(Number);
  const end = Date.now() * 1000;
  const parts = await call('generateInitialChangeStreamPartitions', {tableName, appProfileId: profile});
  let recs = [];
  for (const p of parts) {
    const msgs = await call('readChangeStream', {tableName, appProfileId: profile, partition: p.partition,
                                                 startTime: ts(t1), endTime: ts(end),
                                                 heartbeatDuration: {seconds: 1}});
    recs = recs.concat(fold(msgs));
  }
  const want = expected();
  let bad = 0;
  for (const [row, mods] of Object.entries(want)) {
    // start_time selects by the time a change was applied in the cluster read: on the second
    // cluster, the wide row's insert (committed before t1) can be applied after t1 and arrive too.
    const got = recs.filter(r => r.row === row && r.commitUs >= t1);
    const g = got.length === 1 ? got[0].mods : [];
    const same = got.length === 1 && g.length === mods.length &&
                 mods.every((m, i) => g[i].k === m.k && g[i].fam === m.fam &&
                                      (m.k !== 'set' || (g[i].q === m.q && g[i].v.equals(m.v))));
    if (!same) {
      bad++;
      const desc = got.map(r => r.mods.map(x => `${x.k} ${x.fam} ${x.v ? x.v.length : ''}`).slice(0, 4).join(','));
      console.log(`FAIL ${row}: ${got.length} records [${desc}], expected one with ${mods.length} mods`);
    }
  }
  console.log(`${profile}: checked ${Object.keys(want).length} rows, ${recs.length} records`);
  if (bad) throw new Error(`${bad} rows differ through ${profile} (t0 ${t0})`);
}

async function main() {
  if (mode === 'write') return check(profile, await write());
  for (const p of profile.split(',')) await check(p, t0Arg);
}

main().then(() => process.exit(0)).catch(e => {
  console.error(`cs_hostile2_values: ${e.code !== undefined ? 'code ' + e.code + ': ' : ''}${e.message}`);
  process.exit(1);
});
