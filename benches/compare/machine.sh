# Sourced by the benchmark scripts: `machine_line` prints one line saying what machine the
# figures come from — the CPU model, the widest SIMD the kernels can use there (they pick it
# at run time, so the same binary runs its AVX-512, AVX2 or SSE paths), cores,
# and the load — so that records taken on different days can be compared (this development
# VM lost AVX-512 after a reboot on 2026-12-07).
machine_line() {
    local model simd flags
    model=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
    flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
    if [[ " $flags " == *" avx512f "* ]]; then
        simd=avx512f
    elif [[ " $flags " == *" avx2 "* ]]; then
        simd=avx2
    else
        simd="sse or less"
    fi
    echo "machine: ${model:-unknown cpu}; simd: $simd; cores: $(nproc); loadavg: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')"
}

# `bench_prelude NAME`: what a manual benchmark script does first — refuses to run in CI (exits
# 0 with a message), moves to the repository root (`$root`), and builds the release `synkv`
# into SYNKV_BIN unless SYNKV_BIN names one.
bench_prelude() {
    if [[ -n "${CI:-}" ]]; then
        echo "$1: \$CI is set; this is a manual benchmark and does not run in CI. Refusing." >&2
        exit 0
    fi
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
    cd "$root"
    if [[ -z "${SYNKV_BIN:-}" ]]; then
        cargo build --release -q -p synkv-cli
        SYNKV_BIN="$root/target/release/synkv"
    fi
}
