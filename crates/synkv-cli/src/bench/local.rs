//! `synkv bench local`: push(list) + pull(list) on a `local` (or `device`) store.
//!
//! Each iteration pushes `keys` keys, each as a list of `devices` per-device arrays of `size`
//! elements, then pulls every key into `devices` outputs, then waits for completion.
//! GB/s counts the bytes the API moves: keys × size × dtype bytes × (devices pushed +
//! devices pulled), over the median time.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use synkv::optimizer::{Optimizer, Sgd};
use synkv::{create, Context, DType, NDArray};

const SGD_MOMENTUM: f64 = 0.9;
const SGD_LR: f64 = 0.1;

use super::stats::Stats;

/// What a push does with the summed value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum UpdaterKind {
    /// stored = Σ values (the default updater).
    Assign,
    /// SGD, momentum 0.9, learning rate 0.1 (via set_optimizer).
    Sgd,
}

impl UpdaterKind {
    fn name(self) -> &'static str {
        match self {
            UpdaterKind::Assign => "assign",
            UpdaterKind::Sgd => "sgd",
        }
    }
}

/// Arguments of `synkv bench local`.
#[derive(Debug, Args)]
pub(crate) struct LocalArgs {
    /// Elements per array.
    #[arg(long, default_value_t = 1 << 20)]
    size: usize,
    /// Devices (per-device values per key; outputs per key).
    #[arg(long, default_value_t = 1)]
    devices: usize,
    /// Keys per call.
    #[arg(long, default_value_t = 1)]
    keys: usize,
    /// Updater applied on push.
    #[arg(long, value_enum, default_value_t = UpdaterKind::Assign)]
    updater: UpdaterKind,
    /// Timed iterations.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed warm-up iterations.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Element type.
    #[arg(long, default_value = "f32")]
    dtype: DType,
    /// Store type (`local` or `device`).
    #[arg(long, default_value = "local")]
    store: String,
    /// Print one JSON object per case instead of a summary.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Record<'a> {
    #[serde(rename = "impl")]
    implementation: &'a str,
    case: String,
    store: &'a str,
    size: usize,
    devices: usize,
    keys: usize,
    updater: &'a str,
    dtype: &'a str,
    iters: usize,
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
    gbps: f64,
}

pub(crate) fn run(args: &LocalArgs) -> Result<()> {
    if args.devices == 0 || args.keys == 0 || args.size == 0 || args.iters == 0 {
        bail!("--size, --devices, --keys and --iters must be at least 1");
    }
    let kv = create(&args.store)?;
    if args.updater == UpdaterKind::Sgd {
        kv.set_optimizer(Optimizer::from(Sgd { momentum: SGD_MOMENTUM, ..Sgd::default() }).with_learning_rate(SGD_LR))?;
    }
    let keys: Vec<i32> = (0..args.keys as i32).collect();
    let dev = |d: usize| Context::cpu(d);
    let init: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros_with([args.size], args.dtype, dev(0))).collect();
    kv.init(&keys, &init)?;
    // value of device d is (d + 1), so the sum over devices is devices·(devices+1)/2
    let values: Vec<Vec<NDArray>> = keys
        .iter()
        .map(|_| (0..args.devices).map(|d| NDArray::full_with([args.size], (d + 1) as f64, args.dtype, dev(d))).collect())
        .collect();
    let outs: Vec<Vec<NDArray>> =
        keys.iter().map(|_| (0..args.devices).map(|d| NDArray::zeros_with([args.size], args.dtype, dev(d))).collect()).collect();

    let mut samples = Vec::with_capacity(args.iters);
    for i in 0..args.warmup + args.iters {
        let t = Instant::now();
        kv.push(&keys, &values)?;
        kv.pull(&keys, &outs)?;
        kv.wait_all()?;
        if i >= args.warmup {
            samples.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    verify(args, &outs)?;

    let stats = Stats::of(&samples);
    let bytes = (args.keys * args.size * args.dtype.size_of() * 2 * args.devices) as f64;
    let gbps = bytes / (stats.median_ms / 1e3) / 1e9;
    let case = format!("local size={} devices={} keys={} updater={}", args.size, args.devices, args.keys, args.updater.name());
    if args.json {
        let rec = Record {
            implementation: "synkv",
            case,
            store: &args.store,
            size: args.size,
            devices: args.devices,
            keys: args.keys,
            updater: args.updater.name(),
            dtype: args.dtype.name(),
            iters: args.iters,
            median_ms: stats.median_ms,
            min_ms: stats.min_ms,
            max_ms: stats.max_ms,
            gbps,
        };
        println!("{}", serde_json::to_string(&rec)?);
    } else {
        println!(
            "{case} ({}, {} iters): median {:.3} ms, min {:.3} ms, max {:.3} ms, {:.2} GB/s",
            args.store, args.iters, stats.median_ms, stats.min_ms, stats.max_ms, gbps
        );
    }
    Ok(())
}

/// Checks the pulled values so the timing is of real work.
fn verify(args: &LocalArgs, outs: &[Vec<NDArray>]) -> Result<()> {
    let grad = (args.devices * (args.devices + 1) / 2) as f64;
    let expected = match args.updater {
        UpdaterKind::Assign => grad,
        UpdaterKind::Sgd => {
            // w starts at 0; m = momentum·m − lr·g; w += m, once per iteration
            let (mut w, mut m) = (0.0f64, 0.0f64);
            for _ in 0..args.warmup + args.iters {
                m = SGD_MOMENTUM * m - SGD_LR * grad;
                w += m;
            }
            w
        }
    };
    for (k, per_key) in outs.iter().enumerate() {
        for out in per_key {
            let v = out.to_vec::<f64>()?;
            let probe = [0, v.len() / 2, v.len() - 1];
            if let Some(&i) = probe.iter().find(|&&i| (v[i] - expected).abs() > 1e-3 * expected.abs().max(1.0)) {
                bail!("wrong result for key {k}: element {i} is {} but should be {expected}", v[i]);
            }
        }
    }
    Ok(())
}
