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

venv=${SYNKV_PY_VENV:-.venv-ci}
case "$venv" in /*) ;; *) venv="$root/$venv" ;; esac
# Tested with maturin 1.16, numpy 2.4 (and 1.26, and Debian 12's 1.24), pytest 9.2.
requirements=("maturin>=1.9.4,<2" "numpy>=1.22,<3" "pytest>=7,<10")

# synkv.torch is tested against Debian 12's torch (python3-torch 1.13, CPU, with gloo) and its
# scikit-learn (the examples' digits data set), which serve Debian's python3 only: the venv is
# then made from /usr/bin/python3 with --system-site-packages (so numpy is Debian's too, the
# one its torch was built against). SYNKV_SKIP_TORCH=1 skips this (the torch tests skip).
system_site=()
python=${PYTHON:-python3}
if [[ "${SYNKV_SKIP_TORCH:-0}" != 1 ]]; then
    debs=(python3-torch python3-sklearn python3-venv)
    missing=()
    for d in "${debs[@]}"; do
        dpkg-query -W -f='${Status}' "$d" 2>/dev/null | grep -q "install ok installed" || missing+=("$d")
    done
    if ((${#missing[@]})); then
        echo "== apt-get install ${missing[*]} (synkv.torch tests; SYNKV_SKIP_TORCH=1 skips them)"
        sudo=()
        [[ $(id -u) -ne 0 ]] && sudo=(sudo)
        "${sudo[@]}" apt-get update -qq
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    python=/usr/bin/python3
    system_site=(--system-site-packages)
fi

echo "== python venv ($venv${system_site:+, with the site packages of $python})"
if [[ -x "$venv/bin/python" ]]; then
    # A venv made for the other mode (with or without system packages) is made again.
    has_system=$(grep -c "include-system-site-packages = true" "$venv/pyvenv.cfg" || true)
    if [[ $has_system -ne ${#system_site[@]} ]]; then
        rm -rf "$venv"
    fi
fi
if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv "${system_site[@]}" "$venv"
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
