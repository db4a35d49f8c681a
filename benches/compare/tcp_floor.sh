#!/usr/bin/env bash
# The separate-server TCP layout against its loopback floor and gloo (issue 13's TCP goal).
# Manual benchmark: refuses to run in CI.
#
#     benches/compare/tcp_floor.sh
#
# Per round, alternately: `synkv bench floor` (a bare TCP echo of the same bytes: 2 worker
# processes each send 64 MiB to a middle process that sends every piece straight back; no
# protocol, no sum, no wait for the other worker), the same with the MAC work of sealed
# connections (`--sealed`), synkv with a separate server process over TCP (`SYNKV_SHM=0 synkv
# launch -n 2 -s 1`, `bench dist` push then pull of 16M f32) plain (SYNKV_INSECURE=1) and
# sealed (a per-job secret, as `synkv launch` runs every job), and torch gloo's all_reduce of
# the same tensor. Prints medians over rounds and the medians of per-round ratios; records go to
# bench-results/tcp-floor-<date>.jsonl. A job's time is its slowest worker's median.
#
# Knobs: BENCH_SIZE (f32 elements, default 16777216), BENCH_ROUNDS (3), BENCH_ITERS (20),
# TORCH_PY (/usr/bin/python3: Debian's python3-torch), SYNKV_BIN.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/machine.sh"
bench_prelude tcp_floor.sh
SIZE="${BENCH_SIZE:-16777216}"
ITERS="${BENCH_ITERS:-20}"
TORCH_PY="${TORCH_PY:-/usr/bin/python3}"
mkdir -p bench-results
out="bench-results/tcp-floor-$(date -u +%Y%m%dT%H%M%SZ).jsonl"

slowest() {
    python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
print(max(r["median_ms"] for r in rows) if len(rows) == 2 else "null")'
}
floor_job() { # [--sealed]
    timeout 600 "$SYNKV_BIN" bench floor --bytes $((SIZE * 4)) --iters "$ITERS" --json "$@" | slowest
}
synkv_job() { # sealed|plain
    local frames=(SYNKV_SECRET="$(python3 -c 'import secrets; print(secrets.token_hex(32))')")
    [[ "$1" == plain ]] && frames=(SYNKV_INSECURE=1)
    env -u SYNKV_SECRET -u SYNKV_INSECURE "${frames[@]}" SYNKV_SHM=0 timeout 600 "$SYNKV_BIN" launch -n 2 -s 1 -- \
        "$SYNKV_BIN" bench dist --size "$SIZE" --iters "$ITERS" --warmup 3 --json 2>/dev/null \
        | sed -n 's/^\[worker [0-9]*\] //p' | slowest
}
gloo_job() {
    timeout 600 "$TORCH_PY" benches/compare/torch_gloo.py --workers 2 --size "$SIZE" --iters "$ITERS" --warmup 3 --json 2>/dev/null | slowest
}

machine_line
for r in $(seq "${BENCH_ROUNDS:-3}"); do
    fp=$(floor_job); fs=$(floor_job --sealed); sp=$(synkv_job plain); ss=$(synkv_job sealed); g=$(gloo_job)
    echo "{\"size\":$SIZE,\"round\":$r,\"floor_plain_ms\":$fp,\"floor_sealed_ms\":$fs,\"synkv_plain_ms\":$sp,\"synkv_sealed_ms\":$ss,\"gloo_ms\":$g}" | tee -a "$out"
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cols = ["floor_plain_ms", "floor_sealed_ms", "synkv_plain_ms", "synkv_sealed_ms", "gloo_ms"]
med = lambda k: statistics.median(r[k] for r in rows) if all(r[k] is not None for r in rows) else None
print("medians: " + ", ".join(f"{c[:-3]} {med(c):.1f} ms" if med(c) is not None else f"{c[:-3]} n/a" for c in cols))
for a, b in [("floor_plain_ms", "gloo_ms"), ("floor_sealed_ms", "gloo_ms"), ("synkv_plain_ms", "gloo_ms"),
             ("synkv_sealed_ms", "gloo_ms"), ("synkv_plain_ms", "floor_plain_ms"), ("synkv_sealed_ms", "floor_sealed_ms")]:
    ok = all(r[a] and r[b] for r in rows)
    print(f"  {a[:-3]} / {b[:-3]}: " + (f"{statistics.median(r[a] / r[b] for r in rows):.3f} (median of per-round ratios)" if ok else "n/a"))
PY
echo "records: $out"
