//! `synkv bench local`: push(list) + pull(list) on a `local` (or `device`) store.
//!
//! Each iteration pushes `keys` keys, each as a list of `devices` per-device arrays of `size`
//! elements, then pulls every key into `devices` outputs, then waits for completion.
//! GB/s counts the bytes the API moves: keys × size × dtype bytes × (devices pushed +
//! devices pulled), over the median time.
//!
//! `--size` takes a list (`--size 1024,65536,1048576`): one case per size, each on a fresh
//! store; `--plot FILE.png` draws the median time (min–max whiskers) against the size.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use synkv::optimizer::{Optimizer, Sgd};
use synkv::{create, Context, DType, NDArray};

const SGD_MOMENTUM: f64 = 0.9;
const SGD_LR: f64 = 0.1;

use super::plot::{self, Chart, Point};
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
    /// Elements per array; a comma-separated list runs one case per size.
    #[arg(long, value_delimiter = ',', default_value = "1048576")]
    size: Vec<usize>,
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
    /// Also draw the median time against the size into this PNG file.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
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
    if args.devices == 0 || args.keys == 0 || args.size.contains(&0) || args.iters == 0 {
        bail!("--size, --devices, --keys and --iters must be at least 1");
    }
    if let Some(path) = &args.plot {
        plot::check_target(path)?;
    }
    let mut measured = Vec::with_capacity(args.size.len());
    for &size in &args.size {
        let stats = case(args, size)?;
        report(args, size, stats)?;
        measured.push((size, stats));
    }
    if let Some(path) = &args.plot {
        chart(args, &measured).write_png(path)?;
        eprintln!("chart written to {}", path.display());
    }
    Ok(())
}

/// Runs the case of one size on a fresh store; returns its timings.
fn case(args: &LocalArgs, size: usize) -> Result<Stats> {
    let kv = create(&args.store)?;
    if args.updater == UpdaterKind::Sgd {
        kv.set_optimizer(Optimizer::from(Sgd { momentum: SGD_MOMENTUM, ..Sgd::default() }).with_learning_rate(SGD_LR))?;
    }
    let keys: Vec<i32> = (0..args.keys as i32).collect();
    let dev = |d: usize| Context::cpu(d);
    let init: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros_with([size], args.dtype, dev(0))).collect();
    kv.init(&keys, &init)?;
    // value of device d is (d + 1), so the sum over devices is devices·(devices+1)/2
    let values: Vec<Vec<NDArray>> =
        keys.iter().map(|_| (0..args.devices).map(|d| NDArray::full_with([size], (d + 1) as f64, args.dtype, dev(d))).collect()).collect();
    let outs: Vec<Vec<NDArray>> =
        keys.iter().map(|_| (0..args.devices).map(|d| NDArray::zeros_with([size], args.dtype, dev(d))).collect()).collect();

    let progress = crate::progress::bar((args.warmup + args.iters) as u64, &format!("local size={}", plot::elements(size)));
    let mut samples = Vec::with_capacity(args.iters);
    for i in 0..args.warmup + args.iters {
        let t = Instant::now();
        kv.push(&keys, &values)?;
        kv.pull(&keys, &outs)?;
        kv.wait_all()?;
        if i >= args.warmup {
            samples.push(t.elapsed().as_secs_f64() * 1e3);
        }
        progress.inc(1);
    }
    progress.finish_and_clear();
    verify(args, &outs)?;
    Ok(Stats::of(&samples))
}

/// Prints one case's result.
fn report(args: &LocalArgs, size: usize, stats: Stats) -> Result<()> {
    let bytes = (args.keys * size * args.dtype.size_of() * 2 * args.devices) as f64;
    let gbps = bytes / (stats.median_ms / 1e3) / 1e9;
    let case = format!("local size={} devices={} keys={} updater={}", size, args.devices, args.keys, args.updater.name());
    if args.json {
        let rec = Record {
            implementation: "synkv",
            case,
            store: &args.store,
            size,
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

/// The chart of `measured` (size, timings): one series, time against elements per array.
fn chart(args: &LocalArgs, measured: &[(usize, Stats)]) -> Chart {
    let mut c = Chart::new(
        format!(
            "synkv bench local: store={} devices={} keys={} updater={} {}, median of {} iters",
            args.store,
            args.devices,
            args.keys,
            args.updater.name(),
            args.dtype.name(),
            args.iters
        ),
        format!("elements per array ({})", args.dtype.name()),
        "push + pull time (ms)",
    );
    for &(size, s) in measured {
        c.add("synkv push + pull (min–max)", Point::spread(size as f64, s.median_ms, s.min_ms, s.max_ms));
    }
    c
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: LocalArgs,
    }

    #[test]
    fn sizes_are_a_list_and_each_becomes_a_point() {
        let cli = Cli::try_parse_from(["bench", "--size", "1024,65536", "--devices", "2", "--iters", "3"]).unwrap();
        assert_eq!(cli.args.size, [1024, 65536]);
        let stats = |m: f64| Stats { median_ms: m, min_ms: m / 2.0, max_ms: m * 2.0 };
        let c = chart(&cli.args, &[(1024, stats(0.1)), (65536, stats(2.0))]);
        assert_eq!(c.series.len(), 1);
        assert_eq!(c.series[0].points, [Point::spread(1024.0, 0.1, 0.05, 0.2), Point::spread(65536.0, 2.0, 1.0, 4.0)]);
        assert!(c.title.contains("devices=2") && c.title.contains("3 iters"), "{}", c.title);
    }

    #[test]
    fn a_small_run_draws_its_chart() {
        crate::progress::disable(); // no bar on a developer's terminal while tests run
        if !plot::tests::font_or_skip("a_small_run_draws_its_chart") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("local.png");
        let p = path.to_str().unwrap();
        let cli = Cli::try_parse_from(["bench", "--size", "256,4096", "--iters", "2", "--warmup", "0", "--plot", p]).unwrap();
        run(&cli.args).unwrap();
        assert_eq!(plot::tests::png_size(&std::fs::read(&path).unwrap()), (plot::WIDTH, plot::HEIGHT));
    }
}
