#!/usr/bin/env bash
# synkv.torch SparseEmbedding (dist_async, 10M x 16 table on 1 server) vs DDP (gloo) with the
# same table as a dense nn.Embedding (and as nn.Embedding(sparse=True)), 2 workers on this host.
# See torch_sparse_step.py and BENCHMARKS.md ("synkv.torch vs DDP (gloo)").
#
# Manual benchmark: NEVER run in CI (it refuses when $CI is set). Run from anywhere:
#
#     benches/compare/run_torch_sparse.sh
#
# Every round runs a synkv job, a dense-DDP job and a sparse-DDP job (order rotated per round).
# Memory: the server holds the 640 MB table; each dense-DDP process ~2.1 GB (weights, gradients,
# gloo buffers). JSON lines go to bench-results/torch-sparse-<date>.jsonl, the summary to .md
# and .json next to it.
#
# Environment knobs (all optional):
#   TORCH_VENV        venv with torch (gloo) and the synkv wheel; relative to the repo root (default ./.venv-ci)
#   SYNKV_BIN         the synkv launcher (default: cargo build --release -p synkv-cli)
#   BENCH_ROUNDS      rounds                                        (default 2)
#   BENCH_STEPS       timed steps, synkv and sparse DDP             (default 30)
#   BENCH_DENSE_STEPS timed steps, dense DDP (seconds each)         (default 3)
#   BENCH_ARGS        more torch_sparse_step.py options, e.g. "--rows 20000000 --batch 512"
#   BENCH_TIMEOUT     seconds per job                               (default 300)
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/torch_common.sh"
torch_bench_setup run_torch_sparse.sh torch-sparse
ROUNDS="${BENCH_ROUNDS:-2}"
STEPS="${BENCH_STEPS:-30}"
DENSE_STEPS="${BENCH_DENSE_STEPS:-3}"
TIMEOUT="${BENCH_TIMEOUT:-300}"
read -r -a EXTRA <<<"${BENCH_ARGS:-}"

keep() { sed -n 's/^\(\[worker [0-9]*\] \)\{0,1\}\({"bench".*\)$/\2/p'; }

job() {  # job ROUND IMPL
    case "$2" in
    synkv)
        echo "== round $1: synkv SparseEmbedding, dist_async (synkv launch -n 2 -s 1)" >&2
        SYNKV_TIMEOUT_MS="${SYNKV_TIMEOUT_MS:-60000}" timeout "$TIMEOUT" \
            "$SYNKV" launch -n 2 -s 1 -- "$PY" "$here/torch_sparse_step.py" --impl synkv --store dist_async \
            --run "synkv-$1" --steps "$STEPS" "${EXTRA[@]}" | keep | tee -a "$out" >&2 ;;
    ddp)
        echo "== round $1: DDP gloo, dense nn.Embedding" >&2
        "$PY" "$here/torch_sparse_step.py" --impl ddp --nproc 2 --timeout "$TIMEOUT" --run "ddp-$1" \
            --steps "$DENSE_STEPS" --warmup 1 "${EXTRA[@]}" | keep | tee -a "$out" >&2 ;;
    ddp_sparse)
        echo "== round $1: DDP gloo, nn.Embedding(sparse=True)" >&2
        "$PY" "$here/torch_sparse_step.py" --impl ddp_sparse --nproc 2 --timeout "$TIMEOUT" --run "ddp_sparse-$1" \
            --steps "$STEPS" "${EXTRA[@]}" | keep | tee -a "$out" >&2 ;;
    esac
}

impls=(synkv ddp ddp_sparse)
for r in $(seq 1 "$ROUNDS"); do
    for k in 0 1 2; do job "$r" "${impls[$(( (k + r - 1) % 3 ))]}"; done
done

echo "== $(date -Is)  loadavg $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')" >&2
"$PY" "$here/torch_sparse_step.py" --table "$out" --markdown "${out%.jsonl}.md" --json-out "${out%.jsonl}.json"
