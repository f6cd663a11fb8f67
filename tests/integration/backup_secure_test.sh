#!/usr/bin/env bash
# backup_secure_test.sh — `strata backup` against `strata up --secure` (docs/backups.md, "strata
# backup on a secure instance"): the router serves TLS only and checks bearer tokens.
#   1. with --dir of the instance (its CA and admin token): create --wait, list, describe,
#      update --expire, copy --wait, restore --wait, export, verify, import, delete all work;
#   2. with --endpoint and explicit credentials: plaintext is refused with a hint naming --dir and
#      --tls-ca; --tls-ca without a token is UNAUTHENTICATED with a hint naming --token-file;
#      a wrong token is "refused"; the reader's token (--token-file) may describe but not create
#      (PERMISSION_DENIED asking for an admin token); the admin token (--token) creates;
#   3. export and import with --endpoint --tls-ca --token (the router's credentials, not the
#      nodes' admin certificate): refused at once, before the export makes its directory or the
#      import its backup, saying to name the instance by --dir; with the admin certificate of
#      another CA (a --dir whose secure/ holds it) the nodes refuse the handshake: the export
#      fails at once (no retry), names OpenSSL's reason and no flag `strata backup` lacks
#      (--tls-cert, --internal-cert), and removes what it wrote (the directory it made; an empty
#      one given stays, empty).
# Skips (77) without cbt (the table is made with it) or openssl.
# Usage: backup_secure_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
command -v openssl >/dev/null || { echo "openssl not installed: skipping"; exit 77; }
instance_init backup_secure_test
FAIL_TAIL_LINES=20
expect_match() { # WHAT REGEX GOT
  if printf '%s' "$3" | grep -Eq -- "$2"; then echo "ok: $1"; else fail "$1: want /$2/, got '$3'"; fi
}
bk() { timeout 120 "$STRATA" backup --dir "$DIR" --quiet "$@" 2>&1; }
bke() { timeout 120 "$STRATA" backup --endpoint "127.0.0.1:$PORT" --cluster east --quiet "$@" 2>&1; }

up_secure_single
cbts createtable t families=cf >/dev/null || fail "cbt createtable: $(cbts createtable t families=cf)"
cbts set t r1 cf:c=secure-one >/dev/null || fail "cbt set r1"
cbts set t r2 cf:c=secure-two >/dev/null || fail "cbt set r2"

echo "== 1. every subcommand with --dir"
expect_match "create --wait" '^state: *READY' "$(bk create t --id b1 --expire 1d --wait)"
expect_match "list" 'b1 +east +t +READY' "$(bk list)"
expect_match "create --type hot keeps HOT" '^type: *HOT' "$(bk create t --id bh --type hot --wait)"
expect_match "describe" '"state":"READY"' "$(bk describe b1 --json)"
expect_match "update --expire" '^expire_time:' "$(bk update b1 --expire 2d)"
expect_match "copy --wait" '^name: .*/backups/b1c' "$(bk copy b1 --to east --as b1c --wait)"
expect_match "restore --wait" 'restored .* into .*/tables/t2' "$(bk restore b1 --to t2 --wait)"
expect_match "the restored table reads back" 'secure-two' "$(cbts read t2)"
out=$(bk export b1 "$TMPD/exp") || fail "export: $out"
echo "ok: export"
out=$("$STRATA" backup verify "$TMPD/exp" --quiet 2>&1) || fail "verify: $out"
echo "ok: verify"
out=$(bk import "$TMPD/exp" --as b2) || fail "import: $out"
expect_match "the import is READY" '^state: *READY' "$(bk describe b2)"
expect_match "delete" 'deleted .*/backups/b2' "$(bk delete b2)"

echo "== 2. --endpoint with explicit credentials"
admin=$(awk '$1 == "admin" {print $2}' "$S/tokens")
grep '^reader ' "$S/tokens" >"$TMPD/reader.token"
expect_match "plaintext to the TLS router" 'UNAVAILABLE.*--tls-ca' "$(bke describe b1)"
expect_match "no token" 'UNAUTHENTICATED.*--token-file' "$(bke describe b1 --tls-ca "$S/ca.pem")"
expect_match "a wrong token" 'UNAUTHENTICATED.*refused the token' \
  "$(bke describe b1 --tls-ca "$S/ca.pem" --token not-a-token)"
expect_match "the reader describes" '^state: *READY' \
  "$(bke describe b1 --tls-ca "$S/ca.pem" --token-file "$TMPD/reader.token")"
expect_match "the reader may not create" 'PERMISSION_DENIED.*admin role' \
  "$(bke create t --id b3 --tls-ca "$S/ca.pem" --token-file "$TMPD/reader.token")"
expect_match "the admin creates" '^state: *READY' \
  "$(bke create t --id b3 --wait --tls-ca "$S/ca.pem" --token "$admin")"
expect_match "a missing CA file" 'cannot read --tls-ca' "$(bke list --tls-ca "$TMPD/nope.pem")"
echo "== 3. export and import without the nodes' admin certificate"
creds=(--tls-ca "$S/ca.pem" --token "$admin")
out=$("$STRATA" backup --endpoint "127.0.0.1:$PORT" --cluster east export b1 "$TMPD/x1" "${creds[@]}" 2>&1) &&
  fail "export with --tls-ca/--token succeeded: $out"
expect_match "export refused, naming --dir" "admin certificate.*--dir DIR" "$out"
[ ! -e "$TMPD/x1" ] || fail "the refused export made $TMPD/x1: $(find "$TMPD/x1")"
echo "$out" | grep -q 'retrying' && fail "the export retried: $out"
out=$(bke import "$TMPD/exp" --as b4 "${creds[@]}") && fail "import with --tls-ca/--token succeeded: $out"
expect_match "import refused, naming --dir" "admin certificate.*--dir DIR" "$out"
bk list | grep -q '^b4 ' && fail "the refused import created b4: $(bk list)"
echo "ok: no backup b4"
# the admin certificate of another CA, in a directory naming this instance's router
mkdir -p "$TMPD/other/secure"
cp "$DIR/topology" "$TMPD/other/"
(cd "$TMPD/other" &&
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key \
    -out secure/ca.pem -days 2 -subj /CN=other-ca &&
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout secure/admin.key \
    -out admin.csr -subj /OU=strata-admin/CN=admin &&
  openssl x509 -req -in admin.csr -CA secure/ca.pem -CAkey ca.key -CAcreateserial \
    -out secure/admin.pem -days 2) >"$TMPD/openssl.out" 2>&1 || fail "openssl: $(cat "$TMPD/openssl.out")"
mkdir "$TMPD/x2"
for d in "$TMPD/x2" "$TMPD/x3"; do
  out=$(timeout 60 "$STRATA" backup --dir "$TMPD/other" export b1 "$d" "${creds[@]}" 2>&1) &&
    fail "export with another instance's admin certificate succeeded: $out"
  expect_match "the node's refusal, with OpenSSL's reason" 'TLS handshake with the node failed \(tlsv1 alert unknown ca\)' "$out"
  echo "$out" | grep -q 'retrying' && fail "a refused handshake was retried: $out"
  echo "$out" | grep -Eq -- '--tls-cert|--internal-cert' && fail "the advice names flags strata backup lacks: $out"
done
[ -d "$TMPD/x2" ] && [ -z "$(ls -A "$TMPD/x2")" ] || fail "the empty directory given was not left empty: $(ls -lA "$TMPD/x2" 2>&1)"
[ ! -e "$TMPD/x3" ] || fail "the failed export left $TMPD/x3: $(find "$TMPD/x3")"
echo "ok: the failed exports left nothing"
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"
if grep -l 'Sanitizer' "$DIR"/logs/*.log; then fail "sanitizer report in a log"; fi
echo PASS
