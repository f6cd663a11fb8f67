// iam_client.js — IAM through the official Node.js client (@google-cloud/bigtable) over TLS with
// bearer tokens, for auth_nodejs_test.sh. Prints one "name: value" line per check.
//   node iam_client.js PORT CA_PEM ADMIN_TOKEN READER_TOKEN NOBODY_TOKEN
'use strict';
const fs = require('fs');
const {Bigtable} = require('@google-cloud/bigtable');
const grpc = require('@grpc/grpc-js');

const [port, caFile, adminTok, readerTok, nobodyTok] = process.argv.slice(2);
const ca = fs.readFileSync(caFile);

function creds(token) {
  const ssl = grpc.credentials.createSsl(ca);
  if (!token) return ssl;
  const call = grpc.credentials.createFromMetadataGenerator((_params, cb) => {
    const md = new grpc.Metadata();
    md.add('authorization', 'Bearer ' + token);
    cb(null, md);
  });
  return grpc.credentials.combineChannelCredentials(ssl, call);
}

function client(token) {
  return new Bigtable({projectId: 'p', apiEndpoint: 'localhost:' + port, sslCreds: creds(token)});
}

async function code(p) {
  try {
    await p;
    return 'OK';
  } catch (e) {
    return String(e.code);
  }
}

function show(name, v) {
  console.log(name + ': ' + (typeof v === 'string' ? v : JSON.stringify(v)));
}

// Protobuf encoding of what the raw calls below send (strings and nested messages only).
function fld(num, bytes) {
  const b = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes);
  const len = [];
  for (let n = b.length; ; n >>= 7) {
    if (n < 128) { len.push(n); break; }
    len.push((n & 127) | 128);
  }
  return Buffer.concat([Buffer.from([(num << 3) | 2]), Buffer.from(len), b]);
}
// SetIamPolicyRequest{resource, policy{etag, bindings[{role, members[member]}]}}
function setReq(resource, role, member, etag) {
  const binding = Buffer.concat([fld(1, role), fld(2, member)]);
  const policy = Buffer.concat([etag ? fld(3, etag) : Buffer.alloc(0), fld(4, binding)]);
  return Buffer.concat([fld(1, resource), fld(2, policy)]);
}
const IA = '/google.bigtable.admin.v2.BigtableInstanceAdmin/';

// The client library's IAM methods fail on errors of their own (they decode the policy of a
// failed call), so refused calls go through a raw generic client: the gRPC status code.
function raw(path, token, req) {
  const Client = grpc.makeGenericClientConstructor({}, 'Raw');
  const c = new Client('localhost:' + port, creds(token));
  return new Promise(resolve => {
    c.makeUnaryRequest(path, x => x, x => x, req || Buffer.alloc(0), err => {
      c.close();
      resolve(err ? String(err.code) : 'OK');
    });
  });
}

const PERMS = ['bigtable.tables.readRows', 'bigtable.tables.mutateRows', 'bigtable.tables.create'];
// Table permissions and instance permissions, asked on a table.
const SCOPED = ['bigtable.tables.readRows', 'bigtable.tables.update', 'bigtable.tables.setIamPolicy',
                'bigtable.tables.create', 'bigtable.tables.list', 'bigtable.instances.get',
                'bigtable.instances.setIamPolicy', 'bigtable.backups.create',
                'bigtable.appProfiles.create', 'bigtable.clusters.get'];

async function main() {
  const admin = client(adminTok).instance('i');
  const reader = client(readerTok).instance('i');
  const nobody = client(nobodyTok).instance('i');
  const anon = client(null).instance('i');

  const [p0] = await admin.getIamPolicy();
  show('initial bindings', p0.bindings.length);
  show('etag', p0.etag);
  const [t0] = await reader.testIamPermissions(PERMS);
  show('reader permissions', t0.sort().join(','));
  const set = {bindings: [{role: 'roles/bigtable.user', members: ['user:reader']}], etag: p0.etag};
  const [p1] = await admin.setIamPolicy(set);
  show('set bindings', p1.bindings.map(b => b.role + '=' + b.members.join('+')).join(';'));
  show('etag changed', String(p1.etag) !== String(p0.etag) && String(p1.etag).length === 16 ? 'yes' : 'no');
  const [p2] = await admin.getIamPolicy();
  show('get after set', p2.bindings.map(b => b.role + '=' + b.members.join('+')).join(';'));
  const [t1] = await reader.testIamPermissions(PERMS);
  show('reader permissions after set', t1.sort().join(','));
  const inst = 'projects/p/instances/i';
  show('stale etag', await raw(IA + 'SetIamPolicy', adminTok,
                               setReq(inst, 'roles/bigtable.user', 'user:reader', p0.etag)));
  show('reader setIamPolicy', await raw(IA + 'SetIamPolicy', readerTok,
                                        setReq(inst, 'roles/bigtable.admin', 'user:reader')));
  show('reader getIamPolicy', await raw(IA + 'GetIamPolicy', readerTok, fld(1, inst)));
  show('bad role', await raw(IA + 'SetIamPolicy', adminTok,
                             setReq(inst, 'roles/owner', 'user:reader')));
  show('bad member', await raw(IA + 'SetIamPolicy', adminTok,
                               setReq(inst, 'roles/bigtable.reader', 'group:x')));

  // A table's policy: nobody (no role in the auth file) reads t1 and only t1.
  show('nobody reads t1 before', await code(nobody.table('t1').getRows({limit: 1})));
  const [tp] = await admin.table('t1').setIamPolicy(
      {bindings: [{role: 'roles/bigtable.reader', members: ['serviceAccount:nobody']}]});
  show('table set', tp.bindings.map(b => b.role + '=' + b.members.join('+')).join(';'));
  const [tg] = await admin.table('t1').getIamPolicy();
  show('table get', tg.bindings.map(b => b.role + '=' + b.members.join('+')).join(';'));
  show('nobody reads t1 after', await code(nobody.table('t1').getRows({limit: 1})));
  show('nobody reads t2', await code(nobody.table('t2').getRows({limit: 1})));
  const [tt] = await nobody.table('t1').testIamPermissions(PERMS);
  show('nobody permissions on t1', tt.sort().join(','));
  // No oracle for table names: a principal without a role answers the same for t2 and a missing table.
  show('nobody permissions on t2', await code(nobody.table('t2').testIamPermissions(PERMS)));
  show('nobody permissions on a missing table',
       await code(nobody.table('nope').testIamPermissions(PERMS)));
  // A table's admin holds the table's permissions there, not the instance's (CreateTable,
  // ListTables, backups, app profiles, the instance policy: each needs a role on the instance),
  // and an instance reader asking on a table gets the instance permissions its role holds.
  await admin.table('t1').setIamPolicy(
      {bindings: [{role: 'roles/bigtable.admin', members: ['serviceAccount:nobody']}]});
  const [ta] = await nobody.table('t1').testIamPermissions(SCOPED);
  show('table admin permissions on t1', ta.sort().join(','));
  show('table admin lists tables', await code(nobody.getTables()));
  const [tr] = await reader.table('t2').testIamPermissions(SCOPED);
  show('instance reader permissions on t2', tr.sort().join(','));
  // A deleted table's policy goes with it: a new table of that name starts without one.
  await admin.table('t1').delete();
  await admin.createTable('t1', {families: ['cf']});
  const [tn] = await admin.table('t1').getIamPolicy();
  show('table recreated bindings', tn.bindings.length);
  show('nobody reads recreated t1', await code(nobody.table('t1').getRows({limit: 1})));
  show('table policy of a missing table',
       await raw('/google.bigtable.admin.v2.BigtableTableAdmin/GetIamPolicy', adminTok,
                 fld(1, inst + '/tables/nope')));

  // Without a token; internal methods through the router.
  show('no token', await raw(IA + 'GetIamPolicy', null, fld(1, inst)));
  show('no token read', await code(anon.table('t1').getRows({limit: 1})));
  show('internal as admin', await raw('/strata.internal.v1.Node/DropTablet', adminTok));
  show('internal without token', await raw('/strata.internal.v1.Replication/SetLinks', null));
  show('unknown service without token', await raw('/x.Y/Z', null));
}

main().then(() => process.exit(0), e => {
  console.error('iam_client failed:', e);
  process.exit(1);
});
