#!/usr/bin/env bash
# Shared memory vs TCP, sealed vs plain, and torch gloo all_reduce, side by side (issue 13
# item 1, issue 15's cost of sealing). Manual benchmark: refuses to run in CI.
#
#     benches/compare/run_shm.sh
#
# Per round and size, alternately: synkv over shared memory (the default on one host),
# over TCP (SYNKV_SHM=0), each sealed (a per-job secret, as `synkv launch` runs every job)
# and plain (SYNKV_INSECURE=1), then one pushpull job (shared memory, sealed: push and pull in
# one request, the all_reduce equivalent the PyTorch front-end issues), then two jobs of two
# processes hosting a server each (`tcp_hosted` with `SYNKV_SHM=0`, `shm_hosted` without,
# plain; see hosted_job; `tcp_hosted_sealed` under a per-job `SYNKV_SECRET`) and one where rank 0's process hosts the only server (`tcp_hosted1`,
# `SYNKV_SHM=0`: the literal 2 workers × 1 server, the other worker over TCP; plain, and sealed
# under a per-job `SYNKV_SECRET` as `tcp_hosted1_sealed`), then gloo's all_reduce
# of the same tensor (if TORCH_PY has torch with gloo). 2 workers, 1 server, `synkv bench
# dist` push then pull unless said otherwise; a job's time is the slowest worker's median. Prints the medians over rounds and per-round ratios; records go
# to bench-results/shm-<date>.jsonl.
#
# Knobs: BENCH_SIZES (default "16777216 1048576"), BENCH_ROUNDS (3), BENCH_ITERS (20; ten
# times as many for sizes up to 4M elements: a job of 40 1M iterations lasts under 0.1 s and
# measured 2.6-2.7 ms where 200 iterations measure 1.8-2.0), TORCH_PY (default
# /usr/bin/python3: Debian's python3-torch), SYNKV_BIN.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/machine.sh"
bench_prelude run_shm.sh
SIZES="${BENCH_SIZES:-16777216 1048576}"
ROUNDS="${BENCH_ROUNDS:-3}"
ITERS="${BENCH_ITERS:-20}"
TORCH_PY="${TORCH_PY:-/usr/bin/python3}"
have_torch=0
"$TORCH_PY" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null && have_torch=1
mkdir -p bench-results
out="bench-results/shm-$(date -u +%Y%m%dT%H%M%SZ).jsonl"

# Timed iterations for a size (elements).
iters_for() {
    if (($1 <= 4194304)); then echo $((ITERS * 10)); else echo "$ITERS"; fi
}

slowest() {
    python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
assert len(rows) == 2, rows
print(max(r["median_ms"] for r in rows))'
}

synkv_job() { # shm(0|1) sealed|plain size [bench dist options]
    local env=(env -u SYNKV_SECRET -u SYNKV_INSECURE "SYNKV_SHM=$1")
    [[ "$2" == plain ]] && env+=(SYNKV_INSECURE=1)
    "${env[@]}" timeout 600 "$SYNKV_BIN" launch -n 2 -s 1 -- "$SYNKV_BIN" bench dist --size "$3" --iters "$(iters_for "$3")" --warmup 3 --json "${@:4}" 2>/dev/null \
        | sed -n 's/^\[worker [0-9]*\] //p' | slowest
}

# Two processes that host a server each (`synkv launch --launcher hosted`: started as
# torchrun starts them, SYNKV_NUM_SERVERS=2), plain frames unless HOSTED_SECRET is set: a
# worker reaches its own process's server through memory whatever SYNKV_SHM says, the other
# one's over TCP with SYNKV_SHM=0 (BytePS's colocated servers; the layout of a multi-host job
# with a server per host).
hosted_job() { # shm(0|1) servers(1|2) size [bench dist options]
    local frames=(SYNKV_INSECURE=1)
    [[ -n "${HOSTED_SECRET:-}" ]] && frames=("SYNKV_SECRET=$HOSTED_SECRET")
    env -u SYNKV_SECRET -u SYNKV_INSECURE "${frames[@]}" "SYNKV_SHM=$1" timeout 600 "$SYNKV_BIN" launch --launcher hosted -n 2 -s "$2" -- \
        "$SYNKV_BIN" bench dist --size "$3" --iters "$(iters_for "$3")" --warmup 3 --json "${@:4}" 2>/dev/null \
        | sed -n 's/^\[worker [0-9]*\] //p'
}

fresh_secret() {
    python3 -c 'import secrets; print(secrets.token_hex(32))'
}

gloo_job() { # size
    if [[ $have_torch == 1 ]]; then
        timeout 600 "$TORCH_PY" benches/compare/torch_gloo.py --workers 2 --size "$1" --iters "$(iters_for "$1")" --warmup 3 --json 2>/dev/null | slowest
    else
        echo null
    fi
}

machine_line
echo "shm/tcp: SYNKV_SHM=1/0; sealed: a per-job secret (the default of synkv launch); plain: SYNKV_INSECURE=1"
for size in $SIZES; do
    for r in $(seq "$ROUNDS"); do
        a=$(synkv_job 1 sealed "$size"); b=$(synkv_job 0 sealed "$size")
        c=$(synkv_job 1 plain "$size"); d=$(synkv_job 0 plain "$size"); p=$(synkv_job 1 sealed "$size" --pushpull)
        h=$(hosted_job 0 2 "$size" | slowest); hs=$(hosted_job 1 2 "$size" | slowest); h1=$(hosted_job 0 1 "$size" | slowest)
        h1s=$(HOSTED_SECRET="$(fresh_secret)" hosted_job 0 1 "$size" | slowest)
        hsd=$(HOSTED_SECRET="$(fresh_secret)" hosted_job 0 2 "$size" | slowest)
        g=$(gloo_job "$size")
        echo "{\"size\":$size,\"round\":$r,\"shm_sealed_ms\":$a,\"tcp_sealed_ms\":$b,\"shm_plain_ms\":$c,\"tcp_plain_ms\":$d,\"shm_pushpull_ms\":$p,\"tcp_hosted_ms\":$h,\"shm_hosted_ms\":$hs,\"tcp_hosted1_ms\":$h1,\"tcp_hosted1_sealed_ms\":$h1s,\"tcp_hosted_sealed_ms\":$hsd,\"gloo_ms\":$g}" | tee -a "$out"
    done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for size in sorted({r["size"] for r in rows}, reverse=True):
    rs = [r for r in rows if r["size"] == size]
    med = lambda k: statistics.median(r[k] for r in rs) if all(r.get(k) is not None for r in rs) else None
    ratio = lambda a, b: statistics.median(r[a] / r[b] for r in rs) if all(r.get(a) and r.get(b) for r in rs) else None
    cols = ["shm_sealed_ms", "tcp_sealed_ms", "shm_plain_ms", "tcp_plain_ms", "shm_pushpull_ms", "tcp_hosted_ms", "shm_hosted_ms", "tcp_hosted1_ms", "tcp_hosted1_sealed_ms", "tcp_hosted_sealed_ms", "gloo_ms"]
    print(f"size {size}: " + ", ".join(f"{c[:-3]} {med(c):.1f} ms" if med(c) is not None else f"{c[:-3]} n/a" for c in cols))
    for a, b in [("shm_sealed_ms", "shm_plain_ms"), ("tcp_sealed_ms", "tcp_plain_ms"), ("shm_sealed_ms", "tcp_sealed_ms"),
                 ("shm_sealed_ms", "gloo_ms"), ("shm_pushpull_ms", "gloo_ms"), ("tcp_plain_ms", "gloo_ms"),
                 ("tcp_hosted_ms", "gloo_ms"), ("shm_hosted_ms", "gloo_ms"), ("tcp_hosted1_ms", "gloo_ms"),
                 ("tcp_hosted1_sealed_ms", "gloo_ms"), ("tcp_hosted1_sealed_ms", "tcp_hosted1_ms"),
                 ("tcp_hosted_sealed_ms", "gloo_ms"), ("tcp_hosted_sealed_ms", "tcp_hosted_ms")]:
        r = ratio(a, b)
        print(f"  {a[:-3]} / {b[:-3]}: " + (f"{r:.3f} (median of per-round ratios)" if r is not None else "n/a"))
PY
echo "records: $out"
