#!/usr/bin/env bash
# changes_secure_test.sh — `strata changes` against `strata up --secure` (docs/operations.md,
# "strata changes"): the router serves TLS only and checks bearer tokens.
#   1. with --dir of the instance (its CA and admin token): --enable 1d turns streams on, and rows
#      written after it come back from --from as JSON lines; --follow prints them too;
#   2. without credentials the command fails at once, not retrying forever: plaintext to the TLS
#      router (--from, --follow and --enable) names --dir and --tls-ca; --tls-ca without a token
#      is UNAUTHENTICATED naming --token-file; the reader's token (--token-file) reads but may not
#      --enable (PERMISSION_DENIED asking for an admin token); a missing CA file is named.
# Skips (77) without cbt (rows are written with it).
# Usage: changes_secure_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
if [ -z "$CBT" ]; then echo "cbt not installed: skipping"; exit 77; fi
instance_init changes_secure_test
FAIL_TAIL_LINES=20
expect_match() { # WHAT REGEX GOT
  if printf '%s' "$3" | grep -Eq -- "$2"; then echo "ok: $1"; else fail "$1: want /$2/, got '$3'"; fi
}
expect_no() { # WHAT REGEX GOT
  if printf '%s' "$3" | grep -Eq -- "$2"; then fail "$1: did not want /$2/, got '$3'"; else echo "ok: $1"; fi
}
now() { date -u +%Y-%m-%dT%H:%M:%S.%6NZ; }
# A bounded run: a command that retried forever ends 124 here, which the checks below refuse.
ch() { timeout 60 "$STRATA" changes --table cs --quiet "$@" 2>&1; }
che() { ch --endpoint "127.0.0.1:$PORT" "$@"; }

up_secure_single
cbts createtable cs families=cf >/dev/null || fail "cbt createtable: $(cbts createtable cs families=cf)"

echo "== 1. --dir: --enable, then the rows written"
expect_match "--enable with --dir" 'change streams on for .*/tables/cs' "$(ch --dir "$DIR" --enable 1d)"
T0=$(now)
for i in 1 2 3; do cbts set cs "r$i" "cf:c=v$i" >/dev/null || fail "cbt set r$i"; done
out=$(timeout 60 "$STRATA" changes --table cs --quiet --dir "$DIR" --from "$T0" 2>"$TMPD/1.err") ||
  fail "strata changes --dir --from: $(cat "$TMPD/1.err")"
for i in 1 2 3; do expect_match "row r$i printed" "\"row\":\"r$i\".*\"value\":\"v$i\"" "$out"; done
timeout 60 "$STRATA" changes --table cs --quiet --dir "$DIR" --from "$T0" --follow >"$TMPD/f.out" \
  2>"$TMPD/f.err" &
FOLLOW=$!
PIDS+=("$FOLLOW")
wait_line "$TMPD/f.out" '"row":"r3"' >/dev/null || fail "--follow printed no r3: $(cat "$TMPD/f.err")"
kill "$FOLLOW"
wait "$FOLLOW"
rc=$?
[ "$rc" = 0 ] || fail "--follow ended $rc on SIGTERM: $(cat "$TMPD/f.err")"
echo "ok: --follow prints the rows and ends 0"

echo "== 2. --endpoint: missing or partial credentials fail at once, with what to pass"
out=$(che --from "$T0")
rc=$?
expect_match "plaintext --from: fails (not 124: retried)" '^1$' "$rc"
expect_match "plaintext --from: the hint" 'UNAVAILABLE.*TLS only.*--dir DIR.*--tls-ca' "$out"
out=$(che --follow)
rc=$?
expect_match "plaintext --follow: fails (not 124: retried)" '^1$' "$rc"
expect_match "plaintext --follow: the hint" 'UNAVAILABLE.*TLS only.*--tls-ca' "$out"
expect_no "plaintext --follow: no retries" 'retrying' "$out"
out=$(che --enable 1d)
expect_match "plaintext --enable: the hint" 'UpdateTable.*UNAVAILABLE.*TLS only.*--tls-ca' "$out"
expect_no "plaintext --enable: no stray log line" 'level=' "$out"
out=$(che --from "$T0" --tls-ca "$S/ca.pem")
expect_match "--tls-ca without a token" 'UNAUTHENTICATED.*--token-file' "$out"
grep '^reader ' "$S/tokens" >"$TMPD/reader.token"
out=$(timeout 60 "$STRATA" changes --table cs --quiet --endpoint "127.0.0.1:$PORT" --from "$T0" \
  --tls-ca "$S/ca.pem" --token-file "$TMPD/reader.token" 2>"$TMPD/2.err") ||
  fail "the reader's token: $(cat "$TMPD/2.err")"
expect_match "the reader's token reads" '"row":"r2"' "$out"
out=$(che --enable 2d --tls-ca "$S/ca.pem" --token-file "$TMPD/reader.token")
expect_match "the reader may not --enable" 'PERMISSION_DENIED.*admin role' "$out"
admin=$(awk '$1 == "admin" {print $2}' "$S/tokens")
expect_match "the admin token (--token) may" 'change streams on' \
  "$(che --enable 2d --tls-ca "$S/ca.pem" --token "$admin")"
expect_match "a missing CA file" 'cannot read --tls-ca' "$(che --from "$T0" --tls-ca "$TMPD/no.pem")"
"$STRATA" down --dir "$DIR" >/dev/null 2>&1 || fail "strata down"
echo PASS
