#!/usr/bin/env bash
# unknown_fields_test.sh — fields the API does not define are not stored in the router's
# metadata (app profiles, table schemas, backups): hostile/unknown_fields.py hides 1 MiB in an
# unknown field of each and reads the records back small.
# Usage: unknown_fields_test.sh PATH/TO/strata
set -u
. "$(dirname "$0")/lib.sh"
STRATA=$1
command -v python3 >/dev/null || { echo "python3 not installed: skipping"; exit 77; }
up_single unknown_fields
python3 "$(dirname "$0")/hostile/unknown_fields.py" "$PORT" || fail "unknown fields stored"
