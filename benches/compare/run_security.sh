#!/usr/bin/env bash
# The cost of security on by default: the dist push+pull benchmark with every frame sealed
# (synkv launch's per-job secret) and without (SYNKV_INSECURE=1: no secret, plain frames),
# alternating, in one run. Prints per-round medians and the median ratio sealed / plain.
#
# Manual benchmark: NEVER run in CI (it refuses when $CI is set). From the repo root:
#
#     benches/compare/run_security.sh
#
# Environment knobs (all optional):
#   BENCH_SIZES    elements per array, space-separated       (default "16777216 1048576")
#   BENCH_ROUNDS   sealed/plain pairs per size               (default 5)
#   BENCH_ITERS    timed iterations per job                  (default 20)
#   SYNKV_BIN      this synkv binary instead of `cargo build --release -p synkv-cli`
set -euo pipefail
if [[ -n "${CI:-}" ]]; then
    echo "run_security.sh: \$CI is set; this is a manual benchmark and does not run in CI. Refusing." >&2
    exit 0
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
if [[ -z "${SYNKV_BIN:-}" ]]; then
    cargo build --release -q -p synkv-cli
    SYNKV_BIN="$root/target/release/synkv"
fi
SIZES="${BENCH_SIZES:-16777216 1048576}"
ROUNDS="${BENCH_ROUNDS:-5}"
ITERS="${BENCH_ITERS:-20}"
mkdir -p bench-results
out="bench-results/security-$(date -u +%Y%m%dT%H%M%SZ).jsonl"

# One job: the slowest worker's median (ms).
job() { # mode size
    local env=(env -u SYNKV_SECRET)
    [[ "$1" == plain ]] && env+=(SYNKV_INSECURE=1) || env+=(-u SYNKV_INSECURE)
    "${env[@]}" timeout 600 "$SYNKV_BIN" launch -n 2 -s 1 -- "$SYNKV_BIN" bench dist --size "$2" --iters "$ITERS" --warmup 3 --json 2>/dev/null \
        | sed -n 's/^\[worker [0-9]*\] //p' | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
assert len(rows) == 2, rows
print(max(r["median_ms"] for r in rows))'
}

echo "sealed = synkv launch (per-job secret, every frame sealed); plain = SYNKV_INSECURE=1"
for size in $SIZES; do
    sealed=(); plain=()
    for r in $(seq "$ROUNDS"); do
        s=$(job sealed "$size"); p=$(job plain "$size")
        sealed+=("$s"); plain+=("$p")
        echo "{\"size\":$size,\"round\":$r,\"sealed_ms\":$s,\"plain_ms\":$p}" | tee -a "$out"
    done
    python3 - "$size" "${sealed[*]}" "${plain[*]}" <<'PY'
import statistics, sys
size, sealed, plain = int(sys.argv[1]), [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
ratios = [s / p for s, p in zip(sealed, plain)]
print(f"size {size}: sealed {statistics.median(sealed):.1f} ms, plain {statistics.median(plain):.1f} ms, "
      f"sealed/plain per pair: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
PY
done
echo "records: $out"
