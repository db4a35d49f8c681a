#!/usr/bin/env bash
# Builds the synkv Python package (crates/synkv-python) and runs its pytest suite.
#
# Creates a virtual environment (default .venv-ci; override with SYNKV_PY_VENV), installs the
# build and test tools into it, builds a release wheel with maturin, installs it, builds the
# `synkv` binary (the dist tests run workers under `synkv launch`), and runs pytest (which
# also runs examples/python/train_logreg.py). Needs python3 (>= 3.9, with the venv module)
# and cargo. Exits non-zero on any failure, including "no tests collected".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

python=${PYTHON:-python3}
venv=${SYNKV_PY_VENV:-.venv-ci}
case "$venv" in /*) ;; *) venv="$root/$venv" ;; esac
# Tested with maturin 1.16, numpy 2.4 (and 1.26), pytest 9.2.
requirements=("maturin>=1.9.4,<2" "numpy>=1.22,<3" "pytest>=7,<10")

echo "== python venv ($venv)"
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet "${requirements[@]}"

echo "== maturin build (release wheel)"
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
"$venv/bin/maturin" build --release --strip --quiet --interpreter "$venv/bin/python" \
    --manifest-path crates/synkv-python/Cargo.toml --out "$wheels"
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps "$wheels"/synkv-*.whl

echo "== cargo build -p synkv-cli (the launcher for the dist tests)"
cargo build --quiet -p synkv-cli
target_dir=$(cargo metadata --format-version 1 --no-deps | "$venv/bin/python" -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
export SYNKV_BIN="$target_dir/debug/synkv"

echo "== pytest"
cd crates/synkv-python
set +e
"$venv/bin/python" -m pytest -p no:cacheprovider -q python/tests
status=$?
set -e
if [[ $status -eq 5 ]]; then
    echo "pytest collected no tests (exit 5): the suite in crates/synkv-python/python/tests is missing" >&2
    exit 1
fi
if [[ $status -ne 0 ]]; then
    echo "pytest failed (exit $status)" >&2
    exit "$status"
fi
echo "== python tests passed ($root/crates/synkv-python/python/tests)"
