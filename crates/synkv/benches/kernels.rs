//! Criterion benches for `synkv::kernels`: the store's hot loops at the two sizes that matter.
//!
//! - 16 Mi f32 (64 MiB per array): `sum_into` of 2 sources, `copy`, and a push + pull
//!   (sum 2 into the stored value, copy it to 2 outputs), each under the default tuning and
//!   under forced variants (1 or 2 threads × ordinary or non-temporal stores), next to a
//!   `copy_from_slice` (memcpy) baseline on 1 and 2 threads. Throughput counts the bytes the
//!   kernel must move (reads + writes), not the read-for-ownership traffic.
//! - 1000 × `sum_into` of 2 × 1 Ki f32 on distinct arrays (a push of 1000 small keys), per
//!   ISA level.
//!
//! Uses only `synkv::kernels` (and std). Variants change the process-wide tuning and restore
//! the default afterwards. Wire it from `bench_main.rs` with
//! `criterion_group!(benches, kernels::benches)`.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use synkv::kernels::{copy, set_tuning, sum_into, Isa, Tuning};

const BIG: usize = 16 << 20;
const SMALL: usize = 1024;
const KEYS: usize = 1000;

/// The forced variants: (label, tuning).
fn variants() -> Vec<(&'static str, Tuning)> {
    let d = Tuning::DEFAULT;
    let one = usize::MAX;
    vec![
        ("default", d),
        ("1thr", Tuning { parallel_min_len: one, stream_min_bytes: usize::MAX, ..d }),
        ("1thr_nt", Tuning { parallel_min_len: one, stream_min_bytes: 0, ..d }),
        ("2thr", Tuning { parallel_min_len: 1, stream_min_bytes: usize::MAX, ..d }),
        ("2thr_nt", Tuning { parallel_min_len: 1, stream_min_bytes: 0, ..d }),
    ]
}

fn configure(g: &mut BenchmarkGroup<'_, WallTime>, bytes: usize) {
    g.throughput(Throughput::Bytes(bytes as u64));
    g.sample_size(20);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
}

/// memcpy on two threads: each copies half (std only, as a bandwidth ceiling).
fn memcpy_2thr(dst: &mut [f32], src: &[f32]) {
    let (d0, d1) = dst.split_at_mut(dst.len() / 2);
    let (s0, s1) = src.split_at(src.len() / 2);
    std::thread::scope(|s| {
        s.spawn(|| d1.copy_from_slice(s1));
        d0.copy_from_slice(s0);
    });
}

/// Registers every kernel bench with `c`.
pub fn benches(c: &mut Criterion) {
    let a: Vec<f32> = (0..BIG).map(|i| (i % 1000) as f32).collect();
    let b: Vec<f32> = (0..BIG).map(|i| (i % 7) as f32).collect();
    let mut stored = vec![1f32; BIG];
    let mut out = [vec![1f32; BIG], vec![1f32; BIG]];
    let arr = BIG * 4;

    let mut g = c.benchmark_group("kernels/sum_into_2x16M_f32");
    configure(&mut g, 3 * arr);
    for (name, t) in variants() {
        set_tuning(t);
        g.bench_function(name, |bench| bench.iter(|| sum_into(black_box(&mut stored[..]), &[&a, &b])));
    }
    g.finish();

    let mut g = c.benchmark_group("kernels/copy_16M_f32");
    configure(&mut g, 2 * arr);
    set_tuning(Tuning::DEFAULT);
    g.bench_function("memcpy_1thr", |bench| bench.iter(|| out[0].copy_from_slice(black_box(&stored))));
    g.bench_function("memcpy_2thr", |bench| bench.iter(|| memcpy_2thr(&mut out[0], black_box(&stored))));
    for (name, t) in variants() {
        set_tuning(t);
        g.bench_function(name, |bench| bench.iter(|| copy(black_box(&mut out[0][..]), &stored)));
    }
    g.finish();

    let mut g = c.benchmark_group("kernels/push2_pull2_16M_f32");
    configure(&mut g, 7 * arr);
    for (name, t) in variants() {
        set_tuning(t);
        g.bench_function(name, |bench| {
            bench.iter(|| {
                sum_into(black_box(&mut stored[..]), &[&a, &b]);
                let [o0, o1] = &mut out;
                copy(o0, &stored);
                copy(o1, &stored);
            })
        });
    }
    g.finish();
    drop((a, b, stored, out));

    let grads: Vec<Vec<f32>> = (0..2 * KEYS).map(|i| vec![i as f32; SMALL]).collect();
    let mut values: Vec<Vec<f32>> = (0..KEYS).map(|_| vec![0f32; SMALL]).collect();
    let mut g = c.benchmark_group("kernels/sum_into_1000x_2x1K_f32");
    configure(&mut g, KEYS * 3 * SMALL * 4);
    for (name, isa) in [("avx512", Isa::Avx512), ("avx2", Isa::Avx2), ("scalar", Isa::Scalar)] {
        if isa > Isa::detected() {
            continue;
        }
        set_tuning(Tuning { max_isa: isa, ..Tuning::DEFAULT });
        g.bench_function(name, |bench| {
            bench.iter(|| {
                for (k, v) in values.iter_mut().enumerate() {
                    sum_into(black_box(&mut v[..]), &[&grads[2 * k], &grads[2 * k + 1]]);
                }
            })
        });
    }
    g.finish();
    set_tuning(Tuning::DEFAULT);
}
