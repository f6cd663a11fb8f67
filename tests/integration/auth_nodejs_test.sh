#!/usr/bin/env bash
# auth_nodejs_test.sh — IAM through the official Node.js client (@google-cloud/bigtable, installed
# by nodejs_client_test.sh's `npm ci` into the build tree's nodejs-deps) against strata-router
# with --auth-file over TLS (sslCreds: the test CA and a bearer token): instance getIamPolicy,
# setIamPolicy (etag checked: ABORTED when stale), testIamPermissions before and after a binding,
# bad roles and members refused, a table's policy letting a principal without roles read that
# table only and going away with the table, testIamPermissions on a table answering each
# permission at its own scope (a table's admin holds none of the instance's), no token (UNAUTHENTICATED), internal methods through
# the router (never served).
# Usage: auth_nodejs_test.sh strata-node strata-router strata (skips, 77, without openssl, node or
# the client package)
set -u
. "$(dirname "$0")/lib.sh"
NODE_BIN=$1
ROUTER_BIN=$2
STRATA=$3
CACHE=${STRATA_NODEJS_CACHE:-$(cd "$(dirname "$STRATA")/.." && pwd)/nodejs-deps}
JS=$(cd "$(dirname "$0")/nodejs" && pwd)/iam_client.js
command -v openssl >/dev/null || { echo "SKIP: openssl not installed"; exit 77; }
command -v node >/dev/null || { echo "SKIP: node not installed"; exit 77; }
if [ ! -f "$CACHE/node_modules/@google-cloud/bigtable/package.json" ]; then
  echo "SKIP: @google-cloud/bigtable is not installed in $CACHE (nodejs_client_test installs it)"
  exit 77
fi

dir=$(make_tmp)
fail=0
ossl() { openssl "$@" >/dev/null 2>&1 || { echo "FAIL: openssl $*"; exit 1; }; }
ossl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=strata-test-ca -keyout "$dir/ca.key" -out "$dir/ca.pem"
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$dir/san.ext"
ossl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout "$dir/srv.key" -out "$dir/srv.csr"
ossl x509 -req -in "$dir/srv.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -set_serial 1001 -days 2 \
  -extfile "$dir/san.ext" -out "$dir/srv.pem"

AF=$dir/principals
tok() { "$STRATA" auth add-principal "$1" --file "$AF" || { echo "FAIL: add-principal $1"; exit 1; }; }
T_ADMIN=$(tok admin); T_READER=$(tok reader); T_NOBODY=$(tok nobody)
"$STRATA" auth grant admin admin --file "$AF" && "$STRATA" auth grant reader reader --file "$AF" ||
  { echo "FAIL: grant"; exit 1; }

start_member "$dir/n1" 1; A1=$NODE_ADDR
cat >"$dir/topology" <<TOPO
project = p
instance = i
[cluster east]
zone = zone-a
node = $A1 $dir/n1
TOPO
start_router "$dir/topology" "$dir/r.log" --tls-cert "$dir/srv.pem" --tls-key "$dir/srv.key" \
  --auth-file "$AF" --audit-log "$dir/audit.log"
P=${ROUTER_ADDR##*:}
# The tables, made by the admin over plain gRPC through the test client would need TLS: use the
# Node client's table admin through a tiny inline script instead.
NODE_PATH="$CACHE/node_modules" timeout 120 node -e '
const fs = require("fs"); const grpc = require("@grpc/grpc-js");
const {Bigtable} = require("@google-cloud/bigtable");
const [port, ca, tok] = process.argv.slice(1);
const call = grpc.credentials.createFromMetadataGenerator((_p, cb) => {
  const md = new grpc.Metadata(); md.add("authorization", "Bearer " + tok); cb(null, md); });
const bt = new Bigtable({projectId: "p", apiEndpoint: "localhost:" + port,
  sslCreds: grpc.credentials.combineChannelCredentials(grpc.credentials.createSsl(fs.readFileSync(ca)), call)});
(async () => { for (const t of ["t1", "t2"]) await bt.instance("i").createTable(t, {families: ["cf"]}); })()
  .then(() => process.exit(0), e => { console.error(e); process.exit(1); });' "$P" "$dir/ca.pem" "$T_ADMIN" ||
  { echo "FAIL: creating the tables"; exit 1; }

out=$(NODE_PATH="$CACHE/node_modules" timeout 180 node "$JS" "$P" "$dir/ca.pem" "$T_ADMIN" "$T_READER" \
  "$T_NOBODY" 2>"$dir/js.err") || { echo "FAIL: iam_client.js: $(cat "$dir/js.err")"; fail=1; }
echo "$out"
want() { # NAME VALUE
  local got
  got=$(printf '%s\n' "$out" | grep -F "$1: " | head -n1 | sed "s/^$1: //")
  if [ "$got" != "$2" ]; then echo "FAIL: $1: want '$2', got '$got'"; fail=1; fi
}
want "initial bindings" 0
want "etag" ACAB
want "reader permissions" "bigtable.tables.readRows"
want "set bindings" "roles/bigtable.user=user:reader"
want "etag changed" yes
want "get after set" "roles/bigtable.user=user:reader"
want "reader permissions after set" "bigtable.tables.mutateRows,bigtable.tables.readRows"
want "stale etag" 10
want "reader setIamPolicy" 7
want "reader getIamPolicy" 7
want "bad role" 3
want "bad member" 3
want "nobody reads t1 before" 7
want "table set" "roles/bigtable.reader=serviceAccount:nobody"
want "table get" "roles/bigtable.reader=serviceAccount:nobody"
want "nobody reads t1 after" OK
want "nobody reads t2" 7
want "nobody permissions on t1" "bigtable.tables.readRows"
want "nobody permissions on t2" OK
want "nobody permissions on a missing table" OK
want "table admin permissions on t1" \
  "bigtable.tables.readRows,bigtable.tables.setIamPolicy,bigtable.tables.update"
want "table admin lists tables" 7
want "instance reader permissions on t2" \
  "bigtable.clusters.get,bigtable.instances.get,bigtable.tables.list,bigtable.tables.readRows"
want "table recreated bindings" 0
want "nobody reads recreated t1" 7
want "table policy of a missing table" 5
want "no token" 16
want "no token read" 16
want "internal as admin" 12
want "internal without token" 16 # UNAUTHENTICATED: anonymous callers learn no paths
want "unknown service without token" 16
grep -q '"method":"/google.bigtable.admin.v2.BigtableInstanceAdmin/SetIamPolicy".*"outcome":"allowed"' \
  "$dir/audit.log" || { echo "FAIL: no audit line for SetIamPolicy"; fail=1; }

kill "$ROUTER_PID"; wait "$ROUTER_PID"; rc=$?
[ "$rc" = 0 ] || { echo "FAIL: router exit $rc"; fail=1; }
if grep -l 'Sanitizer' "$dir"/r*.log; then echo "FAIL: sanitizer report in the router log"; fail=1; fi
[ $fail = 0 ] && echo "PASS" || echo "FAILED"
exit $fail
