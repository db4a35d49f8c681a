#!/usr/bin/env bash
# Server memory: peak RSS of synkv's and MXNet 1.9.1's dist_sync server for one big key.
# See benches/compare/README.md ("Server memory: peak RSS for one big key").
#
# Manual benchmark: NEVER run in CI (it refuses when $CI is set). Run from the repo root:
#
#     benches/compare/run_rss.sh
#
# For every worker count W in RSS_WORKERS it runs, alternately, synkv
#     $SYNKV_BIN launch -n W -s 1 -- $SYNKV_BIN bench dist --size $RSS_SIZE --keys 1 \
#         --updater assign --iters I --warmup Wu --report-rss --json
# and MXNet
#     mxnet_dist.py --workers W --servers 1 --size $RSS_SIZE --keys 1 --updater assign \
#         --iters I --warmup Wu --report-rss --json
# one job each, 1 server, all on 127.0.0.1. Both print one JSON line per worker carrying
# "server_peak_rss_mb" (per server, MiB, the server's VmHWM from /proc/<pid>/status) and
# "key_mb". Every job's lines (tagged with a "run" id) go to bench-results/rss-<date>.jsonl;
# table_rss.py prints the table: the goal is synkv's server peak RSS <= 3x the key's size for
# every W.
#
# Environment knobs (all optional):
#   MXNET_VENV     venv with mxnet==1.9.1                     (default ./.venv-mxnet)
#   SYNKV_BIN      synkv binary                               (default target/release/synkv;
#                  built with `cargo build --release -p synkv-cli` only when that default is missing)
#   BENCH_ITERS    timed iterations per job                   (default 5)
#   BENCH_WARMUP   untimed warmup iterations per job          (default 1)
#   BENCH_ROUNDS   synkv/mxnet rounds per W                   (default 1)
#   BENCH_ONLY     "synkv" or "mxnet" to run one side only    (default: both)
#   BENCH_TIMEOUT  seconds per job                            (default 600)
#   RSS_WORKERS    worker counts                              (default "2 4 8")
#   RSS_SIZE       f32 elements of the one key                (default 67108864 = 256 MiB)
#   RSS_TARGET     highest passing synkv server RSS / key size (default 3.0)
#
# Memory: a job holds W workers' arrays (MXNet: ~4 key-sized arrays per worker) plus the
# server's, so W=8 with the 256 MiB default needs roughly 10 GiB free.
#
# Exit status: 0 every synkv ratio passes; 1 a synkv ratio fails or is missing, or a synkv job
# failed (with BENCH_ONLY the other side's missing numbers are not failures); 2 the MXNet venv
# is missing or broken. An MXNet job that fails is recorded (ABORT), not a script failure.
set -euo pipefail

if [[ -n "${CI:-}" ]]; then
    echo "run_rss.sh: \$CI is set; this is a manual benchmark and does not run in CI. Refusing." >&2
    exit 0
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
MXNET_VENV="${MXNET_VENV:-$root/.venv-mxnet}"
[[ "$MXNET_VENV" = /* ]] || MXNET_VENV="$PWD/$MXNET_VENV"
if [[ -n "${SYNKV_BIN:-}" && "$SYNKV_BIN" != /* ]]; then SYNKV_BIN="$PWD/$SYNKV_BIN"; fi
cd "$root"

ITERS="${BENCH_ITERS:-5}"
WARMUP="${BENCH_WARMUP:-1}"
ROUNDS="${BENCH_ROUNDS:-1}"
ONLY="${BENCH_ONLY:-}"
TIMEOUT="${BENCH_TIMEOUT:-600}"
WORKERS="${RSS_WORKERS:-2 4 8}"
SIZE="${RSS_SIZE:-67108864}"
TARGET="${RSS_TARGET:-3.0}"
case "$ONLY" in ""|synkv|mxnet) ;; *) echo "BENCH_ONLY must be synkv or mxnet, got '$ONLY'" >&2; exit 1 ;; esac
for w in $WORKERS; do
    [[ "$w" =~ ^[1-9][0-9]*$ ]] || { echo "RSS_WORKERS: '$w' is not a worker count" >&2; exit 1; }
done
[[ "$SIZE" =~ ^[1-9][0-9]*$ ]] || { echo "RSS_SIZE: '$SIZE' is not an element count" >&2; exit 1; }

PY="$MXNET_VENV/bin/python"
if [[ "$ONLY" != "synkv" ]]; then
    if [[ ! -x "$PY" ]] || ! "$PY" -c 'import mxnet, sys; sys.exit(0 if mxnet.__version__ == "1.9.1" else 1)' >/dev/null 2>&1; then
        echo "run_rss.sh: no MXNet 1.9.1 at $MXNET_VENV; create it with" >&2
        echo "    python3 -m venv .venv-mxnet && .venv-mxnet/bin/pip install mxnet==1.9.1 numpy==1.23.5" >&2
        exit 2
    fi
fi
if command -v python3 >/dev/null 2>&1; then HOSTPY=python3; else HOSTPY="$PY"; fi

SYNKV=""
if [[ "$ONLY" != "mxnet" ]]; then
    if [[ -n "${SYNKV_BIN:-}" ]]; then
        SYNKV="$SYNKV_BIN"
        [[ -x "$SYNKV" ]] || { echo "run_rss.sh: SYNKV_BIN=$SYNKV is not executable" >&2; exit 1; }
    else
        SYNKV="$root/target/release/synkv"
        if [[ ! -x "$SYNKV" ]]; then
            echo "== $SYNKV missing: cargo build --release -p synkv-cli" >&2
            cargo build --release -p synkv-cli
            target_dir="$(cargo metadata --format-version 1 --no-deps \
                | "$HOSTPY" -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
            SYNKV="$target_dir/release/synkv"
            [[ -x "$SYNKV" ]] || { echo "run_rss.sh: built binary not found at $SYNKV" >&2; exit 1; }
        fi
    fi
fi

mkdir -p bench-results
stamp="$(date +%Y%m%d-%H%M%S)"
out="bench-results/rss-$stamp.jsonl"
meta="bench-results/rss-$stamp.meta.txt"
: >"$out"
{
    echo "date: $(date -Is)"
    echo "host: $(uname -srm)  nproc: $(nproc)  loadavg: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
    echo "memory: $(grep -E '^(MemTotal|MemAvailable)' /proc/meminfo 2>/dev/null | tr -s ' ' | paste -sd' ' || echo '?')"
    echo "size: $SIZE f32  workers: $WORKERS  servers: 1  iters: $ITERS  warmup: $WARMUP  rounds: $ROUNDS  only: ${ONLY:-both}"
    echo "synkv: ${SYNKV:-(not run)}"
    echo "mxnet venv: $MXNET_VENV"
    env | grep -E '^(OMP_|MKL_|OPENBLAS_|MXNET_|SYNKV_|DMLC_|PS_)' | sort || true
} >"$meta"

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
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if r.get("impl") != sys.argv[1]:
        continue
    r["run"] = sys.argv[2]
    print(json.dumps(r)); n += 1
sys.exit(0 if n else 3)
' "$1" "$2"
}

rc=0
# run_one IMPL WORKERS ROUND
run_one() {
    local impl=$1 w=$2 round=$3 jrc=0
    local -a cmd
    case "$impl" in
        synkv) cmd=(timeout "$TIMEOUT" "$SYNKV" launch -n "$w" -s 1 -- "$SYNKV" bench dist --size "$SIZE"
                    --keys 1 --updater assign --iters "$ITERS" --warmup "$WARMUP" --report-rss --json) ;;
        mxnet) cmd=("$PY" "$here/mxnet_dist.py" --workers "$w" --servers 1 --size "$SIZE" --keys 1
                    --updater assign --iters "$ITERS" --warmup "$WARMUP" --timeout "$TIMEOUT"
                    --report-rss --json) ;;
    esac
    local output t0=$SECONDS
    output="$("${cmd[@]}" 2>"$out.$impl.stderr")" || jrc=$?
    local json
    json="$(printf '%s\n' "$output" | tag "$impl" "w$w-$impl-$round")" || true
    if [[ -n "$json" ]]; then printf '%s\n' "$json" >>"$out"; fi
    if [[ $jrc -ne 0 ]]; then
        echo "  (W=$w) round $round: $impl job failed (exit $jrc) after $((SECONDS - t0)) s: ${cmd[*]}" >&2
        tail -5 "$out.$impl.stderr" | sed 's/^/    /' >&2
        [[ "$impl" == mxnet ]] || rc=1   # an MXNet abort is a result (recorded), not a script failure
        return 0
    fi
    if [[ -z "$json" ]]; then
        echo "  (W=$w) round $round: $impl job exited 0 but printed no JSON record (not counted)" >&2
        tail -5 "$out.$impl.stderr" | sed 's/^/    /' >&2
        rc=1
        return 0
    fi
    printf '  (W=%s) round %d/%d  %-5s %s  (%d s)\n' "$w" "$round" "$ROUNDS" "$impl" \
        "$(printf '%s\n' "$json" | "$HOSTPY" -c '
import json, sys
rs = [json.loads(l) for l in sys.stdin]
rss = max((max(r.get("server_peak_rss_mb") or [0]) for r in rs), default=0)
print("server peak RSS %.1f MiB, worker medians: %s ms" % (rss, " ".join("%.1f" % r["median_ms"] for r in rs if r.get("median_ms") is not None)))
')" "$((SECONDS - t0))" >&2
}

for w in $WORKERS; do
    echo "== W=$w: 1 key x $SIZE f32 ($((SIZE * 4 / 1048576)) MiB), 1 server, assign" >&2
    for ((r = 1; r <= ROUNDS; r++)); do
        [[ "$ONLY" == mxnet ]] || run_one synkv "$w" "$r"
        [[ "$ONLY" == synkv ]] || run_one mxnet "$w" "$r"
    done
done
rm -f "$out".*.stderr

echo
table_args=(--size "$SIZE" --workers "$WORKERS" --target "$TARGET")
[[ -z "$ONLY" ]] || table_args+=(--allow-missing)
"$HOSTPY" "$here/table_rss.py" "$out" "${table_args[@]}" || rc=1
echo
echo "results: $out  (run info: $meta)"
exit "$rc"
