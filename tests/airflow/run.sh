#!/usr/bin/env bash
# Parse the example Airflow DAG and check its rendered spark-submit command line.
#
# Airflow and the Spark provider go into a venv of their own, never the project's: the
# provider pulls in pyspark-client, which installs into the same pyspark/ package
# directory and breaks the project's pyspark. The venv is reused when its marker file
# names the same pins; delete the folder (or set AIRFLOW_TEST_VENV) to start afresh.
#
#   bash tests/airflow/run.sh [pytest args...]
#   bash tests/airflow/run.sh --venv-only     # create (or check) the venv, run nothing
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${AIRFLOW_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rmq-txn-reconcile/venv-airflow}"
python="${PYTHON:-python3}"
# deltalake + pyarrow: the check_discards task reads Delta tables on the Airflow worker.
pins=(apache-airflow==3.3.2 apache-airflow-providers-apache-spark==6.3.4
      deltalake==1.6.6 pyarrow==26.0.1 pytest==9.2.0)
marker="$venv/.pins"

start=$(date +%s)
if [[ ! -x "$venv/bin/python" || "$(cat "$marker" 2>/dev/null)" != "${pins[*]}" ]]; then
    echo "airflow test venv: creating $venv (${pins[*]})"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}"
    echo "${pins[*]}" > "$marker"
    echo "airflow test venv: ready in $(( $(date +%s) - start )) s"
else
    echo "airflow test venv: reusing $venv"
fi

if [[ "${1:-}" == "--venv-only" ]]; then
    exit 0
fi

# No database, no scheduler: a throwaway AIRFLOW_HOME keeps the user's own untouched.
airflow_home="$(mktemp -d)"
trap 'rm -rf "$airflow_home"' EXIT
export AIRFLOW_HOME="$airflow_home"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__UNIT_TEST_MODE=True
export AIRFLOW__CORE__DAGS_FOLDER="$repo/examples/airflow"
export PYTHONDONTWRITEBYTECODE=1

cd "$repo"
# -c /dev/null keeps the project's pytest settings out of this run, --noconftest its
# conftest.py (a Spark fixture: this venv has no pyspark of the project's).
"$venv/bin/python" -m pytest -c /dev/null --rootdir "$repo" --noconftest -p no:cacheprovider -q \
    "$here/test_dag.py" "$@"
echo "airflow tests: $(( $(date +%s) - start )) s in all"
