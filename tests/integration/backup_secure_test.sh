#!/usr/bin/env bash
# backup_secure_test.sh — `strata backup` against `strata up --secure` (docs/backups.md, "strata
# backup on a secure instance"): the router serves TLS only and checks bearer tokens.
#   1. with --dir of the instance (its CA and admin token): create --wait, list, describe,
#      update --expire, copy --wait, restore --wait, export, verify, import, delete all work;
#   2. with --endpoint and explicit credentials: plaintext is refused with a hint naming --dir and
#      --tls-ca; --tls-ca without a token is UNAUTHENTICATED with a hint naming --token-file;
#      a wrong token is "refused"; the reader's token (--token-file) may describe but not create
#      (PERMISSION_DENIED asking for an admin token); the admin token (--token) creates.
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
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"
if grep -l 'Sanitizer' "$DIR"/logs/*.log; then fail "sanitizer report in a log"; fi
echo PASS
