// iam_limits_client.js — the bounds of SetIamPolicy and of metadata records, for
// iam_limits_nodejs_test.sh, against BIGTABLE_EMULATOR_HOST (a plaintext router without an auth
// file). Oversized requests are sent as raw protobuf bytes (the client library would not build
// them); normal policies go through the official client. Prints "ok NAME" or "FAIL NAME: why";
// exits 1 when a check failed.
'use strict';
const {Bigtable} = require('@google-cloud/bigtable');
const grpc = require('@grpc/grpc-js');

const addr = process.env.BIGTABLE_EMULATOR_HOST;
const INST = 'projects/p/instances/i';
const TA = '/google.bigtable.admin.v2.BigtableTableAdmin/';
const IA = '/google.bigtable.admin.v2.BigtableInstanceAdmin/';
let failed = 0;

function check(name, ok, why) {
  console.log(ok ? 'ok ' + name : 'FAIL ' + name + ': ' + why);
  if (!ok) failed = 1;
}

// Protobuf encoding of length-delimited fields (strings, bytes and nested messages).
function varint(n) {
  const out = [];
  for (; n >= 128; n = Math.floor(n / 128)) out.push((n % 128) | 128);
  out.push(n);
  return Buffer.from(out);
}
function fld(num, bytes) {
  const b = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes);
  return Buffer.concat([varint(num * 8 + 2), varint(b.length), b]);
}
const binding = (role, members) => fld(4, Buffer.concat([fld(1, role), ...members.map(m => fld(2, m))]));
const setReq = (resource, bindings) => Buffer.concat([fld(1, resource), fld(2, Buffer.concat(bindings))]);

// A unary call with raw bytes: {code, details, bytes}.
function raw(path, req) {
  const Client = grpc.makeGenericClientConstructor({}, 'Raw');
  const c = new Client(addr, grpc.credentials.createInsecure(),
                       {'grpc.max_send_message_length': 64 << 20,
                        'grpc.max_receive_message_length': 64 << 20});
  return new Promise(resolve => {
    c.makeUnaryRequest(path, x => x, x => x, req, {deadline: Date.now() + 60000}, (err, resp) => {
      c.close();
      resolve(err ? {code: err.code, details: err.details} : {code: 0, bytes: resp});
    });
  });
}

const roles = p => p.bindings.map(b => b.role + '=' + b.members.join('+')).join(';');

async function main() {
  const instance = new Bigtable({projectId: 'p'}).instance('i');
  await instance.createTable('tl', {families: ['cf']});
  const table = instance.table('tl');
  const T1 = INST + '/tables/tl';
  const READER = 'roles/bigtable.reader';

  // 150,000 bindings without members (3.75 MB) and one real: stored as the one.
  const empty = Array.from({length: 150000}, () => binding(READER, []));
  let r = await raw(TA + 'SetIamPolicy', setReq(T1, [...empty, binding(READER, ['user:alice'])]));
  check('empty bindings: set answered', r.code === 0, JSON.stringify(r.details));
  const [got] = await table.getIamPolicy();
  check('empty bindings dropped', roles(got) === READER + '=user:alice', roles(got).slice(0, 200));

  // 1,501 members: refused.
  const many = Array.from({length: 1501}, (_, i) => 'user:u' + i);
  r = await raw(TA + 'SetIamPolicy', setReq(T1, [binding(READER, many)]));
  check('1,501 members refused', r.code === 3 && /1500 members/.test(r.details), JSON.stringify(r));

  // 1,500 members of 64-character names (about 107 KB): past the policy size bound.
  const long = Array.from({length: 1500}, (_, i) => 'user:' + String(i).padStart(64, 'n'));
  r = await raw(TA + 'SetIamPolicy', setReq(T1, [binding(READER, long)]));
  check('oversized policy refused', r.code === 3 && /bytes, more than the 65536/.test(r.details),
        JSON.stringify(r));
  const [kept] = await table.getIamPolicy();
  check('refused sets keep the policy', roles(kept) === READER + '=user:alice', roles(kept));

  // An app profile carrying 2 MiB of fields Strata does not know: they are not stored.
  const prof = Buffer.concat([fld(5, ''), fld(99, Buffer.alloc(2 << 20, 'y'))]);
  r = await raw(IA + 'CreateAppProfile',
                Buffer.concat([fld(1, INST), fld(2, 'pbig'), fld(3, prof)]));
  check('app profile with unknown fields created', r.code === 0, JSON.stringify(r.details));
  r = await raw(IA + 'GetAppProfile', fld(1, INST + '/appProfiles/pbig'));
  check('unknown fields not stored', r.code === 0 && r.bytes.length < 4096,
        r.code ? JSON.stringify(r.details) : r.bytes.length + ' bytes');

  // Normal policies through the client: table and instance, etag and permissions.
  const [p1] = await table.setIamPolicy({bindings: [{role: 'roles/bigtable.user', members: ['user:bob']}]});
  check('table set', roles(p1) === 'roles/bigtable.user=user:bob', roles(p1));
  const [p2] = await table.getIamPolicy();
  check('table get', roles(p2) === 'roles/bigtable.user=user:bob' && String(p2.etag).length === 16,
        roles(p2) + ' etag ' + p2.etag);
  const [perms] = await table.testIamPermissions(['bigtable.tables.readRows']);
  check('table testIamPermissions', perms.join() === 'bigtable.tables.readRows', perms.join());
  const [i1] = await instance.setIamPolicy({bindings: [
    {role: 'roles/bigtable.admin', members: ['user:carol', 'serviceAccount:ops']},
    {role: 'roles/bigtable.reader', members: []}]});
  check('instance set drops the empty binding', roles(i1) === 'roles/bigtable.admin=user:carol+serviceAccount:ops',
        roles(i1));
  const [i2] = await instance.getIamPolicy();
  check('instance get', roles(i2) === roles(i1) && String(i2.etag) === String(i1.etag), roles(i2));
}

main().then(() => process.exit(failed), e => {
  console.log('FAIL exception: ' + (e && e.stack || e));
  process.exit(1);
});
