#!/usr/bin/env bash
# Both version lines of the real-broker harness, one after the other (the machine is small),
# into OUT/<version>/ (each a run directory: manifest.json, rounds.jsonl, snapshots/, ...).
#   harness/rocketmq/run-all.sh OUT [ROUNDS] [TRANSACTIONS]
# Defaults: 12 rounds and 500 transactions per line. Each line is capped at 7 minutes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: run-all.sh OUT [ROUNDS] [TRANSACTIONS]}"
rounds="${2:-12}"
transactions="${3:-500}"
mkdir -p "$out"
for spec in v5:5.3.3 v4:4.9.7; do
  line="${spec%%:*}"; version="${spec#*:}"
  rm -rf "${out:?}/$version"
  start=$(date +%s)
  if ! timeout 420 "$here/run.sh" "$line" --rounds "$rounds" --transactions "$transactions" --out "$out/$version"; then
    echo "error: the $version harness run failed (see the error line above)" >&2
    exit 1
  fi
  echo "harness: $version: $rounds rounds, $transactions transactions in $(( $(date +%s) - start )) s -> $out/$version"
done
