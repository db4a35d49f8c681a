#!/usr/bin/env bash
# synkv.torch DistributedOptimizer vs torch DistributedDataParallel (gloo): time per training
# step of the same MLP, 2 workers on this host. See torch_ddp_step.py and BENCHMARKS.md
# ("synkv.torch vs DDP (gloo)").
#
# Manual benchmark: NEVER run in CI (it refuses when $CI is set). Run from anywhere:
#
#     benches/compare/run_torch_step.sh
#
# Every round runs one synkv job (`synkv launch -n 2 -s 1`, dist_sync, 1 server) and one DDP
# job (2 gloo processes), alternating which goes first. Each worker prints one JSON line; they
# go to bench-results/torch-step-<date>.jsonl, and the summary (slower worker per job, median
# over jobs) to .md and .json files next to it.
#
# Environment knobs (all optional):
#   TORCH_VENV     venv with torch (gloo) and the synkv wheel; relative to the repo root (default ./.venv-ci)
#   SYNKV_BIN      the synkv launcher binary (default: cargo build --release -p synkv-cli)
#   BENCH_ROUNDS   synkv+DDP rounds                              (default 3)
#   BENCH_STEPS    timed steps per phase                         (default 10)
#   BENCH_WARMUP   untimed steps per phase                       (default 2)
#   BENCH_ARGS     more torch_ddp_step.py options, e.g. "--batch 64 --widths 1024,4096,4096,10"
#   BENCH_TIMEOUT  seconds per job                               (default 300)
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/torch_common.sh"
torch_bench_setup run_torch_step.sh torch-step
ROUNDS="${BENCH_ROUNDS:-3}"
STEPS="${BENCH_STEPS:-10}"
WARMUP="${BENCH_WARMUP:-2}"
TIMEOUT="${BENCH_TIMEOUT:-300}"
read -r -a EXTRA <<<"${BENCH_ARGS:-}"

common=(--steps "$STEPS" --warmup "$WARMUP" "${EXTRA[@]}")
# keep IMPL: the JSON lines of a job's output, launcher prefixes stripped
keep() { sed -n 's/^\(\[worker [0-9]*\] \)\{0,1\}\({"bench".*\)$/\2/p'; }

run_synkv() {
    echo "== round $1: synkv (synkv launch -n 2 -s 1)" >&2
    SYNKV_TIMEOUT_MS="${SYNKV_TIMEOUT_MS:-60000}" timeout "$TIMEOUT" \
        "$SYNKV" launch -n 2 -s 1 -- "$PY" "$here/torch_ddp_step.py" --impl synkv --run "synkv-$1" "${common[@]}" \
        | keep | tee -a "$out" >&2
}
run_ddp() {
    echo "== round $1: DDP gloo (2 processes)" >&2
    "$PY" "$here/torch_ddp_step.py" --impl ddp --nproc 2 --timeout "$TIMEOUT" --run "ddp-$1" "${common[@]}" \
        | keep | tee -a "$out" >&2
}

for r in $(seq 1 "$ROUNDS"); do
    if (( r % 2 )); then run_synkv "$r"; run_ddp "$r"; else run_ddp "$r"; run_synkv "$r"; fi
done

echo "== $(date -Is)  loadavg $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')" >&2
"$PY" "$here/torch_ddp_step.py" --table "$out" --markdown "${out%.jsonl}.md" --json-out "${out%.jsonl}.json"
