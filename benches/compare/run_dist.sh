#!/usr/bin/env bash
# synkv vs MXNet 1.9.1 (vs torch.distributed gloo) distributed peer comparison.
# See benches/compare/README.md ("Distributed: dist_sync").
#
# Manual benchmark: NEVER run in CI (it refuses when $CI is set). Run from the repo root:
#
#     benches/compare/run_dist.sh
#
# Builds `synkv` in release, measures loopback TCP bandwidth, checks MXNet's dist_sync once
# (ones pushed by both workers, assign, pull gives 2), then for every case runs synkv (under
# `synkv launch`), MXNet (mxnet_dist.py) and torch gloo (torch_gloo.py, if TORCH_VENV has
# torch) alternately, one job per case and impl, 2 workers on 127.0.0.1. Every job's JSON
# lines (one per worker, tagged with a "run" id) go to bench-results/dist-<date>.jsonl; the
# table is printed by table_dist.py and drawn, one chart per server count, into
# bench-results/dist-<date>-s<servers>.png (`synkv bench plot`; needs a TrueType font).
#
# Environment knobs (all optional):
#   MXNET_VENV     venv with mxnet==1.9.1                  (default ./.venv-mxnet)
#   TORCH_VENV     venv with torch; skipped if absent       (default ./.venv-torch)
#   BENCH_ITERS    timed iterations per job                 (default 20; ten times
#                  as many for jobs of at most 4M elements in all, whose steps take
#                  milliseconds: 20 of them measure mostly the job's first-steps cost)
#   BENCH_WARMUP   untimed warmup iterations per job        (default 3)
#   BENCH_ROUNDS   synkv/mxnet(/torch) rounds per case      (default 2)
#   BENCH_CASES    space-separated labels to run, e.g. "b c" (default: all)
#   BENCH_ONLY     "synkv" or "mxnet" to run one side only  (default: both, plus torch)
#   BENCH_TIMEOUT  seconds per job                          (default 300)
#   SYNKV_BIN      use this synkv binary instead of `cargo build --release -p synkv-cli`
#
# Exit status: 0 all targeted cases PASS; 1 a targeted case FAILs / is missing or a synkv job
# failed; 2 the MXNet venv is missing or broken. An MXNet job that aborts is recorded (ABORT).
set -euo pipefail

if [[ -n "${CI:-}" ]]; then
    echo "run_dist.sh: \$CI is set; this is a manual benchmark and does not run in CI. Refusing." >&2
    exit 0
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
MXNET_VENV="${MXNET_VENV:-$root/.venv-mxnet}"
[[ "$MXNET_VENV" = /* ]] || MXNET_VENV="$PWD/$MXNET_VENV"
TORCH_VENV="${TORCH_VENV:-$root/.venv-torch}"
[[ "$TORCH_VENV" = /* ]] || TORCH_VENV="$PWD/$TORCH_VENV"
cd "$root"
source "$here/machine.sh"

ITERS="${BENCH_ITERS:-20}"
WARMUP="${BENCH_WARMUP:-3}"
ROUNDS="${BENCH_ROUNDS:-2}"
ONLY="${BENCH_ONLY:-}"
TIMEOUT="${BENCH_TIMEOUT:-300}"
case "$ONLY" in ""|synkv|mxnet) ;; *) echo "BENCH_ONLY must be synkv or mxnet, got '$ONLY'" >&2; exit 1 ;; esac

# label|size|keys|servers|updater|target synkv/mxnet ('-' = informative)
CASES=(
    "a|1048576|1|1|assign|-"
    "b|16777216|1|1|assign|0.25"
    "c|10240|100|1|assign|0.25"
    "d|1048576|1|2|assign|-"
    "e|16777216|1|2|assign|0.25"
    "f|10240|100|2|assign|0.25"
    "g|1048576|1|1|sgd|-"
    "h|16777216|1|1|sgd|0.25"
    "i|10240|100|1|sgd|0.25"
    "j|1048576|1|2|sgd|-"
    "k|16777216|1|2|sgd|0.25"
    "l|10240|100|2|sgd|0.25"
)
if [[ -n "${BENCH_CASES:-}" ]]; then
    selected=()
    for c in "${CASES[@]}"; do
        for want in $BENCH_CASES; do [[ "${c%%|*}" == "$want" ]] && selected+=("$c"); done
    done
    [[ ${#selected[@]} -gt 0 ]] || { echo "BENCH_CASES='$BENCH_CASES' matches no case" >&2; exit 1; }
    CASES=("${selected[@]}")
fi

PY="$MXNET_VENV/bin/python"
if [[ "$ONLY" != "synkv" ]]; then
    if [[ ! -x "$PY" ]] || ! "$PY" -c 'import mxnet, sys; sys.exit(0 if mxnet.__version__ == "1.9.1" else 1)' >/dev/null 2>&1; then
        echo "run_dist.sh: no MXNet 1.9.1 at $MXNET_VENV; create it with" >&2
        echo "    python3 -m venv .venv-mxnet && .venv-mxnet/bin/pip install mxnet==1.9.1 numpy==1.23.5" >&2
        exit 2
    fi
fi
TPY=""
if [[ -z "$ONLY" && -x "$TORCH_VENV/bin/python" ]] && "$TORCH_VENV/bin/python" -c 'import torch.distributed as d; assert d.is_available() and d.is_gloo_available()' >/dev/null 2>&1; then
    TPY="$TORCH_VENV/bin/python"
else
    echo "== torch gloo peer skipped (no torch with gloo in $TORCH_VENV)" >&2
fi
if command -v python3 >/dev/null 2>&1; then HOSTPY=python3; else HOSTPY="$PY"; fi

SYNKV=""
if [[ "$ONLY" != "mxnet" && -n "${SYNKV_BIN:-}" ]]; then
    SYNKV="$SYNKV_BIN"
    [[ -x "$SYNKV" ]] || { echo "run_dist.sh: SYNKV_BIN=$SYNKV is not executable" >&2; exit 1; }
elif [[ "$ONLY" != "mxnet" ]]; then
    echo "== cargo build --release -p synkv-cli" >&2
    cargo build --release -p synkv-cli
    target_dir="$(cargo metadata --format-version 1 --no-deps \
        | "$HOSTPY" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    SYNKV="$target_dir/release/synkv"
    [[ -x "$SYNKV" ]] || { echo "run_dist.sh: built binary not found at $SYNKV" >&2; exit 1; }
fi

mkdir -p bench-results
stamp="$(date +%Y%m%d-%H%M%S)"
out="bench-results/dist-$stamp.jsonl"
meta="bench-results/dist-$stamp.meta.txt"
: >"$out"
{
    echo "date: $(date -Is)"
    echo "host: $(uname -srm)  nproc: $(nproc)  loadavg: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
    machine_line
    echo "iters: $ITERS (x10 up to 4M elements)  warmup: $WARMUP  rounds: $ROUNDS  workers: 2  only: ${ONLY:-both}"
    echo "synkv: ${SYNKV:-(not run)}"
    echo "mxnet venv: $MXNET_VENV"
    echo "torch: ${TPY:-(skipped)}"
    env | grep -E '^(OMP_|MKL_|OPENBLAS_|MXNET_|SYNKV_|DMLC_|PS_)' | sort || true
} >"$meta"

echo "== loopback TCP bandwidth (1 GiB in 4 MiB writes)" >&2
"$HOSTPY" "$here/loopback_bw.py" --json | tee -a "$out" >&2

if [[ "$ONLY" != "synkv" ]]; then
    echo "== MXNet dist_sync correctness check (ones from 2 workers, assign, pull gives 2)" >&2
    if ! timeout 120 "$PY" "$here/mxnet_dist.py" --check --workers 2 --servers 1 >&2; then
        echo "run_dist.sh: MXNet dist_sync check failed" >&2; exit 1
    fi
fi

# tag IMPL RUNID: keep the JSON lines of a job's output (launcher prefixes stripped), add "run"
tag() {
    "$HOSTPY" -c '
import json, sys
n = 0
for line in sys.stdin:
    line = line.strip()
    if line.startswith("[worker"):
        line = line.split("] ", 1)[1] if "] " in line else ""
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    if r.get("impl") != sys.argv[1]:
        continue
    r["run"] = sys.argv[2]
    print(json.dumps(r)); n += 1
sys.exit(0 if n else 3)
' "$1" "$2"
}

rc=0
# iters_for SIZE KEYS: timed iterations of a job (see BENCH_ITERS).
iters_for() {
    if (($1 * $2 <= 4194304)); then echo $((ITERS * 10)); else echo "$ITERS"; fi
}
# run_one IMPL LABEL ROUND SIZE KEYS SERVERS UPDATER
run_one() {
    local impl=$1 label=$2 round=$3 size=$4 keys=$5 servers=$6 updater=$7 jrc=0
    local -a cmd
    local iters
    iters="$(iters_for "$size" "$keys")"
    case "$impl" in
        synkv) cmd=(timeout "$TIMEOUT" "$SYNKV" launch -n 2 -s "$servers" -- "$SYNKV" bench dist --size "$size"
                    --keys "$keys" --updater "$updater" --iters "$iters" --warmup "$WARMUP" --json) ;;
        mxnet) cmd=("$PY" "$here/mxnet_dist.py" --workers 2 --servers "$servers" --size "$size" --keys "$keys"
                    --updater "$updater" --iters "$iters" --warmup "$WARMUP" --timeout "$TIMEOUT" --json) ;;
        torch) cmd=("$TPY" "$here/torch_gloo.py" --workers 2 --size "$size" --keys "$keys"
                    --iters "$iters" --warmup "$WARMUP" --timeout "$TIMEOUT" --json) ;;
    esac
    local output
    output="$("${cmd[@]}" 2>"$out.$impl.stderr")" || jrc=$?
    local json
    json="$(printf '%s\n' "$output" | tag "$impl" "$label-$impl-$round")" || true
    if [[ -n "$json" ]]; then printf '%s\n' "$json" >>"$out"; fi
    if [[ $jrc -ne 0 ]]; then
        echo "  ($label) round $round: $impl job failed (exit $jrc): ${cmd[*]}" >&2
        tail -5 "$out.$impl.stderr" | sed 's/^/    /' >&2
        [[ "$impl" == mxnet ]] || rc=1   # an MXNet abort is a result (recorded), not a script failure
        return 0
    fi
    if [[ -z "$json" ]]; then
        echo "  ($label) round $round: $impl job exited 0 but printed no JSON record (not counted)" >&2
        tail -5 "$out.$impl.stderr" | sed 's/^/    /' >&2
        [[ "$impl" == torch ]] || rc=1
        return 0
    fi
    printf '  (%s) round %d/%d  %-5s worker medians: %s ms\n' "$label" "$round" "$ROUNDS" "$impl" \
        "$(printf '%s\n' "$json" | "$HOSTPY" -c 'import json,sys; print(" ".join("%.3f" % json.loads(l)["median_ms"] for l in sys.stdin))')" >&2
}

declare -A torch_done=()
table_args=()
for c in "${CASES[@]}"; do
    IFS='|' read -r label size keys servers updater target <<<"$c"
    table_args+=(--case "$c")
    echo "== case ($label): ${keys}x$size f32, 2 workers, $servers server(s), $updater" >&2
    for ((r = 1; r <= ROUNDS; r++)); do
        [[ "$ONLY" == mxnet ]] || run_one synkv "$label" "$r" "$size" "$keys" "$servers" "$updater"
        [[ "$ONLY" == synkv ]] || run_one mxnet "$label" "$r" "$size" "$keys" "$servers" "$updater"
        # torch all_reduce has no servers/updater: once per shape and round
        if [[ -n "$TPY" && -z "${torch_done[$size-$keys-$r]:-}" ]]; then
            run_one torch "$label" "$r" "$size" "$keys" "$servers" "$updater"
            torch_done[$size-$keys-$r]=1
        fi
    done
done
rm -f "$out".*.stderr

echo
[[ -z "$ONLY" ]] || table_args+=(--allow-missing)
"$HOSTPY" "$here/table_dist.py" "$out" "${table_args[@]}" || rc=1
echo
# The table as pictures, one per server count: time against size x keys, synkv vs MXNet vs
# torch (a job counts as its slowest worker; rounds give the median and the whisker).
if [[ -n "$SYNKV" ]]; then
    sides="synkv"
    [[ "$ONLY" == synkv ]] || sides+=" vs MXNet 1.9.1"
    [[ -z "$TPY" ]] || sides+=" vs torch gloo"
    for s in $(printf '%s\n' "${CASES[@]}" | cut -d'|' -f4 | sort -u); do
        png="${out%.jsonl}-s$s.png"
        if "$SYNKV" bench plot "$out" -o "$png" --where servers="$s" --series impl,updater,keys \
            --title "$sides, dist, 2 workers, $s server(s), $stamp"; then
            echo "chart: $png"
        else
            echo "run_dist.sh: no chart drawn for $s server(s) (the reason is above); the table stands" >&2
        fi
    done
fi
echo "results: $out  (run info: $meta)"
exit "$rc"
