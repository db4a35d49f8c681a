#!/usr/bin/env bash
# synkv vs MXNet 1.9.1 local-KVStore peer comparison. See benches/compare/README.md.
#
# Manual benchmark: NEVER run in CI (it refuses when $CI is set). Run from the repo root:
#
#     benches/compare/run_local.sh
#
# Builds `synkv` in release, then for every case runs synkv and MXNet alternately
# (synkv, mxnet, synkv, mxnet, ... so both see the same machine noise), appends each
# run's JSON line to bench-results/local-<date>.jsonl, prints the comparison table and draws
# it into bench-results/local-<date>.png (`synkv bench plot`; needs a TrueType font, e.g.
# Debian's fonts-dejavu-core).
#
# Environment knobs (all optional):
#   MXNET_VENV         venv with mxnet==1.9.1 (default: ./.venv-mxnet)
#   BENCH_ITERS        timed iterations per run            (default 20)
#   BENCH_WARMUP       untimed warmup iterations per run   (default 3)
#   BENCH_ROUNDS       synkv/mxnet pairs per case          (default 2)
#   BENCH_CASES        space-separated case labels to run, e.g. "a c" (default: all)
#   BENCH_ONLY         "synkv" or "mxnet" to run one side only (default: both)
#   BENCH_MXNET_STORE  "local" or "device" for mx.kv.create  (default local)
#   SYNKV_BIN          use this synkv binary instead of `cargo build --release -p synkv-cli`
#
# Exit status: 0 all targeted cases PASS (with BENCH_ONLY: all runs succeeded); 1 a targeted
# case FAILs / is missing, or a run failed; 2 the MXNet venv is missing or broken.
set -euo pipefail

if [[ -n "${CI:-}" ]]; then
    echo "run_local.sh: \$CI is set; this is a manual benchmark and does not run in CI. Skipping." >&2
    exit 0
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# Resolve a user-given relative MXNET_VENV against the caller's cwd, before cd'ing.
MXNET_VENV="${MXNET_VENV:-$root/.venv-mxnet}"
[[ "$MXNET_VENV" = /* ]] || MXNET_VENV="$PWD/$MXNET_VENV"
cd "$root"
source "$here/machine.sh"

ITERS="${BENCH_ITERS:-20}"
WARMUP="${BENCH_WARMUP:-3}"
ROUNDS="${BENCH_ROUNDS:-2}"
ONLY="${BENCH_ONLY:-}"
STORE="${BENCH_MXNET_STORE:-local}"
case "$ONLY" in ""|synkv|mxnet) ;; *) echo "BENCH_ONLY must be synkv or mxnet, got '$ONLY'" >&2; exit 1 ;; esac

# label|size|devices|keys|updater|target ratio synkv/mxnet ('-' = informative, no target)
CASES=(
    "a|16777216|2|1|assign|0.5"
    "b|1024|1|1000|assign|0.1"
    "c|16777216|1|1|sgd|0.2"
    "d|1024|1|1000|sgd|0.05"
    "e|1048576|4|1|assign|-"
    "f|10240|2|100|assign|-"
)
if [[ -n "${BENCH_CASES:-}" ]]; then
    selected=()
    for c in "${CASES[@]}"; do
        for want in $BENCH_CASES; do
            if [[ "${c%%|*}" == "$want" ]]; then selected+=("$c"); fi
        done
    done
    if [[ ${#selected[@]} -eq 0 ]]; then echo "BENCH_CASES='$BENCH_CASES' matches no case" >&2; exit 1; fi
    CASES=("${selected[@]}")
fi

venv_help() {
    cat >&2 <<EOF
run_local.sh: $1
Create the MXNet venv (from the repo root) with:

    python3 -m venv .venv-mxnet && .venv-mxnet/bin/pip install mxnet==1.9.1 numpy==1.23.5

or point MXNET_VENV at an existing one.
EOF
    exit 2
}

PY="$MXNET_VENV/bin/python"
if [[ "$ONLY" != "synkv" ]]; then
    [[ -x "$PY" ]] || venv_help "no MXNet venv at $MXNET_VENV"
    "$PY" -c 'import mxnet, sys; sys.exit(0 if mxnet.__version__ == "1.9.1" else 1)' >/dev/null 2>&1 \
        || venv_help "$PY cannot import mxnet 1.9.1"
fi
# table.py and small helpers only need the standard library.
if command -v python3 >/dev/null 2>&1; then HOSTPY=python3; else HOSTPY="$PY"; fi

SYNKV=""
if [[ "$ONLY" != "mxnet" && -n "${SYNKV_BIN:-}" ]]; then
    SYNKV="$SYNKV_BIN"
    [[ -x "$SYNKV" ]] || { echo "run_local.sh: SYNKV_BIN=$SYNKV is not executable" >&2; exit 1; }
    echo "== using SYNKV_BIN=$SYNKV (no cargo build)" >&2
elif [[ "$ONLY" != "mxnet" ]]; then
    echo "== cargo build --release -p synkv-cli" >&2
    cargo build --release -p synkv-cli
    target_dir="$(cargo metadata --format-version 1 --no-deps \
        | "$HOSTPY" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    SYNKV="$target_dir/release/synkv"
    [[ -x "$SYNKV" ]] || { echo "run_local.sh: built binary not found at $SYNKV" >&2; exit 1; }
fi

mkdir -p bench-results
stamp="$(date +%Y%m%d-%H%M%S)"
out="bench-results/local-$stamp.jsonl"
meta="bench-results/local-$stamp.meta.txt"
: >"$out"
{
    echo "date: $(date -Is)"
    echo "host: $(uname -srm)  nproc: $(nproc)  loadavg: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
    machine_line
    echo "iters: $ITERS  warmup: $WARMUP  rounds: $ROUNDS  mxnet store: $STORE  only: ${ONLY:-both}"
    echo "synkv: ${SYNKV:-(not run)}"
    echo "mxnet venv: $MXNET_VENV"
    env | grep -E '^(OMP_|MKL_|OPENBLAS_|MXNET_|RAYON_)' | sort || true
} >"$meta"

# run_one IMPL LABEL ROUND SIZE DEVICES KEYS UPDATER
run_one() {
    local impl=$1 label=$2 round=$3 size=$4 devices=$5 keys=$6 updater=$7
    local -a cmd
    if [[ "$impl" == synkv ]]; then
        cmd=("$SYNKV" bench local --size "$size" --devices "$devices" --keys "$keys"
             --updater "$updater" --iters "$ITERS" --warmup "$WARMUP" --dtype f32 --json)
    else
        cmd=("$PY" "$here/mxnet_local.py" --size "$size" --devices "$devices" --keys "$keys"
             --updater "$updater" --iters "$ITERS" --warmup "$WARMUP" --store "$STORE" --json)
    fi
    local output
    if ! output="$("${cmd[@]}")"; then
        echo "run_local.sh: case $label round $round: $impl failed: ${cmd[*]}" >&2
        exit 1
    fi
    local json
    json="$(printf '%s\n' "$output" | grep '^{' || true)"
    if [[ -z "$json" || "$(printf '%s\n' "$json" | wc -l)" -ne 1 ]]; then
        echo "run_local.sh: case $label round $round: expected one JSON line from $impl, got:" >&2
        printf '%s\n' "$output" >&2
        exit 1
    fi
    if ! printf '%s\n' "$json" | "$HOSTPY" -c '
import json, sys
r = json.loads(sys.stdin.read())
want = dict(impl=sys.argv[1], size=int(sys.argv[2]), devices=int(sys.argv[3]),
            keys=int(sys.argv[4]), updater=sys.argv[5], dtype="f32")
bad = {k: (r.get(k), v) for k, v in want.items() if r.get(k) != v}
float(r["median_ms"])
sys.exit("JSON does not match the requested case (got, wanted): %r" % bad if bad else 0)
' "$impl" "$size" "$devices" "$keys" "$updater"; then
        echo "run_local.sh: case $label round $round: bad JSON from $impl: $json" >&2
        exit 1
    fi
    printf '%s\n' "$json" >>"$out"
    local ms
    ms="$(printf '%s\n' "$json" | sed -n 's/.*"median_ms": *\([-0-9.eE+]*\).*/\1/p' \
        | awk '{ printf "%.3f", $1 }')"
    printf '  (%s) round %d/%d  %-5s median %s ms\n' "$label" "$round" "$ROUNDS" "$impl" "$ms" >&2
}

table_args=()
for c in "${CASES[@]}"; do
    IFS='|' read -r label size devices keys updater target <<<"$c"
    table_args+=(--case "$c")
    echo "== case ($label): size=$size devices=$devices keys=$keys updater=$updater" >&2
    for ((r = 1; r <= ROUNDS; r++)); do
        [[ "$ONLY" == mxnet ]] || run_one synkv "$label" "$r" "$size" "$devices" "$keys" "$updater"
        [[ "$ONLY" == synkv ]] || run_one mxnet "$label" "$r" "$size" "$devices" "$keys" "$updater"
    done
done

echo
rc=0
[[ -z "$ONLY" ]] || table_args+=(--allow-missing)
"$HOSTPY" "$here/table.py" "$out" "${table_args[@]}" || rc=$?
echo
# The table as a picture: both sides' times against the bytes each case moves (synkv draws it).
if [[ -n "$SYNKV" ]]; then
    sides="synkv vs MXNet 1.9.1"
    [[ "$ONLY" != synkv ]] || sides="synkv"
    if "$SYNKV" bench plot "$out" -o "${out%.jsonl}.png" --x moved --series impl,updater \
        --title "$sides, local KVStore, $stamp (one point per case)"; then
        echo "chart: ${out%.jsonl}.png"
    else
        echo "run_local.sh: no chart drawn (the reason is above); the table stands" >&2
    fi
fi
echo "results: $out  (run info: $meta)"
exit "$rc"
