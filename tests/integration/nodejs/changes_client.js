// changes_client.js — reads a change stream through the official Cloud Bigtable Node.js client
// (@google-cloud/bigtable), with its generated BigtableClient methods
// generateInitialChangeStreamPartitions and readChangeStream reached through
// bigtable.request(), against the server named by BIGTABLE_EMULATOR_HOST.
//
//   node changes_client.js read TABLE PROFILE START_US END_US TOKENS_OUT
//     every partition from START_US to END_US; the last token of each goes to TOKENS_OUT
//   node changes_client.js resume TABLE PROFILE TOKENS_IN END_US TOKENS_OUT
//     every partition of TOKENS_IN from its token to END_US
//
// Prints one JSON line per change: {"row","type","cluster","values":[...]}; exit 0 when every
// stream ended normally (CloseStream OK at END_US), 1 otherwise (the error on stderr).
'use strict';

const fs = require('fs');
const {Bigtable} = require('@google-cloud/bigtable');

const [mode, tableId, profile, arg4, endArg, tokensOut] = process.argv.slice(2);
const bt = new Bigtable({projectId: 'p'});
const tableName = `projects/p/instances/i/tables/${tableId}`;
const CALL_TIMEOUT_MS = 60000;

function ts(us) {
  return {seconds: Math.floor(us / 1e6), nanos: (us % 1e6) * 1000};
}

function call(method, reqOpts) {
  return new Promise((resolve, reject) => {
    const out = [];
    const s = bt.request({client: 'BigtableClient', method, reqOpts,
                          gaxOpts: {timeout: CALL_TIMEOUT_MS}});
    const guard = setTimeout(() => {
      s.abort();
      reject(new Error(`${method}: no end after ${CALL_TIMEOUT_MS} ms`));
    }, CALL_TIMEOUT_MS + 5000);
    s.on('data', d => out.push(d));
    s.on('error', e => {
      clearTimeout(guard);
      reject(e);
    });
    s.on('end', () => {
      clearTimeout(guard);
      resolve(out);
    });
  });
}

// Buffers inside a partition come back from JSON as {type: 'Buffer', data: [...]}.
function revive(o) {
  if (o && typeof o === 'object') {
    if (o.type === 'Buffer' && Array.isArray(o.data)) return Buffer.from(o.data);
    for (const k of Object.keys(o)) o[k] = revive(o[k]);
  }
  return o;
}

function str(b) {
  return Buffer.isBuffer(b) ? b.toString('utf8') : String(b);
}

// One partition from `start` (startTime or continuationTokens) to END_US: prints its changes,
// returns its last token (with its partition).
async function readPartition(partition, start, endUs) {
  const reqOpts = Object.assign({tableName, appProfileId: profile, partition,
                                 endTime: ts(endUs), heartbeatDuration: {seconds: 1}}, start);
  const msgs = await call('readChangeStream', reqOpts);
  let last = null, closed = false, values = [], change = null;
  for (const m of msgs) {
    if (m.dataChange) {
      const d = m.dataChange;
      if (String(d.type) !== 'CONTINUATION' && d.type !== 3) {
        change = {row: str(d.rowKey), type: String(d.type), cluster: d.sourceClusterId};
        values = [];
      }
      for (const c of d.chunks || [])
        if (c.mutation && c.mutation.setCell) values.push(str(c.mutation.setCell.value));
      if (d.done) {
        change.values = values;
        console.log(JSON.stringify(change));
        if (d.token) last = {partition, token: d.token};
      }
    } else if (m.heartbeat) {
      if (m.heartbeat.continuationToken && m.heartbeat.continuationToken.token)
        last = {partition, token: m.heartbeat.continuationToken.token};
    } else if (m.closeStream) {
      const code = m.closeStream.status ? m.closeStream.status.code : 0;
      if (code !== 0) throw new Error(`CloseStream with status ${code} (a split or merge: not expected here)`);
      closed = true;
    }
  }
  if (!closed) throw new Error('the stream ended without CloseStream OK at end_time');
  return last;
}

async function main() {
  let work = [];
  if (mode === 'read') {
    const parts = await call('generateInitialChangeStreamPartitions',
                             {tableName, appProfileId: profile});
    if (parts.length === 0) throw new Error('no partitions');
    work = parts.map(p => [p.partition, {startTime: ts(Number(arg4))}]);
  } else if (mode === 'resume') {
    work = revive(JSON.parse(fs.readFileSync(arg4))).map(
        t => [t.partition, {continuationTokens: {tokens: [t]}}]);
  } else {
    throw new Error('mode must be read or resume');
  }
  const tokens = [];
  for (const [partition, start] of work) {
    const last = await readPartition(partition, start, Number(endArg));
    if (!last) throw new Error('a partition gave no token (no change and no heartbeat)');
    tokens.push(last);
  }
  fs.writeFileSync(tokensOut, JSON.stringify(tokens));
  await bt.close();
}

main().catch(e => {
  console.error(`changes_client: ${e.code !== undefined ? 'code ' + e.code + ': ' : ''}${e.message}`);
  process.exit(1);
});
