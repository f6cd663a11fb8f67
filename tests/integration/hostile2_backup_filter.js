// hostile2_backup_filter.js — ListBackups filters comparing times and sizes with values that are
// not what RFC 3339 or int64 allow, through the official Node.js client (@google-cloud/bigtable)
// at BIGTABLE_EMULATOR_HOST (projects/p/instances/i, at least one READY backup made in 2026 or
// later). Such a value must be INVALID_ARGUMENT: it used to be normalized (month 13, February 31,
// hour 99, a signed year, a +25:00 offset) or saturated (a size past int64), so the filter compared
// with an instant or size nobody wrote and answered a silently wrong page. Valid forms must still
// parse and select correctly. Run by hostile2_backup_test.sh; exits 1 on the first mismatch.
const {Bigtable} = require('@google-cloud/bigtable');
const bt = new Bigtable({projectId: 'p'});
const A = 'projects/p/instances/i/clusters/-';
function list(filter) {
  return new Promise((res) => bt.request({client: 'BigtableTableAdminClient', method: 'listBackups',
      reqOpts: {parent: A, filter}, gaxOpts: {timeout: 30000, autoPaginate: false}},
      (err, r) => res(err ? {code: err.code, msg: String(err.message)} : {code: 0, n: r.length})));
}
let failed = 0;
async function expect(filter, code, n) {
  const got = await list(filter);
  const ok = got.code === code && (n === undefined || got.n === n || (n === '>0' && got.n > 0));
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${JSON.stringify(filter)}: code ${got.code}` +
              (got.code ? ` ${got.msg.slice(0, 100)}` : `, ${got.n} backups`) +
              (ok ? '' : ` (want code ${code}${n === undefined ? '' : ', ' + n + ' backups'})`));
  if (!ok) failed++;
}
(async () => {
  for (const t of ['2026-13-01T00:00:00Z', '2026-00-10T00:00:00Z', '2026-01-00T00:00:00Z',
                   '2026-02-31T00:00:00Z', '2026-04-31T00:00:00Z', '2025-02-29T00:00:00Z',
                   '2026-01-45T00:00:00Z', '2026-01-01T24:00:00Z', '2026-01-01T99:99:99Z',
                   '2026-01-01T00:60:00Z', '2026-01-01T00:00:61Z', '+026-01-01T00:00:00Z',
                   '2026-+1-01T00:00:00Z', '2026-1-01T00:00:00Z', '2026-01-01T00:00:00+25:00',
                   '2026-01-01T00:00:00+01:60', '2026-01-01T00:00:00+1:00', '2026-01-01T00:00:00+01:0',
                   '2026-01-01T00:00:00+01', '2026-01-01T00:00:00'])
    await expect(`start_time > ${t}`, 3);
  for (const s of ['99999999999999999999999999', '9223372036854775808', '-9223372036854775809'])
    await expect(`size_bytes > ${s}`, 3);
  // valid forms still work, and select what they say
  await expect('start_time > 2000-01-01T00:00:00Z', 0, '>0');
  await expect('start_time < 2000-01-01T00:00:00Z', 0, 0);
  await expect('start_time > 2024-02-29T23:59:59.999999Z', 0, '>0');
  await expect('start_time < 2000-01-01T00:30:00+01:00', 0, 0);
  await expect('start_time > 1999-12-31t23:00:00-01:00', 0, '>0');
  await expect('start_time < 9999-12-31T23:59:59Z', 0, '>0');
  await expect('size_bytes < 9223372036854775807', 0, '>0');
  await expect('size_bytes > -9223372036854775808', 0, '>0');
  process.exit(failed ? 1 : 0);
})().catch((e) => { console.log('FAIL', e.code, e.message); process.exit(1); });
