#!/usr/bin/env bash
# secure_cert_expired_test.sh — a router or node whose own certificate is out of its validity
# refuses to start (docs/security.md, "Certificates"): on `strata up --secure`, certificates
# signed by the instance's own CA with the same keys,
#   1. the router's, expired (2020-2021): `strata restart router` fails, and the router's message
#      names the file, both dates and the commands that make a new one;
#   2. east-0's, not yet valid (2099): `strata restart east-0` fails naming "not yet valid";
#   3. the good certificates back: both restart, and `strata backup list` works (TLS to the router).
# It used to say "ready" and "Restarted router." with a certificate every client then refused.
# Skips (77) without openssl.
# Usage: secure_cert_expired_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v openssl >/dev/null || { echo "openssl not installed: skipping"; exit 77; }
instance_init secure_cert_expired_test
FAIL_TAIL_LINES=20
expect_match() { # WHAT REGEX GOT
  if printf '%s' "$3" | grep -Eq -- "$2"; then echo "ok: $1"; else fail "$1: want /$2/, got '$3'"; fi
}

"$STRATA" up --dir "$DIR" --port "$PORT" --clusters 1 --nodes 1 --secure >"$TMPD/up.out" 2>&1 ||
  { cat "$TMPD/up.out"; fail "strata up --secure"; }
S=$DIR/secure
C=$TMPD/ca
mkdir -p "$C/db" && : >"$C/db/index.txt" && echo 01 >"$C/db/serial"
cat >"$C/ca.cnf" <<EOF
[ca]
default_ca = c
[c]
database = $C/db/index.txt
serial = $C/db/serial
new_certs_dir = $C/db
default_md = sha256
policy = p
unique_subject = no
[p]
organizationName = optional
organizationalUnitName = optional
commonName = supplied
[ext]
subjectAltName = DNS:localhost, IP:127.0.0.1
extendedKeyUsage = serverAuth, clientAuth
EOF
# sign NAME OU OUT DATES...: a certificate for NAME's key (the instance's), signed by its CA.
sign() {
  local name=$1 ou=$2 out=$3
  shift 3
  openssl req -new -key "$S/$name.key" -subj "/O=Strata/OU=$ou/CN=$name" -out "$C/$name.csr" \
    >/dev/null 2>&1 || fail "openssl req $name"
  openssl ca -batch -config "$C/ca.cnf" -cert "$S/ca.pem" -keyfile "$S/ca.key" -in "$C/$name.csr" \
    -out "$out" -extensions ext -notext "$@" >/dev/null 2>&1 || fail "openssl ca $name"
}
cp "$S/router.pem" "$C/router.good" && cp "$S/east-0.pem" "$C/east-0.good" || fail "copies"

echo "== 1. the router's certificate expired"
sign router strata-router "$S/router.pem" -startdate 20200101000000Z -enddate 20210101000000Z
out=$(timeout 120 "$STRATA" restart router --dir "$DIR" 2>&1)
rc=$?
[ "$rc" != 0 ] || fail "strata restart router with an expired certificate ended 0: $out"
expect_match "the file and that it expired" "certificate $S/router.pem has expired" "$out"
expect_match "both dates" 'valid from 2020-01-01 00:00:00Z to 2021-01-01 00:00:00Z' "$out"
expect_match "what to do" "strata down --dir $DIR.*strata up --dir $DIR --secure" "$out"

echo "== 2. east-0's certificate not yet valid"
sign east-0 strata-node "$S/east-0.pem" -startdate 20990101000000Z -enddate 20991201000000Z
out=$(timeout 120 "$STRATA" restart east-0 --dir "$DIR" 2>&1)
rc=$?
[ "$rc" != 0 ] || fail "strata restart east-0 with a certificate valid from 2099 ended 0: $out"
expect_match "the node names it" "certificate $S/east-0.pem is not yet valid.*valid from 2099" "$out"

echo "== 3. the good certificates back"
cp "$C/east-0.good" "$S/east-0.pem" && cp "$C/router.good" "$S/router.pem" || fail "copies back"
out=$(timeout 120 "$STRATA" restart east-0 --dir "$DIR" 2>&1) || fail "restart east-0: $out"
out=$(timeout 120 "$STRATA" restart router --dir "$DIR" 2>&1) || fail "restart router: $out"
out=$(timeout 60 "$STRATA" backup --dir "$DIR" list 2>&1) || fail "backup list: $out"
echo "ok: both restart, the router answers over TLS"
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"
echo PASS
