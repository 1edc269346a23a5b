#!/usr/bin/env bash
# The small checked-in real-broker fixture (tests/fixtures/real-broker/<version>/), from a
# separate short harness run: 8 rounds, 30 transactions (+ 10 old half messages in the tail), of which
# rounds KEEP (default "3 5": check copies, immunity copies, expired and max-check discards)
# are kept with their snapshots. The only change to the broker's bytes: a commit-log file
# that is entirely zeros (the next file the broker pre-allocated, no message in it yet) is
# left out, and so are callbacks.jsonl and endtx.jsonl, to keep the fixture small (the two
# 64 KiB commit-log files are most of it).
#   harness/rocketmq/make-fixture.sh v5|v4 DEST [KEEP]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
line="${1:?usage: make-fixture.sh v5|v4 DEST [KEEP]}"
dest="${2:?usage: make-fixture.sh v5|v4 DEST [KEEP]}"
keep="${3:-3 5}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/rmq-fixture.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$here/run.sh" "$line" --rounds 8 --transactions 30 --out "$tmp/run" >/dev/null
rm -rf "$dest"
mkdir -p "$dest/snapshots"
cp "$tmp/run/manifest.json" "$tmp/run/workload.jsonl" "$dest/"
: >"$dest/rounds.jsonl"
for n in $keep; do
  snap="$(printf 'round-%03d' "$n")"
  grep -E "^\{\"round\": $n," "$tmp/run/rounds.jsonl" >>"$dest/rounds.jsonl"
  cp -r "$tmp/run/snapshots/$snap" "$dest/snapshots/$snap"
  for f in "$dest/snapshots/$snap/commitlog/"*; do
    if cmp -s "$f" <(head -c "$(stat -c %s "$f")" /dev/zero); then rm "$f"; fi
  done
done
find "$dest" -type f -printf "%s\n" | awk -v d="$dest" '{s += $1} END {print d ": " s " bytes"}'
