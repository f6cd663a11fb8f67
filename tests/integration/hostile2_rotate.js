// hostile2_rotate.js PORT CA TOKEN ROWS ROTATE_CMD... — a token rotated while its principal's calls
// run, through the official Node.js client over TLS (hostile2_sec_test.sh; docs/security.md,
// Rotation and revocation): a ReadRows scan of ROWS rows is started with TOKEN and read slowly;
// once a tenth of it has arrived ROTATE_CMD runs (it rotates the principal and waits until the
// router refuses the old token). Then the scan must still end with every row, whole and in order,
// and a new call with TOKEN on the same client (its open connection) must be UNAUTHENTICATED (16).
// Prints one line per check; exits 1 on a failed one.
'use strict';
const fs = require('fs');
const {execFileSync} = require('child_process');
const {Bigtable} = require('@google-cloud/bigtable');
const grpc = require('@grpc/grpc-js');
const [port, caFile, tok, rowsArg, ...rotate] = process.argv.slice(2);
const ROWS = +rowsArg;
const ssl = grpc.credentials.createSsl(fs.readFileSync(caFile));
const md = grpc.credentials.createFromMetadataGenerator((_p, cb) => {
  const m = new grpc.Metadata();
  m.add('authorization', 'Bearer ' + tok);
  cb(null, m);
});
const bt = new Bigtable({projectId: 'p', apiEndpoint: 'localhost:' + port,
                         sslCreds: grpc.credentials.combineChannelCredentials(ssl, md)});
const table = bt.instance('i').table('big');
let bad = 0;
const check = (what, ok, got) => { console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}: ${got}`); if (!ok) bad++; };
(async () => {
  let n = 0, order = true, whole = true, last = '', rotated = false;
  await new Promise((resolve) => {
    const s = table.createReadStream({decode: false});
    s.on('data', (row) => {
      if (row.id <= last) order = false;
      last = row.id;
      const cells = row.data.f && row.data.f.q;
      if (!cells || !cells.length || cells[0].value.length !== 1024) whole = false;
      n++;
      if (!rotated && n >= ROWS / 10) {
        rotated = true;
        s.pause();
        execFileSync(rotate[0], rotate.slice(1), {stdio: 'inherit'});
        s.resume();
      }
    });
    s.on('error', (e) => { check('scan across the rotation ends cleanly', false, `${e.code} ${e.message}`); resolve(); });
    s.on('end', resolve);
  });
  check('scan across the rotation read every row', n === ROWS && rotated, `${n} of ${ROWS}, rotated ${rotated}`);
  check('rows in order and whole', order && whole, `order ${order}, whole ${whole}`);
  let code = 0;
  try { await table.getRows({limit: 1}); } catch (e) { code = e.code; }
  check('a new call with the rotated token', code === 16, `code ${code}`);
  process.exit(bad ? 1 : 0);
})().catch((e) => { console.log('FAIL', e.code, e.message); process.exit(1); });
