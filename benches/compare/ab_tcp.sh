#!/usr/bin/env bash
# A/B of two synkv binaries on one host's sealed TCP layouts (SYNKV_SHM=0), alternating round
# by round so both see the same machine noise. Manual benchmark: refuses to run in CI.
#
#     benches/compare/ab_tcp.sh OLD_BIN NEW_BIN
#
# Per round and binary: 2 workers with rank 0's process hosting the only server
# (`hosted1_sealed`), each worker's process hosting a server (`hosted_sealed`), and a separate
# server process (`separate_sealed`); each job under a fresh SYNKV_SECRET, `synkv bench dist`
# push then pull of BENCH_SIZE f32 (default 16777216), BENCH_ITERS (20) timed iterations;
# prints the slowest worker's median, ms. Knobs: BENCH_ROUNDS (3); other SYNKV_* variables in
# the environment reach every job (e.g. SYNKV_STREAMS).
set -euo pipefail
if [[ -n "${CI:-}" ]]; then
    echo "ab_tcp.sh: \$CI is set; this is a manual benchmark and does not run in CI. Refusing." >&2
    exit 0
fi
if [[ $# -ne 2 ]]; then
    echo "usage: $0 OLD_BIN NEW_BIN" >&2
    exit 2
fi
SIZE="${BENCH_SIZE:-16777216}"
ITERS="${BENCH_ITERS:-20}"
slowest() {
    python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
print(round(max(r["median_ms"] for r in rows), 1) if len(rows) == 2 else "failed")'
}
job() { # bin launch-args...
    local bin=$1
    shift
    env -u SYNKV_INSECURE SYNKV_SECRET="$(python3 -c 'import secrets; print(secrets.token_hex(32))')" SYNKV_SHM=0 \
        timeout 600 "$bin" launch "$@" -- "$bin" bench dist --size "$SIZE" --iters "$ITERS" --warmup 3 --json 2>/dev/null \
        | sed -n 's/^\[worker [0-9]*\] //p' | slowest
}
for r in $(seq "${BENCH_ROUNDS:-3}"); do
    for b in "$1" "$2"; do
        echo "round $r $b: hosted1_sealed $(job "$b" --launcher hosted -n 2 -s 1) hosted_sealed $(job "$b" --launcher hosted -n 2 -s 2) separate_sealed $(job "$b" -n 2 -s 1)"
    done
done
