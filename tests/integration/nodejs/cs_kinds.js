// cs_kinds.js — the exact DataChange of every kind of write, through the official Node.js client
// (@google-cloud/bigtable): its generated BigtableClient methods (mutateRow, mutateRows,
// checkAndMutateRow, readModifyWriteRow, generateInitialChangeStreamPartitions,
// readChangeStream) reached through bigtable.request(), against BIGTABLE_EMULATOR_HOST.
//
//   node cs_kinds.js write TABLE PROFILE STATE   the writes below; what each record must hold
//                                                goes to STATE (JSON)
//   node cs_kinds.js check TABLE PROFILE STATE   reads every partition from the first write to
//                                                now, folds the messages as the official Java
//                                                client's ChangeStreamStateMachine does and
//                                                compares every record with STATE
//
// The table needs families cf, f2 and f3. Exit 0 when every record is as expected, 1 otherwise.
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const {Bigtable} = require('@google-cloud/bigtable');

const [mode, tableId, profile, stateFile] = process.argv.slice(2);
const bt = new Bigtable({projectId: 'p'});
const tableName = `projects/p/instances/i/tables/${tableId}`;
const KiB = 1024;
const hex = b => Buffer.from(b).toString('hex');
const B = s => Buffer.isBuffer(s) ? s : Buffer.from(s);

function ts(us) {
  return {seconds: Math.floor(us / 1e6), nanos: (us % 1e6) * 1000};
}

function unary(method, reqOpts) {
  return new Promise((resolve, reject) =>
    bt.request({client: 'BigtableClient', method, reqOpts: Object.assign({tableName, appProfileId: profile}, reqOpts),
                gaxOpts: {timeout: 60000}},
               (err, resp) => err ? reject(err) : resolve(resp)));
}

function stream(method, reqOpts) {
  return new Promise((resolve, reject) => {
    const out = [];
    const s = bt.request({client: 'BigtableClient', method, reqOpts: Object.assign({tableName, appProfileId: profile}, reqOpts),
                          gaxOpts: {timeout: 60000}});
    s.on('data', d => out.push(d));
    s.on('error', reject);
    s.on('end', () => resolve(out));
  });
}

const set = (fam, q, v, t) => ({setCell: {familyName: fam, columnQualifier: B(q), timestampMicros: String(t), value: B(v)}});
const delcol = (fam, q, start, end) => ({deleteFromColumn: Object.assign(
    {familyName: fam, columnQualifier: B(q)},
    start === undefined ? {} : {timeRange: {startTimestampMicros: String(start), endTimestampMicros: String(end)}})});
const delfam = fam => ({deleteFromFamily: {familyName: fam}});
const delrow = () => ({deleteFromRow: {}});

// The record a mutation list must give: SetCell with its value, DeleteFromColumn with its range
// (no range: 0, 0), DeleteFromFamily; DeleteFromRow as one DeleteFromFamily per family.
function want(muts) {
  const out = [];
  for (const m of muts) {
    if (m.setCell) {
      const s = m.setCell;
      out.push({k: 'set', fam: s.familyName, q: hex(s.columnQualifier), t: s.timestampMicros, v: hex(s.value)});
    } else if (m.deleteFromColumn) {
      const d = m.deleteFromColumn, r = d.timeRange || {};
      out.push({k: 'delcol', fam: d.familyName, q: hex(d.columnQualifier),
                start: String(r.startTimestampMicros || 0), end: String(r.endTimestampMicros || 0)});
    } else if (m.deleteFromFamily) {
      out.push({k: 'delfam', fam: m.deleteFromFamily.familyName});
    } else {
      for (const f of ['cf', 'f2', 'f3']) out.push({k: 'delfam', fam: f});
    }
  }
  return out;
}

function pattern(n, seed) {
  const v = Buffer.alloc(n);
  for (let i = 0; i < n; i++) v[i] = (i * 31 + seed) & 0xff;
  return v;
}

// The cell (family, qualifier) of row `key` as read back: [timestamp, value] of its newest version.
async function readCell(key, fam, q) {
  const rows = await stream('readRows', {rows: {rowKeys: [B(key)]}});
  let fam_ = null, q_ = null;
  for (const r of rows)
    for (const c of r.chunks || []) {
      if (c.familyName) fam_ = c.familyName.value;
      if (c.qualifier) q_ = hex(c.qualifier.value);
      if (fam_ === fam && q_ === hex(q)) return [String(c.timestampMicros), hex(c.value)];
    }
  throw new Error(`cell ${fam}:${q} of row ${hex(key)} not found`);
}

async function write() {
  const recs = []; // {row (hex), mods}
  const t0 = Date.now() * 1000;
  const mutate = async (key, muts, expect = true) => {
    await unary('mutateRow', {rowKey: B(key), mutations: muts});
    if (expect) recs.push({row: hex(key), mods: want(muts)});
  };
  // SetCell with the server's timestamp (-1): the record holds the timestamp the cell got.
  await mutate('ts-1', [set('cf', 'q', 'a', -1)], false);
  const [t1, v1] = await readCell('ts-1', 'cf', 'q');
  recs.push({row: hex('ts-1'), mods: [{k: 'set', fam: 'cf', q: hex('q'), t: t1, v: v1}]});
  await mutate('ts0', [set('cf', 'q', 'zero', 0)]);
  // every delete shape, and a reference-sized value, in one write
  await mutate('mixed', [set('cf', 'a', 'x', 1000), set('f2', 'b', pattern(70, 1), 2000), delcol('cf', 'a'),
                         delcol('cf', 'b', 2000, 5000), delcol('cf', 'c', 3000, 0), delcol('cf', 'd', 0, 4000),
                         delfam('f3'), set('cf', 'e', pattern(100, 2), 7000), delcol('cf', 'e', 7000, 8000)]);
  await mutate('delrow', [set('cf', 'q', 'v', 1000), set('f2', 'q', 'v', 1000), set('f3', 'q', 'v', 1000)]);
  await mutate('delrow', [delrow()]);
  await mutate('delrow2', [set('cf', 'q', pattern(200, 3), 1000), delrow(), set('f2', 'q', pattern(90, 4), 2000)]);
  // binary and long row keys, empty qualifiers and values
  for (const k of [[0x00], [0xff], [0x00, 0xff, 0x00], Array(10).fill(0xff), [0x00, 0x00]])
    await mutate(Buffer.from(k), [set('cf', Buffer.from([0x00, 0xff]), Buffer.from(k), 1000)]);
  await mutate(Buffer.alloc(4096, 'L'), [set('cf', 'q', pattern(300 * KiB, 5), 1000)]);
  await mutate('emptyq', [set('cf', '', 'eq', 1000), set('cf', 'z', '', 1000), delcol('cf', '')]);
  // values around the message budget (256 KiB of values per message)
  for (const n of [256 * KiB - 1, 256 * KiB, 256 * KiB + 1, 512 * KiB + 3])
    await mutate(`v${n}`, [set('cf', 'q', pattern(n, n & 0xff), 1000)]);
  await mutate('two', [set('cf', 'a', pattern(200 * KiB, 6), 1000), set('cf', 'b', pattern(200 * KiB, 7), 1000),
                       set('cf', 'c', 'small', 1000)]);
  // CheckAndMutateRow: the branch taken is the record; a branch without mutations leaves none
  await mutate('cam', [set('cf', 'q', 'v1', 1000)]);
  const camT = [set('cf', 'r', 'true-branch', 2000), delcol('cf', 'x')];
  const camF = [set('cf', 'r', 'false-branch', 3000), delfam('f2')];
  let r = await unary('checkAndMutateRow', {rowKey: B('cam'), predicateFilter: {valueRegexFilter: B('v1')},
                                            trueMutations: camT, falseMutations: camF});
  if (!r.predicateMatched) throw new Error('checkAndMutateRow: v1 did not match');
  recs.push({row: hex('cam'), mods: want(camT)});
  r = await unary('checkAndMutateRow', {rowKey: B('cam'), predicateFilter: {valueRegexFilter: B('nomatch')},
                                        trueMutations: camT, falseMutations: camF});
  if (r.predicateMatched) throw new Error('checkAndMutateRow: nomatch matched');
  recs.push({row: hex('cam'), mods: want(camF)});
  r = await unary('checkAndMutateRow', {rowKey: B('cam'), predicateFilter: {valueRegexFilter: B('nomatch')},
                                        trueMutations: camT, falseMutations: []});
  await unary('checkAndMutateRow', {rowKey: B('cam-none'), trueMutations: camT, falseMutations: camF});
  recs.push({row: hex('cam-none'), mods: want(camF)});
  // ReadModifyWriteRow: the record holds the resulting cells
  await mutate('rmw', [set('cf', 's', 'ab', 1000)]);
  await unary('readModifyWriteRow', {rowKey: B('rmw'), rules: [{familyName: 'cf', columnQualifier: B('s'), appendValue: B('cd')}]});
  let [t, v] = await readCell('rmw', 'cf', 's');
  if (v !== hex('abcd')) throw new Error(`append gave ${v}`);
  recs.push({row: hex('rmw'), mods: [{k: 'set', fam: 'cf', q: hex('s'), t, v}]});
  await unary('readModifyWriteRow', {rowKey: B('rmw'), rules: [{familyName: 'cf', columnQualifier: B('s'), appendValue: pattern(100, 8)}]});
  [t, v] = await readCell('rmw', 'cf', 's');
  recs.push({row: hex('rmw'), mods: [{k: 'set', fam: 'cf', q: hex('s'), t, v}]});
  await unary('readModifyWriteRow', {rowKey: B('rmw'), rules: [{familyName: 'cf', columnQualifier: B('n'), incrementAmount: '5'}]});
  [t, v] = await readCell('rmw', 'cf', 'n');
  if (v !== '0000000000000005') throw new Error(`increment gave ${v}`);
  recs.push({row: hex('rmw'), mods: [{k: 'set', fam: 'cf', q: hex('n'), t, v}]});
  await unary('readModifyWriteRow', {rowKey: B('rmw'), rules: [{familyName: 'cf', columnQualifier: B('n'), incrementAmount: '-7'}]});
  [t, v] = await readCell('rmw', 'cf', 'n');
  if (v !== 'fffffffffffffffe') throw new Error(`increment -7 gave ${v}`);
  recs.push({row: hex('rmw'), mods: [{k: 'set', fam: 'cf', q: hex('n'), t, v}]});
  // MutateRows with entries that fail: only those that succeed are recorded
  const entries = [
    {rowKey: B('mr-ok1'), mutations: [set('cf', 'q', 'ok1', 1000)]},
    {rowKey: B('mr-badfam'), mutations: [set('nofam', 'q', 'x', 1000)]},
    {rowKey: B('mr-ok2'), mutations: [set('f2', 'q', 'ok2', 1000), delcol('cf', 'q')]},
    {rowKey: B('mr-badts'), mutations: [set('cf', 'q', 'x', 1001)]},
    {rowKey: B('mr-badrange'), mutations: [set('cf', 'q', 'x', 1000), delcol('cf', 'q', 5000, 3000)]},
    {rowKey: B('mr-ok3'), mutations: [delrow()]},
  ];
  const resp = await stream('mutateRows', {entries});
  const codes = {};
  for (const m of resp) for (const e of m.entries) codes[Number(e.index)] = e.status ? e.status.code : 0;
  for (let i = 0; i < entries.length; i++) {
    const ok = codes[i] === 0;
    if (ok !== entries[i].rowKey.toString().startsWith('mr-ok'))
      throw new Error(`mutateRows entry ${i}: status ${codes[i]}`);
    if (ok) recs.push({row: hex(entries[i].rowKey), mods: want(entries[i].mutations)});
  }
  fs.writeFileSync(stateFile, JSON.stringify({t0, recs}));
  console.log(`wrote ${recs.length} records' worth of writes`);
}

// The Java client's rules (ChangeStreamStateMachine), then the records.
function fold(msgs) {
  const recs = [];
  let cur = null, chunked = null;
  const bad = why => { throw new Error(`protocol: ${why}`); };
  for (const m of msgs) {
    if (m.heartbeat || m.closeStream) {
      if (cur) bad('a heartbeat or CloseStream inside a change');
      continue;
    }
    const d = m.dataChange, type = String(d.type);
    if (type !== 'CONTINUATION') {
      if (cur) bad('a new change before the last one was done');
      if (!d.rowKey || d.rowKey.length === 0) bad('first message without row key');
      if (!d.commitTimestamp) bad('first message without commit timestamp');
      if (type === 'USER' && !d.sourceClusterId) bad('USER without source_cluster_id');
      if (type !== 'USER' && type !== 'GARBAGE_COLLECTION') bad(`type ${type}`);
      cur = {row: hex(d.rowKey), type, mods: []};
    } else {
      if (!cur) bad('CONTINUATION without a change');
      if (d.rowKey && d.rowKey.length) bad('CONTINUATION with a row key');
    }
    if (!d.chunks || d.chunks.length === 0) bad('a DataChange without chunks');
    d.chunks.forEach((c, i) => {
      const mu = c.mutation || bad('a chunk without a mutation');
      if (chunked) {
        if (!mu.setCell) bad('a chunked value cut by another mod');
        const sc = mu.setCell, ci = c.chunkInfo || bad('a chunked value continued without chunk_info');
        if (Number(ci.chunkedValueOffset) !== chunked.have) bad(`chunk at ${ci.chunkedValueOffset}, expected ${chunked.have}`);
        if (Number(ci.chunkedValueSize) !== chunked.size) bad('chunked_value_size changed');
        chunked.parts.push(Buffer.from(sc.value));
        chunked.have += sc.value.length;
        if (ci.lastChunk) {
          if (chunked.have !== chunked.size) bad(`chunks of ${chunked.have} bytes, announced ${chunked.size}`);
          cur.mods.push(Object.assign(chunked.mod, {v: hex(Buffer.concat(chunked.parts))}));
          chunked = null;
        } else if (i !== d.chunks.length - 1) bad('a non-last chunk that is not its message\'s last');
        return;
      }
      if (mu.setCell) {
        const sc = mu.setCell;
        const mod = {k: 'set', fam: sc.familyName, q: hex(sc.columnQualifier), t: String(sc.timestampMicros)};
        if (!c.chunkInfo) {
          cur.mods.push(Object.assign(mod, {v: hex(sc.value)}));
          return;
        }
        const ci = c.chunkInfo;
        if (Number(ci.chunkedValueOffset || 0) !== 0) bad('first chunk with an offset');
        if (!(Number(ci.chunkedValueSize) > 0)) bad('first chunk without a positive size');
        chunked = {mod, parts: [Buffer.from(sc.value)], have: sc.value.length, size: Number(ci.chunkedValueSize)};
        if (ci.lastChunk) bad('a chunked value in one chunk');
        if (i !== d.chunks.length - 1) bad('a non-last chunk that is not its message\'s last');
      } else if (mu.deleteFromColumn) {
        const dc = mu.deleteFromColumn, r = dc.timeRange || {};
        cur.mods.push({k: 'delcol', fam: dc.familyName, q: hex(dc.columnQualifier),
                       start: String(r.startTimestampMicros || 0), end: String(r.endTimestampMicros || 0)});
      } else if (mu.deleteFromFamily) {
        cur.mods.push({k: 'delfam', fam: mu.deleteFromFamily.familyName});
      } else {
        bad(`a mod of kind ${Object.keys(mu).join()}`);
      }
    });
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

const show = m => m.map(x => `${x.k} ${x.fam}:${(x.q || '').slice(0, 16)}${x.t !== undefined ? '@' + x.t : ''}` +
                       `${x.start !== undefined ? '[' + x.start + ',' + x.end + ')' : ''}` +
                       `${x.v !== undefined ? '=' + x.v.length / 2 + 'B:' + x.v.slice(0, 8) + ':' + crypto.createHash('sha1').update(x.v).digest('hex').slice(0, 8) : ''}`).join(' | ');

async function check() {
  const st = JSON.parse(fs.readFileSync(stateFile));
  const end = Date.now() * 1000;
  const parts = await stream('generateInitialChangeStreamPartitions', {});
  let got = [];
  for (const p of parts) {
    const msgs = await stream('readChangeStream', {partition: p.partition, startTime: ts(st.t0), endTime: ts(end),
                                                   heartbeatDuration: {seconds: 1}});
    got = got.concat(fold(msgs));
  }
  let bad = 0;
  const rows = [...new Set(st.recs.map(r => r.row).concat(got.map(r => r.row)))];
  for (const row of rows) {
    const w = st.recs.filter(r => r.row === row).map(r => show(r.mods));
    const g = got.filter(r => r.row === row).map(r => show(r.mods));
    if (JSON.stringify(w) === JSON.stringify(g)) continue;
    bad++;
    console.log(`FAIL row ${row.slice(0, 40)}:\n  expected ${w.length}:\n    ${w.join('\n    ')}\n  got ${g.length}:\n    ${g.join('\n    ')}`);
  }
  console.log(`${profile}: ${st.recs.length} records expected, ${got.length} read, ${bad} rows differ`);
  if (bad) throw new Error(`${bad} rows differ`);
}

(mode === 'write' ? write() : check()).then(() => process.exit(0)).catch(e => {
  console.error(`cs_kinds: ${e.code !== undefined ? 'code ' + e.code + ': ' : ''}${e.message}`);
  process.exit(1);
});
