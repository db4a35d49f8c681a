#!/usr/bin/env bash
# The cost of hot replication (SYNKV_SERVER_REPLICAS=1) on the dist benchmark: jobs with and
# without replicas alternate (ROUNDS times each, so both see the same machine load), and the
# medians of every worker's median are compared. Defaults: 16M f32, 2 workers x 2 servers,
# server-side SGD, 20 iterations.
#   SYNKV_BIN=target/release/synkv benches/compare/run_replicas.sh
set -euo pipefail
B=${SYNKV_BIN:-target/release/synkv}
SIZE=${BENCH_SIZE:-16777216}
ITERS=${BENCH_ITERS:-20}
ROUNDS=${BENCH_ROUNDS:-3}
WORKERS=${BENCH_WORKERS:-2}
SERVERS=${BENCH_SERVERS:-2}
UPDATER=${BENCH_UPDATER:-sgd}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq 1 "$ROUNDS"); do
  for replicas in 0 1; do
    "$B" launch -n "$WORKERS" -s "$SERVERS" --replicas "$replicas" -- \
      "$B" bench dist --size "$SIZE" --iters "$ITERS" --updater "$UPDATER" 2>/dev/null \
      | grep -o 'median [0-9.]* ms' | awk '{print $2}' >> "$out/r$replicas"
  done
done
python3 - "$out" "$SIZE" "$WORKERS" "$SERVERS" "$UPDATER" "$ROUNDS" <<'PY'
import statistics, sys
d, size, w, s, upd, rounds = sys.argv[1:]
a = [float(x) for x in open(f"{d}/r0")]
b = [float(x) for x in open(f"{d}/r1")]
ma, mb = statistics.median(a), statistics.median(b)
print(f"push+pull {size} f32, {w} workers x {s} servers, updater {upd}, {rounds} jobs each (medians of per-worker medians)")
print(f"| replicas | median ms | all per-worker medians |")
print(f"| --- | --- | --- |")
print(f"| 0 | {ma:.1f} | {' '.join(f'{x:.1f}' for x in a)} |")
print(f"| 1 | {mb:.1f} | {' '.join(f'{x:.1f}' for x in b)} |")
print(f"ratio replicas/none: {mb/ma:.2f}")
PY
