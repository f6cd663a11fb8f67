#!/usr/bin/env bash
# sec_hostile_test.sh — hostile clients against a secure instance (`strata up --secure`, one node;
# docs/security.md), most of them through sec_attack.py (raw TLS + HTTP/2 frames):
#   - authorization headers: empty, `Bearer` alone, casing, NUL / CR / LF / non-ASCII bytes (a
#     NUL used to cut the header short, so "Bearer TOKEN\0junk" authenticated as TOKEN), two
#     headers (the first counts), 1 MB values; each role calling admin and internal methods;
#   - SetIamPolicy with 1 MB roles and members, NUL bytes, 10,000 unknown roles, garbage bytes;
#   - no ALPN, TLS 1.0 and 1.1 offers, a TLS 1.2 renegotiation (all refused);
#   - 1,000 idle connections and 300 handshakes stalled mid-ClientHello while a client is served;
#   - SIGHUP reloads of the auth file racing with calls (no call refused);
#   - a node's port with certificates of the cluster CA that expired or are not valid yet;
#   - the audit log on a full device (/dev/full): the router serves, says so once and says when
#     lines are written again; its directory replaced by a file; a file size limit (ulimit -f)
#     cutting a write part-way: no half line is left in the file.
# Usage: sec_hostile_test.sh STRATA MTLS_CALL (skips, 77, without openssl or python3)
set -u
STRATA=$1
CALL=$2
. "$(dirname "$0")/lib.sh"
command -v openssl >/dev/null || { echo "openssl not installed: skipping"; exit 77; }
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
ATTACK="python3 $(dirname "$0")/sec_attack.py"
ROUTER_BIN=$(dirname "$STRATA")/../router/strata-router
instance_init sechostile
expect_match() { # WHAT REGEX GOT
  if printf '%s' "$3" | grep -Eq "$2"; then echo "ok: $1"; else fail "$1: want /$2/, got '$3'"; fi
}

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 --secure >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up --secure"; }
S=$DIR/secure
EAST=$(grep -Eo 'east-0 +127\.0\.0\.1:[0-9]+' "$TMPD/up.out" | grep -Eo '127\.0\.0\.1:[0-9]+')
[ -n "$EAST" ] || fail "node address not in the output of strata up"

$ATTACK tokens "$PORT" "$S/ca.pem" "$S/tokens" || fail "token and IAM attacks"
$ATTACK tls "$PORT" "$S/ca.pem" || fail "TLS offers"
out=$( (sleep 1; echo R; sleep 2) | timeout 30 openssl s_client -connect "127.0.0.1:$PORT" -tls1_2 \
  -alpn h2 -CAfile "$S/ca.pem" -servername localhost 2>&1)
expect_match "TLS 1.2 renegotiation refused" "no renegotiation" "$out"
$ATTACK storm "$PORT" "$S/ca.pem" "$S/tokens" 1000 300 || fail "connection storm"
$ATTACK hup "$PORT" "$S/ca.pem" "$S/tokens" "$(cat "$DIR/run/router.pid")" "$S/principals" 100 ||
  fail "SIGHUP reloads racing with calls"

# ---- a node's port: certificates of the cluster CA outside their validity ----
C=$TMPD/ca
mkdir -p "$C"
echo 1000 >"$C/serial"
: >"$C/index.txt"
cat >"$C/ca.cnf" <<EOF
[ca]
default_ca = c
[c]
database = $C/index.txt
new_certs_dir = $C
serial = $C/serial
default_md = sha256
policy = p
unique_subject = no
[p]
organizationName = optional
organizationalUnitName = optional
commonName = supplied
EOF
printf 'extendedKeyUsage=serverAuth,clientAuth\n' >"$C/ext"
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -subj "/O=Strata/OU=strata-router/CN=hostile" -keyout "$C/r.key" -out "$C/r.csr" >/dev/null 2>&1 ||
  fail "openssl req"
sign() { # NAME OPENSSL-CA-DATE-ARGS...
  local name=$1
  shift
  openssl ca -batch -config "$C/ca.cnf" -cert "$S/ca.pem" -keyfile "$S/ca.key" "$@" -in "$C/r.csr" \
    -out "$C/$name.pem" -extfile "$C/ext" -notext >/dev/null 2>&1 || fail "openssl ca $name"
}
sign expired -startdate 20200101000000Z -enddate 20200201000000Z
sign future -startdate 20990101000000Z -enddate 20991201000000Z
sign valid -days 2
ncall() { "$CALL" "$EAST" /strata.internal.v1.Node/GetStatus --ca "$S/ca.pem" --cert "$C/$1.pem" \
  --key "$C/r.key" --role strata-node --name localhost 2>/dev/null | tail -n1; }
expect_match "node: an expired router certificate is refused" '^UNAVAILABLE' "$(ncall expired)"
expect_match "node: a router certificate not valid yet is refused" '^UNAVAILABLE' "$(ncall future)"
expect_match "node: the same key with a valid certificate is served" '^OK' "$(ncall valid)"

# ---- the audit log: full device, directory gone, a write cut part-way ----
# A second router of the instance, with its own audit log; denied calls are audited.
start_audit_router() { # NAME AUDIT_PATH [ULIMIT_F]
  local port
  port=$(free_port)
  (
    if [ -n "${3:-}" ]; then trap '' XFSZ; ulimit -f "$3"; fi
    exec "$ROUTER_BIN" --config "$DIR/topology" --listen "127.0.0.1:$port" --tls-cert "$S/router.pem" \
      --tls-key "$S/router.key" --internal-ca "$S/ca.pem" --auth-file "$S/principals" --audit-log "$2"
  ) >"$TMPD/$1.log" 2>&1 &
  PIDS+=($!)
  wait_line "$TMPD/$1.log" 'listening on 127' >/dev/null || fail "router $1 did not start"
  APORT=$port
}
denied() { # PORT N: N CreateTable calls of the reader, each denied and audited
  python3 - "$1" "$2" "$S/ca.pem" "$S/tokens" <<'EOF'
import sys, os
sys.path.insert(0, os.environ['ATTACK_DIR'])
import sec_attack as a
port, n, ca, tok = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], a.tokens_of(sys.argv[4])
got = [a.call(port, ca, a.TA + 'CreateTable', a.fld(1, a.INST) + a.fld(2, 'x'), a.bearer(tok['reader']))
       for _ in range(n)]
ok = a.call(port, ca, a.TA + 'ListTables', a.fld(1, a.INST), a.bearer(tok['admin']))
print('denied=%d served=%s' % (got.count('7'), ok))
EOF
}
export ATTACK_DIR
ATTACK_DIR=$(dirname "$0")

mkdir -p "$TMPD/full"
ln -s /dev/full "$TMPD/full/audit.log"
start_audit_router full "$TMPD/full/audit.log"
expect_match "audit log on a full device: calls answered" '^denied=20 served=0$' "$(denied "$APORT" 20)"
expect_match "a full audit log is reported once" '^1$' \
  "$(grep -c 'audit log write failed' "$TMPD/full.log")"
rm "$TMPD/full/audit.log"
denied "$APORT" 1 >/dev/null
wait_line "$TMPD/full.log" 'audit log written again.*lost_lines=[0-9]+' >/dev/null ||
  fail "no recovery line for the audit log"
expect_match "audit lines written again after the device frees" '"outcome":"denied"' \
  "$(cat "$TMPD/full/audit.log")"

mkdir -p "$TMPD/gone"
start_audit_router gone "$TMPD/gone/audit.log"
mv "$TMPD/gone" "$TMPD/gone.old"
echo "not a directory" >"$TMPD/gone"
expect_match "audit directory replaced by a file: calls answered" '^denied=5 served=0$' \
  "$(denied "$APORT" 5)"
rm "$TMPD/gone"
mv "$TMPD/gone.old" "$TMPD/gone"
denied "$APORT" 1 >/dev/null
wait_line "$TMPD/gone.log" 'audit log open again' >/dev/null || fail "the audit log did not reopen"

mkdir -p "$TMPD/fsize"
start_audit_router fsize "$TMPD/fsize/audit.log" 8
expect_match "audit log past the file size limit: calls answered" '^denied=40 served=0$' \
  "$(denied "$APORT" 40)"
wait_line "$TMPD/fsize.log" 'audit log write failed' >/dev/null || fail "no write failure logged"
bad=$(python3 -c '
import json, sys
n = 0
for line in open(sys.argv[1], "rb").read().split(b"\n")[:-1]:
    try: json.loads(line)
    except ValueError: n += 1
tail = open(sys.argv[1], "rb").read()[-1:]
print("bad=%d end=%r" % (n, tail))' "$TMPD/fsize/audit.log")
expect_match "audit log cut by a write failure holds whole lines only" "^bad=0 end=b'\\\\n'$" "$bad"
echo "PASS"
