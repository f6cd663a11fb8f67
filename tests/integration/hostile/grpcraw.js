// grpcraw.js PORT PATH TIMEOUT_MS — sends one gRPC message (hex on stdin) with node:http2 and prints
// JSON {status, message, data (base64 of the response body), err}: a decoder of HPACK-encoded
// statuses for the stdlib-only Python scripts of this folder.
const http2 = require('http2');
const [port, path, tmo] = process.argv.slice(2);
let hex = '';
process.stdin.on('data', d => hex += d).on('end', () => {
  const body = Buffer.from(hex.trim(), 'hex');
  const s = http2.connect('http://127.0.0.1:' + port);
  const out = {status: null, message: null, data: '', err: null};
  const chunks = [];
  let fin = false;
  const done = () => { if (fin) return; fin = true; out.data = Buffer.concat(chunks).toString('base64'); s.destroy(); process.stdout.write(JSON.stringify(out) + "\n", () => process.exit(0)); };
  const t = setTimeout(() => { out.err = 'timeout'; done(); }, +tmo);
  s.on('error', e => { out.err = String(e); done(); });
  const hdr = Buffer.alloc(5); hdr.writeUInt32BE(body.length, 1);
  const r = s.request({':method': 'POST', ':path': path, 'content-type': 'application/grpc', te: 'trailers'});
  r.on('response', h => { if (h['grpc-status'] !== undefined) { out.status = +h['grpc-status']; out.message = h['grpc-message'] || ''; } });
  r.on('trailers', h => { out.status = +h['grpc-status']; out.message = decodeURIComponent(h['grpc-message'] || ''); });
  r.on('data', d => chunks.push(d));
  r.on('end', () => { clearTimeout(t); done(); });
  r.on('error', e => { out.err = String(e); clearTimeout(t); done(); });
  r.end(Buffer.concat([hdr, body]));
});
