// cs_huge_value.js TABLE PROFILE BYTES — opens a live ReadChangeStream (official Node.js client,
// BIGTABLE_EMULATOR_HOST = a router) on the first partition of TABLE (streams on, family cf),
// then writes one cell of BYTES and a small row after it; exit 0 when the stream delivers both
// records with every byte, 1 otherwise (the stream's error is printed).
const {Bigtable} = require('@google-cloud/bigtable');
const bt = new Bigtable({projectId: 'p'}); const T = process.argv[2], profile = process.argv[3], N = Number(process.argv[4]);
const tableName = `projects/p/instances/i/tables/${T}`;
function ts(us) { return {seconds: Math.floor(us / 1e6), nanos: (us % 1e6) * 1000}; }
(async () => {
  const t0 = Date.now() * 1000;
  const parts = [];
  await new Promise((res, rej) => { const s = bt.request({client: 'BigtableClient', method: 'generateInitialChangeStreamPartitions', reqOpts: {tableName, appProfileId: profile}}); s.on('data', d => parts.push(d)); s.on('end', res); s.on('error', rej); });
  // open the live stream first
  let got = 0, recs = 0, t = Date.now(), hb = 0; const s = bt.request({client: 'BigtableClient', method: 'readChangeStream', reqOpts: {tableName, appProfileId: profile, partition: parts[0].partition, startTime: ts(t0), endTime: ts(t0 + 90e6), heartbeatDuration: {seconds: 1}}});
  const done = new Promise((res, rej) => {
    s.on('data', m => { if (m.dataChange) { for (const c of m.dataChange.chunks || []) if (c.mutation.setCell) got += c.mutation.setCell.value.length; if (m.dataChange.done) { recs++; console.log('record', m.dataChange.rowKey.toString(), 'bytes', got, 'after', Date.now() - t, 'ms'); if (recs === 2) { s.cancel ? s.cancel() : s.abort(); res(); } } } else if (m.heartbeat) hb++; });
    s.on('error', e => { console.log('stream error', e.code, e.details); res(); }); s.on('end', res); });
  await new Promise(r => setTimeout(r, 1000));
  const table = bt.instance('i').table(T);
  const v = Buffer.alloc(N, 0x61);
  t = Date.now();
  await table.insert({key: 'huge', data: {cf: {q: {value: v, timestamp: 1000}}}}); console.log('write acked', Date.now() - t, 'ms');
  await table.insert({key: 'after', data: {cf: {q: 'x'}}});
  await done; console.log('hb', hb, 'got', got, 'recs', recs); process.exit(recs === 2 && got === N + 1 ? 0 : 1);
})().catch(e => { console.error('ERR', e.code, e.message); process.exit(1); });
