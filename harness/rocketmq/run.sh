#!/usr/bin/env bash
# Build and run one line of the real-broker harness.
#   harness/rocketmq/run.sh v5|v4 --out DIR [--rounds N] [--transactions M]
# Resolves the line's Maven dependencies (cached in ~/.m2), compiles it (the module v5/ or v4/ of
# harness/rocketmq/pom.xml: the shared common/ sources with the line's own Line class), and runs it with a JVM
# whose home and temporary directory are a fresh directory of its own (removed afterwards), so
# nothing outside it and ~/.m2 is touched. Exits non-zero with one `error: ...` line on failure.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
line="${1:-}"
case "$line" in
  v5|v4) shift ;;
  *) echo "error: usage: $0 v5|v4 --out DIR [--rounds N] [--transactions M]" >&2; exit 2 ;;
esac
proj="$here/$line"
command -v mvn >/dev/null || { echo "error: mvn not found (Maven 3.8+ is needed to build the harness)" >&2; exit 2; }
command -v java >/dev/null || { echo "error: java not found (JDK 17 is needed)" >&2; exit 2; }

tmp="$(mktemp -d "${TMPDIR:-/tmp}/rmq-harness-$line.XXXXXX")"
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT

# Build: the classpath file and classes live in target/ (ignored by git).
cp_file="$proj/target/classpath.txt"
# MVN_FLAGS: extra Maven flags, e.g. "-o" to build offline from a warm ~/.m2.
if ! (cd "$proj" && mvn -B -q -Dstyle.color=never ${MVN_FLAGS:-} dependency:build-classpath \
    -Dmdep.outputFile="$cp_file" compile) >"$tmp/mvn.log" 2>&1; then
  if grep -qE "Could not (transfer|resolve|find)|No plugin found|Non-resolvable|Unknown host|Connection refused|Network is unreachable|offline" "$tmp/mvn.log"; then
    echo "error: Maven could not resolve the $line harness's plugins or dependencies (Maven Central unreachable and ~/.m2 cold?); Maven said:" >&2
  else
    echo "error: the $line harness failed to build; Maven said:" >&2
  fi
  sed 's/\x1b\[[0-9;]*m//g' "$tmp/mvn.log" | grep -E '^\[ERROR\] [^ ]' \
    | grep -vE 'To see the full|Re-run Maven|For more information|^\[ERROR\] \[Help' | head -2 | cut -c1-300 | sed 's/^/  /' >&2 || true
  exit 2
fi

# Java 17 needs these opens for the store's direct-buffer and mapped-file code (compiled for 1.8).
opens=(
  --add-opens java.base/java.nio=ALL-UNNAMED
  --add-opens java.base/sun.nio.ch=ALL-UNNAMED
  --add-opens java.base/jdk.internal.ref=ALL-UNNAMED
  --add-opens java.base/java.lang=ALL-UNNAMED
  --add-opens java.base/java.util=ALL-UNNAMED
  --add-exports java.base/sun.nio.ch=ALL-UNNAMED
)
mkdir -p "$tmp/home" "$tmp/tmp"
set +e
java "${opens[@]}" -Xms256m -Xmx768m -XX:+UseSerialGC \
  -Duser.home="$tmp/home" -Djava.io.tmpdir="$tmp/tmp" -Drocketmq.home.dir="$tmp/home" \
  -Drocketmq.client.logUseSlf4j=true \
  -cp "$proj/target/classes:$(cat "$cp_file")" rmqharness.Harness "$@"
rc=$?
set -e
if [ "$rc" -ne 0 ] && [ -s "$tmp/home/logs/broker.log" ]; then
  echo "--- last broker log lines ($line) ---" >&2
  tail -15 "$tmp/home/logs/broker.log" >&2
fi
exit "$rc"
