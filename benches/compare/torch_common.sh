# Shared set-up of the synkv.torch benchmarks (run_torch_step.sh, run_torch_sparse.sh); sourced.
#
# torch_bench_setup NAME PREFIX: refuses to run in CI (exit 0), picks the venv (TORCH_VENV,
# default ./.venv-ci, relative to the repository root) and checks it has torch with gloo and the
# synkv wheel, finds or builds the synkv launcher (SYNKV_BIN), and opens the results file.
# Sets: here, root, PY, SYNKV, out (bench-results/PREFIX-<date>.jsonl); cds to the root.
torch_bench_setup() {
    local name=$1 prefix=$2
    if [[ -n "${CI:-}" ]]; then
        echo "$name: \$CI is set; this is a manual benchmark and does not run in CI. Refusing." >&2
        exit 0
    fi
    here="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)"
    root="$(cd "$here/../.." && pwd)"
    TORCH_VENV="${TORCH_VENV:-./.venv-ci}"
    [[ "$TORCH_VENV" = /* ]] || TORCH_VENV="$root/${TORCH_VENV#./}"
    PY="$TORCH_VENV/bin/python"
    cd "$root"
    if ! "$PY" -c 'import torch.distributed as d, synkv.torch; assert d.is_gloo_available()' >/dev/null 2>&1; then
        echo "$name: $PY lacks torch with gloo or the synkv wheel (set TORCH_VENV)" >&2
        exit 2
    fi
    if [[ -n "${SYNKV_BIN:-}" ]]; then
        SYNKV="$SYNKV_BIN"
    else
        echo "== cargo build --release -p synkv-cli" >&2
        cargo build --release -p synkv-cli
        SYNKV="$(cargo metadata --format-version 1 --no-deps | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/synkv"
    fi
    [[ -x "$SYNKV" ]] || { echo "$name: no synkv binary at $SYNKV" >&2; exit 1; }
    mkdir -p bench-results
    out="bench-results/$prefix-$(date +%Y%m%d-%H%M%S).jsonl"
    : >"$out"
    echo "== $(date -Is)  loadavg $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')  -> $out" >&2
}
