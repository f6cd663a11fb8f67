// auth_probe.js PORT CA_PEM TOKENS_FILE [T1READER_TOKEN] — hostile calls against a router with
// --auth-file over TLS (node:http2, one connection per call): authorization header variants,
// internal and look-alike paths, table-scoped requests built to name another table than the
// grant's (duplicate field 1, authorized views, other instances); with a row SECRETROW in t2, a
// read that names t1 last must not return it. Prints one line per case with
// the gRPC status it got and the status expected; exits 1 when one differs.
// Example: node auth_probe.js 8086 DIR/secure/ca.pem DIR/secure/tokens "$(cat t1reader.tok)"
const http2 = require('http2');
const fs = require('fs');
const [port, caPath, tokPath, t1r] = process.argv.slice(2);
const ca = fs.readFileSync(caPath);
const tok = {};
for (const l of fs.readFileSync(tokPath, 'utf8').split('\n')) {
  const [role, t] = l.trim().split(/\s+/);
  if (t) tok[role] = t;
}
const I = 'projects/p/instances/i';
const T = n => I + '/tables/' + n;

function varint(v) { const o = []; while (v > 127) { o.push((v & 127) | 128); v = Math.floor(v / 128); } o.push(v); return Buffer.from(o); }
function fld(n, s) { const b = Buffer.isBuffer(s) ? s : Buffer.from(s); return Buffer.concat([varint(n << 3 | 2), varint(b.length), b]); }

function call(path, body, headers) {
  return new Promise(res => {
    const s = http2.connect('https://localhost:' + port, {ca});
    const out = {status: null, message: '', err: null, body: []};
    let fin = false;
    const done = () => { if (fin) return; fin = true; s.destroy(); res(out); };
    const t = setTimeout(() => { out.err = 'timeout'; done(); }, 10000);
    s.on('error', e => { out.err = String(e); clearTimeout(t); done(); });
    const hdr = Buffer.alloc(5); hdr.writeUInt32BE(body.length, 1);
    const r = s.request(Object.assign({':method': 'POST', ':path': path, 'content-type': 'application/grpc', te: 'trailers'}, headers));
    r.on('response', h => { if (h['grpc-status'] !== undefined) { out.status = +h['grpc-status']; out.message = decodeURIComponent(h['grpc-message'] || ''); } });
    r.on('trailers', h => { out.status = +h['grpc-status']; out.message = decodeURIComponent(h['grpc-message'] || ''); });
    r.on('data', d => out.body.push(d));
    r.on('end', () => { clearTimeout(t); done(); });
    r.on('error', e => { out.err = String(e); clearTimeout(t); done(); });
    r.end(Buffer.concat([hdr, body]));
  });
}

const BT = '/google.bigtable.v2.Bigtable/', TA = '/google.bigtable.admin.v2.BigtableTableAdmin/';
const LRO = '/google.longrunning.Operations/';
const bearer = t => ({authorization: 'Bearer ' + t});
const A = tok.admin, R = tok.reader;
const cases = [
  // [name, path, body, headers, expected status (number or array)]
  ['no token', TA + 'ListTables', fld(1, I), {}, 16],
  ['admin', TA + 'ListTables', fld(1, I), bearer(A), 0],
  ['lowercase bearer', TA + 'ListTables', fld(1, I), {authorization: 'bearer ' + A}, 0],
  ['tab and spaces', TA + 'ListTables', fld(1, I), {authorization: 'Bearer\t  ' + A + '  '}, 0],
  ['no space', TA + 'ListTables', fld(1, I), {authorization: 'Bearer' + A}, 16],
  ['Basic', TA + 'ListTables', fld(1, I), {authorization: 'Basic ' + A}, 16],
  ['token + x', TA + 'ListTables', fld(1, I), bearer(A + 'x'), 16],
  ['token prefix', TA + 'ListTables', fld(1, I), bearer(A.slice(0, -1)), 16],
  ['two tokens', TA + 'ListTables', fld(1, I), {authorization: 'Bearer ' + A + ' ' + A}, 16],
  ['comma list', TA + 'ListTables', fld(1, I), {authorization: 'Bearer ' + A + ', Bearer ' + A}, 16],
  ['empty bearer', TA + 'ListTables', fld(1, I), {authorization: 'Bearer '}, 16],
  ['other key', TA + 'ListTables', fld(1, I), {'x-goog-api-key': A, 'x-authorization': 'Bearer ' + A}, 16],
  ['huge token 60 KB', TA + 'ListTables', fld(1, I), bearer('a'.repeat(60000)), 16],
  ['huge header 200 KB', TA + 'ListTables', fld(1, I), bearer('a'.repeat(200000)), [8, 16, 'err']],
  ['internal Node via router', '/strata.internal.v1.Node/DropTablet', Buffer.alloc(0), bearer(A), 12],
  ['internal Replication via router', '/strata.internal.v1.Replication/SetLinks', Buffer.alloc(0), bearer(A), 12],
  ['trailing slash', BT + 'ReadRows/', fld(1, T('t1')), bearer(A), 12],
  ['double slash', '/google.bigtable.v2.Bigtable//ReadRows', fld(1, T('t1')), bearer(A), 12],
  ['case of service', '/google.bigtable.v2.bigtable/ReadRows', fld(1, T('t1')), bearer(A), 12],
  ['BackupAdmin as reader', '/strata.internal.v1.BackupAdmin/ExportBackup', Buffer.alloc(0), bearer(R), [7, 12]],
  ['BackupAdmin dot-dot', '/strata.internal.v1.BackupAdmin/../Node/DropTablet', Buffer.alloc(0), bearer(A), 12],
  ['reader CreateTable', TA + 'CreateTable', Buffer.concat([fld(1, I), fld(2, 'zz')]), bearer(R), 7],
  ['reader ListOperations', LRO + 'ListOperations', fld(4, 'operations'), bearer(R), [0, 3, 5]],
  ['reader DeleteOperation', LRO + 'DeleteOperation', fld(1, 'operations/x'), bearer(R), 7],
];
// IAM: SetIamPolicyRequest {resource 1, policy 2 {bindings 4 {role 1, members 2}, etag 3}}
const IA = '/google.bigtable.admin.v2.BigtableInstanceAdmin/';
const binding = (role, ...members) => fld(4, Buffer.concat([fld(1, role), ...members.map(m => fld(2, m))]));
const setPolicy = (res, ...parts) => Buffer.concat([fld(1, res), fld(2, Buffer.concat(parts))]);
cases.push(
  ['IAM bad etag', IA + 'SetIamPolicy', setPolicy(I, fld(3, '0011223344556677')), bearer(A), 10],
  ['IAM unknown role', IA + 'SetIamPolicy', setPolicy(I, binding('roles/owner', 'user:x')), bearer(A), 3],
  ['IAM group member', IA + 'SetIamPolicy', setPolicy(I, binding('roles/bigtable.reader', 'group:x@y')), bearer(A), 3],
  ['IAM allUsers', IA + 'SetIamPolicy', setPolicy(I, binding('roles/bigtable.admin', 'allUsers')), bearer(A), 3],
  ['IAM empty user', IA + 'SetIamPolicy', setPolicy(I, binding('roles/bigtable.admin', 'user:')), bearer(A), [0, 3]],
  ['IAM 1501 members', IA + 'SetIamPolicy', setPolicy(I, binding('roles/bigtable.reader', ...Array.from({length: 1501}, (_, i) => 'user:u' + i))), bearer(A), 3],
  ['IAM writer sets policy', IA + 'SetIamPolicy', setPolicy(I, binding('roles/bigtable.admin', 'user:writer')), bearer(tok.writer), 7],
  ['IAM other instance', IA + 'SetIamPolicy', setPolicy('projects/p/instances/j', binding('roles/bigtable.admin', 'user:reader')), bearer(A), [5, 7]],
  ['IAM table policy on the instance name', TA + 'SetIamPolicy', setPolicy(I, binding('roles/bigtable.admin', 'user:reader')), bearer(A), [3, 5]],
  ['IAM empty policy', IA + 'SetIamPolicy', setPolicy(I), bearer(A), 0],
);
if (t1r) {
  const t = bearer(t1r);
  cases.push(
    ['t1reader ReadRows t1', BT + 'ReadRows', fld(1, T('t1')), t, 0],
    ['t1reader ReadRows t2', BT + 'ReadRows', fld(1, T('t2')), t, 7],
    // protobuf's last field wins for the gate and the router alike: t1 is read (never t2's rows)
    ['t1reader ReadRows t2 then t1 (dup field 1)', BT + 'ReadRows', Buffer.concat([fld(1, T('t2')), fld(1, T('t1'))]), t, [0, 3, 7], 'SECRETROW'],
    ['t1reader GetTable t2 then t1 (dup field 1)', TA + 'GetTable', Buffer.concat([fld(1, T('t2')), fld(1, T('t1'))]), t, [0, 3, 7], 'tables/t2'],
    ['t1reader ReadRows t1 + view of t2', BT + 'ReadRows', Buffer.concat([fld(1, T('t1')), fld(9, T('t2') + '/authorizedViews/v')]), t, [0, 3, 12]],
    ['t1reader ReadRows view of t2 only', BT + 'ReadRows', fld(9, T('t2') + '/authorizedViews/v'), t, [3, 7, 12]],
    ['t1reader ReadRows other instance t1', BT + 'ReadRows', fld(1, 'projects/p/instances/j/tables/t1'), t, [3, 5, 7]],
    ['t1reader ReadRows t1/../t2', BT + 'ReadRows', fld(1, T('t1/../t2')), t, [3, 5, 7]],
    ['t1reader SampleRowKeys t2', BT + 'SampleRowKeys', fld(1, T('t2')), t, 7],
    ['t1reader MutateRow t1', BT + 'MutateRow', fld(1, T('t1')), t, 7],
    ['t1reader GetTable t1', TA + 'GetTable', fld(1, T('t1')), t, 0],
    ['t1reader GetTable t2', TA + 'GetTable', fld(1, T('t2')), t, 7],
    ['t1reader ListTables', TA + 'ListTables', fld(1, I), t, 7],
    ['t1reader CheckConsistency t2', TA + 'CheckConsistency', Buffer.concat([fld(1, T('t2')), fld(2, 'x')]), t, 7],
    ['t1reader GetIamPolicy t1', TA + 'GetIamPolicy', fld(1, T('t1')), t, 7],
    ['t1reader ListOperations', LRO + 'ListOperations', fld(4, 'operations'), t, 7],
    ['t1reader GetOperation', LRO + 'GetOperation', fld(1, 'operations/x'), t, 7],
    ['t1reader ListBackups', TA + 'ListBackups', fld(1, I + '/clusters/east'), t, 7],
    ['t1reader GenInitialCS t2', BT + 'GenerateInitialChangeStreamPartitions', fld(1, T('t2')), t, 7],
    ['t1reader ReadChangeStream t2', BT + 'ReadChangeStream', fld(1, T('t2')), t, 7],
  );
}

(async () => {
  let bad = 0;
  for (const [name, path, body, headers, want, forbid] of cases) {
    const r = await call(path, body, headers);
    const got = r.status === null ? 'err' : r.status;
    const leak = forbid && Buffer.concat(r.body).includes(forbid);
    const ok = (Array.isArray(want) ? want.includes(got) : want === got) && !leak;
    if (!ok) bad++;
    console.log(`${ok ? 'ok  ' : 'FAIL'} ${name}: got ${got} want ${JSON.stringify(want)} ` +
                `${(r.message || r.err || '').slice(0, 140)}`);
  }
  process.exit(bad ? 1 : 0);
})();
