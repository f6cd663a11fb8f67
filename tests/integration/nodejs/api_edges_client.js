// api_edges_client.js — edges of the data, table admin and instance admin APIs where Strata once
// answered unlike Cloud Bigtable's documented behaviour, through the official Node.js client's
// generated clients against BIGTABLE_EMULATOR_HOST (a `strata up` of clusters east and west).
// Each case prints `ok NAME` or `FAIL NAME: detail`; exit 1 when one failed.
'use strict';
const {Bigtable, v2} = require('@google-cloud/bigtable');

const bt = new Bigtable({projectId: 'p'});
const data = new v2.BigtableClient(bt.options.BigtableClient);
const admin = new v2.BigtableTableAdminClient(bt.options.BigtableTableAdminClient);
const inst = new v2.BigtableInstanceAdminClient(bt.options.BigtableInstanceAdminClient);
const INST = 'projects/p/instances/i';
const TN = t => INST + '/tables/' + t;
const B = s => Buffer.from(s);
const NR = {retry: null};
let failed = 0;

function check(name, cond, detail) {
  console.log(cond ? 'ok ' + name : 'FAIL ' + name + ': ' + detail);
  if (!cond) failed++;
}

// "0" for success, else "CODE details".
async function outcome(fn) {
  try {
    await fn();
    return '0';
  } catch (e) {
    return e.code + ' ' + e.details;
  }
}

// Drains a server stream: "0 n" (messages) or "CODE details".
function drain(stream) {
  return new Promise(resolve => {
    let n = 0;
    stream.on('data', () => n++);
    stream.on('error', e => resolve(e.code + ' ' + e.details));
    stream.on('end', () => resolve('0 ' + n));
  });
}

const set = (f, q, v) => ({setCell: {familyName: f, columnQualifier: B(q), value: B(v),
  timestampMicros: 1000}});

// The values of row `key`, through one app profile.
async function rowValues(table, key, appProfileId) {
  const out = [];
  await new Promise((resolve, reject) => data.readRows({tableName: TN(table), appProfileId,
    rows: {rowKeys: [B(key)]}}, NR).on('data', r => {
    for (const c of r.chunks) if (c.value && c.value.length) out.push(String(c.value));
  }).on('error', reject).on('end', resolve));
  return out.join(',');
}

// A Data Boost profile is read-only (Cloud Bigtable: no writes or deletes through Data Boost):
// every write method is FAILED_PRECONDITION naming Data Boost, nothing changes, reads work.
async function dataBoostReadOnly() {
  await admin.createTable({parent: INST, tableId: 'api_db', table: {columnFamilies: {cf: {}}}});
  await data.mutateRow({tableName: TN('api_db'), rowKey: B('r'), mutations: [set('cf', 'q', 'v')]});
  await inst.createAppProfile({parent: INST, appProfileId: 'api_db', appProfile: {
    singleClusterRouting: {clusterId: 'east'},
    dataBoostIsolationReadOnly: {computeBillingOwner: 'HOST_PAYS'}}});
  const req = {tableName: TN('api_db'), appProfileId: 'api_db', rowKey: B('r')};
  const refused = got => got.startsWith('9 ') && /Data Boost/.test(got);
  const writes = {
    mutate_row_set: () => data.mutateRow({...req, mutations: [set('cf', 'q', 'changed')]}, NR),
    mutate_row_delete: () => data.mutateRow({...req, mutations: [{deleteFromRow: {}}]}, NR),
    check_and_mutate: () => data.checkAndMutateRow({...req,
      trueMutations: [{deleteFromRow: {}}], falseMutations: [{deleteFromRow: {}}]}, NR),
    read_modify_write: () => data.readModifyWriteRow({...req,
      rules: [{familyName: 'cf', columnQualifier: B('q'), appendValue: B('x')}]}, NR),
  };
  for (const [name, fn] of Object.entries(writes)) {
    const got = await outcome(fn);
    check('data_boost_' + name + '_refused', refused(got), got);
  }
  const rows = await drain(data.mutateRows({tableName: TN('api_db'), appProfileId: 'api_db',
    entries: [{rowKey: B('r'), mutations: [{deleteFromRow: {}}]}]}, NR));
  check('data_boost_mutate_rows_refused', refused(rows), rows);
  const got = await rowValues('api_db', 'r', 'api_db');
  check('data_boost_reads_unchanged', got === 'v', got);
}

// SetIamPolicy's update_mask (google.iam.v1): only the named fields change, default
// "bindings, etag"; a mask without bindings keeps every grant; paths Strata does not keep are
// INVALID_ARGUMENT rather than a change dropped.
async function iamUpdateMask() {
  await admin.createTable({parent: INST, tableId: 'api_iam', table: {columnFamilies: {cf: {}}}});
  const R = TN('api_iam');
  const grants = async () => (await admin.getIamPolicy({resource: R}))[0].bindings
    .map(b => b.role + '=' + b.members.join('+')).sort().join(',');
  const two = 'roles/bigtable.admin=user:ops,roles/bigtable.reader=user:alice';
  await admin.setIamPolicy({resource: R, policy: {bindings: [
    {role: 'roles/bigtable.reader', members: ['user:alice']},
    {role: 'roles/bigtable.admin', members: ['user:ops']}]}});
  check('iam_mask_setup', await grants() === two, await grants());
  const etag = await outcome(() => admin.setIamPolicy({resource: R, policy: {bindings: []},
    updateMask: {paths: ['etag']}}));
  let got = await grants();
  check('iam_mask_etag_keeps_bindings', etag === '0' && got === two, etag + ' ' + got);
  const audit = await outcome(() => admin.setIamPolicy({resource: R, policy: {auditConfigs: [
    {service: 'bigtableadmin.googleapis.com', auditLogConfigs: [{logType: 'DATA_READ'}]}]},
  updateMask: {paths: ['audit_configs']}}));
  got = await grants();
  check('iam_mask_audit_configs_refused', audit.startsWith('3 ') && got === two, audit + ' ' + got);
  const bad = await outcome(() => admin.setIamPolicy({resource: R, policy: {bindings: []},
    updateMask: {paths: ['nonsense']}}));
  check('iam_mask_unknown_path_refused', bad.startsWith('3 ') && await grants() === two, bad);
  await admin.setIamPolicy({resource: R, policy: {bindings: [
    {role: 'roles/bigtable.user', members: ['user:bob']}]}, updateMask: {paths: ['bindings']}});
  got = await grants();
  check('iam_mask_bindings_replaces', got === 'roles/bigtable.user=user:bob', got);
}

// Table.View: REPLICATION_VIEW gives the name and cluster_states, ENCRYPTION_VIEW the same with
// encryption_info (Google-default encryption), FULL everything — in ListTables as in GetTable.
async function tableViews() {
  await admin.createTable({parent: INST, tableId: 'api_v', table: {columnFamilies: {cf: {}}}});
  const states = t => Object.keys(t.clusterStates || {}).sort().map(c =>
    c + '=' + t.clusterStates[c].replicationState).join(',');
  const enc = t => Object.values(t.clusterStates || {}).map(s => (s.encryptionInfo || [])
    .map(e => e.encryptionType).join('+')).join(',');
  const fams = t => Object.keys(t.columnFamilies || {}).join(',');
  const want = 'east=READY,west=READY';
  const one = async view => {
    const [ts] = await admin.listTables({parent: INST, view}, {autoPaginate: false});
    return ts.find(t => t.name === TN('api_v'));
  };
  const lr = await one('REPLICATION_VIEW');
  check('list_tables_replication_view', states(lr) === want && fams(lr) === '',
    states(lr) + ' / ' + fams(lr));
  const lf = await one('FULL');
  check('list_tables_full', states(lf) === want && fams(lf) === 'cf' &&
    enc(lf) === 'GOOGLE_DEFAULT_ENCRYPTION,GOOGLE_DEFAULT_ENCRYPTION', states(lf) + ' / ' +
    fams(lf) + ' / ' + enc(lf));
  const le = await one('ENCRYPTION_VIEW');
  check('list_tables_encryption_view', states(le) === want && fams(le) === '' &&
    enc(le) === 'GOOGLE_DEFAULT_ENCRYPTION,GOOGLE_DEFAULT_ENCRYPTION', states(le) + ' / ' +
    enc(le));
  const [ge] = await admin.getTable({name: TN('api_v'), view: 'ENCRYPTION_VIEW'});
  check('get_table_encryption_view', states(ge) === want &&
    enc(ge) === 'GOOGLE_DEFAULT_ENCRYPTION,GOOGLE_DEFAULT_ENCRYPTION', states(ge) + ' / ' + enc(ge));
  const [gr] = await admin.getTable({name: TN('api_v'), view: 'REPLICATION_VIEW'});
  check('get_table_replication_view', states(gr) === want && enc(gr) === ',', states(gr));
  const [gs] = await admin.getTable({name: TN('api_v')});
  check('get_table_schema_view', fams(gs) === 'cf' && states(gs) === '', fams(gs));
  // a view number Table.View does not name is refused by both, not answered as some view
  const code = async fn => { try { await fn(); return 0; } catch (e) { return e.code; } };
  const gbad = await code(() => admin.getTable({name: TN('api_v'), view: 99}));
  const lbad = await code(() => admin.listTables({parent: INST, view: 99}, {autoPaginate: false}));
  check('table_view_unknown_refused', gbad === 3 && lbad === 3, 'get ' + gbad + ', list ' + lbad);
  // so is a TimestampGranularity number the enum does not name (it was stored as MILLIS); MILLIS
  // itself is taken
  const g99 = await code(() => admin.createTable({parent: INST, tableId: 'api_g99',
    table: {granularity: 99, columnFamilies: {cf: {}}}}));
  const [ex] = await admin.listTables({parent: INST}, {autoPaginate: false});
  check('create_table_granularity_unknown_refused', g99 === 3 &&
    !ex.some(t => t.name === TN('api_g99')), 'code ' + g99);
  const gms = await code(() => admin.createTable({parent: INST, tableId: 'api_gms',
    table: {granularity: 'MILLIS', columnFamilies: {cf: {}}}}));
  check('create_table_granularity_millis', gms === 0, 'code ' + gms);
}

// Data calls naming an authorized or a materialized view (as the clients send for such an
// object: the view's name and no table_name) are UNIMPLEMENTED naming the feature, not
// "invalid table name ''".
async function viewNames() {
  const AV = TN('api_db') + '/authorizedViews/v1';
  const MV = INST + '/materializedViews/mv1';
  const av = got => got.startsWith('12 ') && /authorized views/.test(got);
  const mv = got => got.startsWith('12 ') && /materialized views/.test(got);
  const m = [set('cf', 'q', 'x')];
  const cases = [
    ['read_rows', av, () => drain(data.readRows({authorizedViewName: AV}, NR))],
    ['read_rows_materialized', mv, () => drain(data.readRows({materializedViewName: MV}, NR))],
    ['sample_row_keys', av, () => drain(data.sampleRowKeys({authorizedViewName: AV}, NR))],
    ['sample_row_keys_materialized', mv,
      () => drain(data.sampleRowKeys({materializedViewName: MV}, NR))],
    ['mutate_rows', av, () => drain(data.mutateRows({authorizedViewName: AV,
      entries: [{rowKey: B('r'), mutations: m}]}, NR))],
    ['mutate_row', av, () => outcome(() => data.mutateRow({authorizedViewName: AV, rowKey: B('r'),
      mutations: m}, NR))],
    ['check_and_mutate_row', av, () => outcome(() => data.checkAndMutateRow({
      authorizedViewName: AV, rowKey: B('r'), trueMutations: m}, NR))],
    ['read_modify_write_row', av, () => outcome(() => data.readModifyWriteRow({
      authorizedViewName: AV, rowKey: B('r'),
      rules: [{familyName: 'cf', columnQualifier: B('q'), appendValue: B('y')}]}, NR))],
    // with the table named too: still refused, never the whole table past the view's limits
    ['read_rows_with_table', av, () => drain(data.readRows({tableName: TN('api_db'),
      authorizedViewName: AV}, NR))],
  ];
  for (const [name, ok, fn] of cases) {
    const got = await fn();
    check('view_name_' + name, ok(got), got);
  }
}

// ListAppProfiles pages with tokens it handed out; any other token is INVALID_ARGUMENT (it was
// read as a profile id: a garbage token listed nothing, silently).
async function profilePages() {
  const page = async req => {
    try {
      const [ps, next] = await inst.listAppProfiles({parent: INST, ...req}, {autoPaginate: false});
      return {code: 0, ids: ps.map(p => p.name.split('/').pop()), next};
    } catch (e) {
      return {code: e.code, details: e.details};
    }
  };
  const all = (await page({})).ids || [];
  const seen = [];
  let next = {pageSize: 1};
  for (let i = 0; next && i < 100; i++) {
    const p = await page({pageSize: 1, pageToken: next.pageToken});
    if (p.code) break;
    seen.push(...p.ids);
    next = p.next && p.next.pageToken ? p.next : null;
  }
  check('list_app_profiles_pages_walk', all.length >= 2 && seen.join() === all.join(),
    JSON.stringify({seen, all}));
  for (const tok of ['x', 'zzzz', 'default']) {
    const bad = await page({pageToken: tok});
    check('list_app_profiles_bad_token_' + tok, bad.code === 3, JSON.stringify(bad));
  }
}

// A max_age that is not a google.protobuf.Duration is refused saying so, not "set a longer
// age"; one under 1 ms keeps its own message.
async function gcMaxAgeDuration() {
  const ct = (id, maxAge) => outcome(() => admin.createTable({parent: INST, tableId: id,
    table: {columnFamilies: {f: {gcRule: {maxAge}}}}}));
  const invalid = got => got.startsWith('3 ') && /not a valid google.protobuf.Duration/.test(got);
  for (const [name, age] of [['huge', {seconds: 1000000000000}],
    ['past_max', {seconds: 315576000001}], ['nanos_2e9', {nanos: 2000000000}],
    ['mixed_signs', {seconds: 10, nanos: -5}]]) {
    const got = await ct('api_age_' + name, age);
    check('gc_max_age_' + name, invalid(got), got);
  }
  const short = await ct('api_age_short', {nanos: 500});
  check('gc_max_age_short', short.startsWith('3 ') && /at least 1 ms/.test(short), short);
}

// A non-aggregate value_type (String, Bytes, Int64: cbt setvaluetype) is not called an
// aggregate when it is refused (docs/bigtable.md says why it is not stored yet).
async function valueTypes() {
  const ct = (id, valueType) => outcome(() => admin.createTable({parent: INST, tableId: id,
    table: {columnFamilies: {cf: {valueType}}}}));
  for (const [name, vt] of [['string', {stringType: {encoding: {utf8Bytes: {}}}}],
    ['bytes', {bytesType: {encoding: {raw: {}}}}], ['int64', {int64Type: {}}]]) {
    const got = await ct('api_vt_' + name, vt);
    check('value_type_' + name + '_not_aggregate', got.startsWith('12 ') &&
      /not an aggregate/.test(got) && !/aggregate column families/.test(got), got);
  }
  const agg = await ct('api_vt_agg', {aggregateType: {inputType: {int64Type: {}}, sum: {}}});
  check('value_type_aggregate', agg.startsWith('12 ') && /aggregate value_type/.test(agg), agg);
  await admin.createTable({parent: INST, tableId: 'api_vt', table: {columnFamilies: {cf: {}}}});
  const upd = await outcome(() => admin.modifyColumnFamilies({name: TN('api_vt'), modifications: [
    {id: 'cf', update: {valueType: {stringType: {}}}, updateMask: {paths: ['value_type']}}]}));
  check('value_type_update_not_aggregate', upd.startsWith('12 ') &&
    !/aggregate column families are not supported/.test(upd), upd);
}

// Table fields Strata does not implement are refused at CreateTable naming the field, not
// dropped: automated backups asked for and silently never made; a row key schema. Nothing is
// created.
async function unimplementedTableFields() {
  const ct = (id, table) => outcome(() => admin.createTable({parent: INST, tableId: id,
    table: Object.assign({columnFamilies: {cf: {}}}, table)}));
  const abp = await ct('api_abp', {automatedBackupPolicy: {retentionPeriod: {seconds: 259200},
                                                         frequency: {seconds: 86400}}});
  check('automated_backup_policy', abp.startsWith('12 ') && /automated_backup_policy/.test(abp),
        abp);
  const rks = await ct('api_rks', {rowKeySchema: {fields: [{fieldName: 'a',
                                                            type: {bytesType: {}}}]}});
  check('row_key_schema', rks.startsWith('12 ') && /row_key_schema/.test(rks), rks);
  const [tables] = await admin.listTables({parent: INST});
  const made = tables.map(t => t.name).filter(n => /api_(abp|rks)$/.test(n));
  check('nothing_created', made.length === 0, made.join(','));
}

(async () => {
  await dataBoostReadOnly();
  await iamUpdateMask();
  await tableViews();
  await viewNames();
  await profilePages();
  await gcMaxAgeDuration();
  await valueTypes();
  await unimplementedTableFields();
  process.exit(failed ? 1 : 0);
})().catch(e => {
  console.log('FAIL unexpected error: ' + (e.stack || e));
  process.exit(1);
});
