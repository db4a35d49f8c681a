//! Gradient-compression scenarios on a distributed store: T28 (2-bit) and T29 (1-bit) of
//! MXNet's nightly `dist_sync_kvstore.py` (spec K11, K7.14) with the Test optimizer
//! `w += rate·g`, plus compression turned on after `init` and compressed `pushpull`.
//!
//! Expected numbers come from the spec's sequences; the random cases simulate every worker's
//! quantization with its own residual (all workers push the same seeded data) using the
//! library's bit-exact kernels, exactly as MXNet's test simulates its operator.

use anyhow::{bail, Result};
use synkv::compression::GradientCompression;
use synkv::optimizer::Optimizer;
use synkv::{DType, KVStore, NDArray};

use super::cases::{full, RATE};
use super::{expect_all, DistArgs};
use crate::rng::SplitMix64;

/// The three shapes of T28: small, irregular (1211², split over servers in units of words),
/// big (1200², split).
const SHAPES: [[usize; 2]; 3] = [[2, 3], [1211, 1211], [1200, 1200]];

fn pull_f32(kv: &KVStore, key: &str, shape: &[usize]) -> Result<NDArray> {
    let out = full(shape, -7.0, DType::F32);
    kv.pull(key, &out)?;
    out.wait_to_read()?;
    Ok(out)
}

/// Pushes `ones·g` to every key, then checks each pull is `before + delta` (per key).
fn step(kv: &KVStore, keys: &[String], g: f64, want: &mut [f64], delta: f64, what: &str) -> Result<()> {
    for (k, shape) in keys.iter().zip(SHAPES) {
        kv.push(k.as_str(), &full(&shape, g, DType::F32))?;
    }
    for ((k, shape), w) in keys.iter().zip(SHAPES).zip(want.iter_mut()) {
        *w += delta;
        expect_all(&format!("{what}: key {k}"), &pull_f32(kv, k, &shape)?, *w, 1e-6)?;
    }
    Ok(())
}

/// Random gradients (the same on every worker): each push changes the value by
/// `rate · n · dequantize(quantize(g, residual))`, simulated here with a residual per key.
fn random(kv: &KVStore, gc: &GradientCompression, prefix: &str, repeat: usize) -> Result<()> {
    let n = kv.num_workers() as f32;
    let keys: Vec<String> = (0..SHAPES.len()).map(|i| format!("{prefix}{i}")).collect();
    for (k, shape) in keys.iter().zip(SHAPES) {
        kv.init(k.as_str(), &full(&shape, 0.0, DType::F32))?;
    }
    let mut rng = SplitMix64(123);
    for (k, shape) in keys.iter().zip(SHAPES) {
        let len = shape[0] * shape[1];
        let mut residual = vec![0.0f32; len];
        let mut words = vec![0u32; gc.compressed_len(len)];
        let mut deq = vec![0.0f32; len];
        for i in 0..repeat {
            let before = pull_f32(kv, k, &shape)?.to_vec::<f32>()?;
            let grad: Vec<f32> = (0..len).map(|_| rng.uniform_f32()).collect();
            kv.push(k.as_str(), &NDArray::from_vec(shape.to_vec(), grad.clone())?)?;
            let after = pull_f32(kv, k, &shape)?.to_vec::<f32>()?;
            gc.quantize(&grad, &mut residual, &mut words)?;
            gc.dequantize(&words, len, &mut deq)?;
            for (j, ((a, b), d)) in after.iter().zip(&before).zip(&deq).enumerate() {
                let want = d * n * RATE as f32;
                if ((a - b) - want).abs() > 1e-5 * want.abs().max(1.0) + 1e-5 * b.abs() {
                    bail!("random push {i} of key {k}: element {j} changed by {}, expected {want}", a - b);
                }
            }
        }
    }
    Ok(())
}

/// T28: 2-bit, threshold 0.5, compression set before `init`.
pub(super) fn t28(kv: &KVStore, args: &DistArgs) -> Result<()> {
    let t = 0.5;
    kv.set_optimizer(Optimizer::test().with_rescale_grad(RATE))?;
    kv.set_gradient_compression([("type", "2bit"), ("threshold", "0.5")])?;
    let n = kv.num_workers() as f64;
    let keys: Vec<String> = ["1000", "1200", "1300"].map(String::from).to_vec();
    let inited: Vec<String> = ["1001", "1201", "1301"].map(String::from).to_vec();
    for (k, shape) in keys.iter().zip(SHAPES) {
        kv.init(k.as_str(), &full(&shape, 0.0, DType::F32))?;
    }
    for (k, shape) in inited.iter().zip(SHAPES) {
        kv.init(k.as_str(), &full(&shape, 1.0, DType::F32))?;
    }
    // Pull before push; init values travel uncompressed.
    for (k, shape) in keys.iter().zip(SHAPES) {
        expect_all(&format!("pull before push: key {k}"), &pull_f32(kv, k, &shape)?, 0.0, 0.0)?;
    }
    for (k, shape) in inited.iter().zip(SHAPES) {
        expect_all(&format!("init is not compressed: key {k}"), &pull_f32(kv, k, &shape)?, 1.0, 0.0)?;
    }
    let mut want = vec![0.0; keys.len()];
    step(kv, &keys, 0.0, &mut want, 0.0, "push of zeros")?;
    // The residual sequence (K7.14, dist): 0.4 → nothing; 0.1 → crosses t; 0.2 → nothing;
    // 0.3 → crosses again; the residual is back to 0.
    step(kv, &keys, 0.4, &mut want, 0.0, "0.4 stays in the residual")?;
    step(kv, &keys, t - 0.4, &mut want, t * RATE * n, "0.4 + 0.1 reaches the threshold")?;
    step(kv, &keys, 0.2, &mut want, 0.0, "0.2 stays in the residual")?;
    step(kv, &keys, t - 0.2, &mut want, t * RATE * n, "0.2 + 0.3 reaches the threshold")?;
    step(kv, &keys, t, &mut want, RATE * n * t, "ones·t")?;
    step(kv, &keys, -t, &mut want, -RATE * n * t, "-ones·t")?;
    let gc = GradientCompression::from_pairs([("type", "2bit"), ("threshold", "0.5")])?;
    random(kv, &gc, "1002-", args.repeat)
}

/// T29: 1-bit, threshold 0 (values ±1 whatever the magnitude).
pub(super) fn t29(kv: &KVStore, args: &DistArgs) -> Result<()> {
    kv.set_optimizer(Optimizer::test().with_rescale_grad(RATE))?;
    kv.set_gradient_compression([("type", "1bit"), ("threshold", "0")])?;
    let n = kv.num_workers() as f64;
    let keys: Vec<String> = ["2000", "2200", "2300"].map(String::from).to_vec();
    for (k, shape) in keys.iter().zip(SHAPES) {
        kv.init(k.as_str(), &full(&shape, 0.0, DType::F32))?;
    }
    for (k, shape) in keys.iter().zip(SHAPES) {
        expect_all(&format!("pull before push: key {k}"), &pull_f32(kv, k, &shape)?, 0.0, 0.0)?;
    }
    let mut want = vec![0.0; keys.len()];
    for i in 0..args.repeat {
        step(kv, &keys, 1.0, &mut want, RATE * n, &format!("ones, push {i}"))?;
    }
    for i in 0..args.repeat {
        step(kv, &keys, -1.0, &mut want, -RATE * n, &format!("-ones, push {i}"))?;
    }
    // K7.14 with residual tracking (t = 0): r = 2 → +1 (r = 1); r = 1 → +1 (r = 0);
    // r = −2 → −1 (r = −1).
    step(kv, &keys, 2.0, &mut want, RATE * n, "push 2")?;
    step(kv, &keys, 0.0, &mut want, RATE * n, "push 0 with residual 1")?;
    step(kv, &keys, -2.0, &mut want, -RATE * n, "push -2")?;
    let gc = GradientCompression::from_pairs([("type", "1bit"), ("threshold", "0")])?;
    random(kv, &gc, "2002-", args.repeat)
}

/// Compression turned on after `init` (MXNet would corrupt split keys, K12.23): keys keep
/// their split and their slices are quantized one by one. Also a compressed `pushpull`
/// (MXNet refuses it on dist, K7.13), and a clear error for f16 keys.
pub(super) fn after_init(kv: &KVStore) -> Result<()> {
    // Sync: the sum of every worker's push is assigned; async: each push is assigned alone.
    let n = if kv.store_type() == synkv::store::StoreType::DistAsync { 1.0 } else { kv.num_workers() as f64 };
    let shape = [1211usize, 1211];
    kv.init("late", &full(&shape, 1.0, DType::F32))?;
    kv.init("half", &full(&[4], 1.0, DType::F16))?;
    kv.set_gradient_compression([("type", "2bit"), ("threshold", "0.5")])?;
    kv.push("late", &full(&shape, 0.75, DType::F32))?;
    // 0.75 ≥ 0.5 → +0.5 per worker, assigned (no optimizer).
    expect_all("push after turning compression on", &pull_f32(kv, "late", &shape)?, 0.5 * n, 0.0)?;
    let out = full(&shape, 0.0, DType::F32);
    // Residual 0.25 + 0.3 ≥ 0.5 → +0.5 again.
    kv.pushpull("late", &full(&shape, 0.3, DType::F32), &out)?;
    expect_all("compressed pushpull", &out, 0.5 * n, 0.0)?;
    match kv.push("half", &full(&[4], 1.0, DType::F16)) {
        Err(e) if e.to_string().contains("dense float32 values only") => println!("f16 push refused as expected: {e}"),
        other => bail!("an f16 push on a compressing store should be refused, got {other:?}"),
    }
    Ok(())
}
