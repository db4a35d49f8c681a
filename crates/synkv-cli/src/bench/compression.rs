//! `synkv bench compression`: 2-bit / 1-bit quantize and dequantize of one large f32 array,
//! against the memory bandwidth of the same machine, measured in the same run.
//!
//! The kernels stream through memory once, so the yardstick is a kernel of the crate with the
//! same access pattern, timed alongside (each iteration runs every case once, so a noisy
//! neighbour slows all of them alike). Before each timed operation a buffer larger than the
//! last-level cache is read, so no operation pays for the write-backs of the one before.
//! GB/s counts the bytes each operation must move:
//!
//! | case | traffic (n elements, `p` packed bytes = 4·ceil(n/16) or 4·ceil(n/32)) | baseline (same pattern) |
//! |------|-----------------------------------------------------------------------|-------------------------|
//! | `quantize` | read grad 4n + read residual 4n + write residual 4n + write `p` | `kernels::add_into` (12n) |
//! | `dequantize` | read `p` + write out 4n | `kernels::fill` (4n) |
//! | `dequantize_add` | read `p` + read acc 4n + write acc 4n | `kernels::scale` (8n) |
//!
//! `ratio` = GB/s of the case / GB/s of its baseline, both from medians (the minima are
//! printed too: on a busy machine they show what the hardware can do). After timing, the final residual and the
//! last codes of a few probe elements are checked against the spec's formula, so the numbers
//! are of real work.
//!
//! `--size` takes a list (one run per size); `--plot FILE.png` draws the GB/s of each
//! operation and of its baseline against the size.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, ensure, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use synkv::compression::{simd_level, CompressionType, GradientCompression};
use synkv::kernels;

use super::plot::{self, Chart, Point};
use super::stats::Stats;

/// The compression scheme to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Kind {
    /// 2-bit: 16 values per word.
    #[value(name = "2bit")]
    TwoBit,
    /// 1-bit: 32 values per word.
    #[value(name = "1bit")]
    OneBit,
}

/// Arguments of `synkv bench compression`.
#[derive(Debug, Args)]
pub(crate) struct CompressionArgs {
    /// Elements (f32) of the gradient; the default is 16 Mi (64 MiB per array). A
    /// comma-separated list runs once per size.
    #[arg(long, value_delimiter = ',', default_value = "16777216")]
    size: Vec<usize>,
    /// Compression scheme.
    #[arg(long, value_enum, default_value_t = Kind::TwoBit)]
    kind: Kind,
    /// Threshold (2-bit: must be > 0).
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    threshold: f32,
    /// Timed iterations.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed warm-up iterations.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Print one JSON object per case instead of a summary.
    #[arg(long)]
    json: bool,
    /// Also draw each operation's and baseline's GB/s against the size into this PNG file.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
}

#[derive(Serialize)]
struct Record<'a> {
    #[serde(rename = "impl")]
    implementation: &'a str,
    case: String,
    op: &'a str,
    kind: &'a str,
    threshold: f32,
    isa: &'a str,
    size: usize,
    iters: usize,
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
    gbps: f64,
    baseline: &'a str,
    baseline_median_ms: f64,
    baseline_min_ms: f64,
    baseline_gbps: f64,
    ratio: f64,
}

/// One measured operation and its baseline.
struct Case {
    op: &'static str,
    /// Bytes the operation moves.
    bytes: f64,
    baseline: &'static str,
    /// Bytes the baseline moves.
    baseline_bytes: f64,
    samples: Vec<f64>,
    baseline_samples: Vec<f64>,
}

/// The gradient: a fixed pattern in [−0.5, 0.5), so codes of every kind occur.
fn grad_value(i: usize) -> f32 {
    ((i * 7919) % 1000) as f32 / 1000.0 - 0.5
}

/// Reads `cold` (untimed): the cache then holds clean lines only, so the next timed
/// operation starts from the same state whatever ran before it.
fn settle(cold: &[u32]) {
    std::hint::black_box(cold.iter().fold(0u32, |a, &x| a ^ x));
}

/// What `f` returned, and the milliseconds it took.
fn time<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed().as_secs_f64() * 1e3)
}

pub(crate) fn run(args: &CompressionArgs) -> Result<()> {
    if args.size.contains(&0) || args.iters == 0 {
        bail!("--size and --iters must be at least 1");
    }
    if let Some(path) = &args.plot {
        plot::check_target(path)?;
    }
    let kind_name = match args.kind {
        Kind::TwoBit => CompressionType::TwoBit.name(),
        Kind::OneBit => CompressionType::OneBit.name(),
    };
    let mut chart = Chart::new(
        format!(
            "synkv bench compression: {kind_name}, threshold {}, {} path, median of {} iters",
            args.threshold,
            simd_level(),
            args.iters
        ),
        "elements (f32)",
        "GB/s (bytes the operation must move / median time)",
    );
    for &n in &args.size {
        run_size(args, n, &mut chart)?;
    }
    if let Some(path) = &args.plot {
        chart.write_png(path)?;
        eprintln!("chart written to {}", path.display());
    }
    Ok(())
}

/// Runs every case on a gradient of `n` elements, prints the results and adds them to `chart`.
fn run_size(args: &CompressionArgs, n: usize, chart: &mut Chart) -> Result<()> {
    let kind = match args.kind {
        Kind::TwoBit => CompressionType::TwoBit,
        Kind::OneBit => CompressionType::OneBit,
    };
    let gc = GradientCompression::new(kind, args.threshold)?;
    let words = gc.compressed_len(n);
    let packed_bytes = (4 * words) as f64;
    let nf = n as f64;

    let grad: Vec<f32> = (0..n).map(grad_value).collect();
    let mut residual = vec![0.0f32; n];
    let mut packed = vec![0u32; words];
    let mut out = vec![0.0f32; n];
    let mut acc = vec![0.0f32; n];
    let mut base = vec![0.0f32; n];
    // touch every page before timing
    kernels::fill(&mut out, 1.0);
    kernels::fill(&mut acc, 0.0);
    kernels::fill(&mut base, 0.25);

    let mut cases = [
        Case {
            op: "quantize",
            bytes: 12.0 * nf + packed_bytes,
            baseline: "kernels::add_into",
            baseline_bytes: 12.0 * nf,
            samples: vec![],
            baseline_samples: vec![],
        },
        Case {
            op: "dequantize",
            bytes: 4.0 * nf + packed_bytes,
            baseline: "kernels::fill",
            baseline_bytes: 4.0 * nf,
            samples: vec![],
            baseline_samples: vec![],
        },
        Case {
            op: "dequantize_add",
            bytes: 8.0 * nf + packed_bytes,
            baseline: "kernels::scale",
            baseline_bytes: 8.0 * nf,
            samples: vec![],
            baseline_samples: vec![],
        },
    ];

    // Read before every timed operation, so that none pays for writing back the dirty lines
    // another left in the cache: at least 64 MiB, more than a last-level cache.
    let cold = vec![1u32; n.max(16 << 20)];
    let progress = crate::progress::bar((args.warmup + args.iters) as u64, &format!("compression size={}", plot::elements(n)));
    for i in 0..args.warmup + args.iters {
        progress.inc(1);
        settle(&cold);
        let ((), t_base_add) = time(|| kernels::add_into(&mut base, &grad));
        settle(&cold);
        let (r, t_quantize) = time(|| gc.quantize(&grad, &mut residual, &mut packed));
        r?;
        settle(&cold);
        // not 0.0: some memory systems write all-zero lines faster (measured here: 2×), which
        // would overstate the bandwidth
        let ((), t_base_fill) = time(|| kernels::fill(&mut base, 0.25));
        settle(&cold);
        let (r, t_dequantize) = time(|| gc.dequantize(&packed, n, &mut out));
        r?;
        settle(&cold);
        let ((), t_base_scale) = time(|| kernels::scale(&mut base, 1.0));
        // acc is reset now and then so it stays small (its values do not change the speed)
        if i % 16 == 0 {
            kernels::fill(&mut acc, 0.0);
        }
        settle(&cold);
        let (r, t_dequantize_add) = time(|| gc.dequantize_add(&packed, n, &mut acc));
        r?;
        if i >= args.warmup {
            let times = [(t_quantize, t_base_add), (t_dequantize, t_base_fill), (t_dequantize_add, t_base_scale)];
            for (case, (t, b)) in cases.iter_mut().zip(times) {
                case.samples.push(t);
                case.baseline_samples.push(b);
            }
        }
    }
    progress.finish_and_clear();
    verify(&gc, &grad, &residual, &out, args.warmup + args.iters)?;

    let isa = simd_level();
    for case in &cases {
        let stats = Stats::of(&case.samples);
        let base_stats = Stats::of(&case.baseline_samples);
        let gbps = case.bytes / (stats.median_ms / 1e3) / 1e9;
        let baseline_gbps = case.baseline_bytes / (base_stats.median_ms / 1e3) / 1e9;
        let ratio = gbps / baseline_gbps;
        chart.add(case.op, Point::new(n as f64, gbps));
        chart.add(&format!("{} (baseline of {})", case.baseline, case.op), Point::new(n as f64, baseline_gbps));
        let case_name = format!("compression {} {} size={n}", case.op, kind.name());
        if args.json {
            let rec = Record {
                implementation: "synkv",
                case: case_name,
                op: case.op,
                kind: kind.name(),
                threshold: gc.threshold(),
                isa,
                size: n,
                iters: args.iters,
                median_ms: stats.median_ms,
                min_ms: stats.min_ms,
                max_ms: stats.max_ms,
                gbps,
                baseline: case.baseline,
                baseline_median_ms: base_stats.median_ms,
                baseline_min_ms: base_stats.min_ms,
                baseline_gbps,
                ratio,
            };
            println!("{}", serde_json::to_string(&rec)?);
        } else {
            println!(
                "{case_name} ({isa}, {} iters): median {:.3} ms (min {:.3}, max {:.3}), {:.1} GB/s; {} {:.3} ms, {:.1} GB/s; ratio {:.0} %",
                args.iters,
                stats.median_ms,
                stats.min_ms,
                stats.max_ms,
                gbps,
                case.baseline,
                base_stats.median_ms,
                baseline_gbps,
                100.0 * ratio
            );
        }
    }
    Ok(())
}

/// Replays the spec's formula (K7.4 / K7.7) for a few probe elements over every push and
/// compares the final residual and the last dequantized value with the kernels' output.
fn verify(gc: &GradientCompression, grad: &[f32], residual: &[f32], out: &[f32], pushes: usize) -> Result<()> {
    let n = grad.len();
    let t = gc.threshold();
    // one push of `g` onto residual `r`: the new residual and the dequantized value
    let step = |r: f32, g: f32| -> Result<(f32, f32)> {
        let r = r + g;
        Ok(match gc.kind() {
            CompressionType::TwoBit if r >= t => (r - t, t),
            CompressionType::TwoBit if r <= -t => (r + t, -t),
            CompressionType::TwoBit => (r, 0.0),
            CompressionType::OneBit if r > t => (r - 1.0, 1.0),
            CompressionType::OneBit => (r + 1.0, -1.0),
            other => bail!("no reference formula for {other}"),
        })
    };
    for i in [0, 1, 15, 16, 31, n / 2, n - 1] {
        let i = i.min(n - 1);
        let (mut r, mut last) = (0.0f32, 0.0f32);
        for _ in 0..pushes {
            (r, last) = step(r, grad[i])?;
        }
        ensure!(residual[i] == r, "wrong residual at element {i}: {} but the formula gives {r}", residual[i]);
        ensure!(out[i] == last, "wrong dequantized value at element {i}: {} but the formula gives {last}", out[i]);
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
        args: CompressionArgs,
    }

    #[test]
    fn every_operation_and_baseline_is_a_series_with_a_point_per_size() {
        crate::progress::disable(); // no bar on a developer's terminal while tests run
        let cli = Cli::try_parse_from(["bench", "--size", "4096,8192", "--iters", "1", "--warmup", "0"]).unwrap();
        assert_eq!(cli.args.size, [4096, 8192]);
        let mut chart = Chart::new("t", "x", "y");
        for &n in &cli.args.size {
            run_size(&cli.args, n, &mut chart).unwrap();
        }
        let names: Vec<&str> = chart.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "quantize",
                "kernels::add_into (baseline of quantize)",
                "dequantize",
                "kernels::fill (baseline of dequantize)",
                "dequantize_add",
                "kernels::scale (baseline of dequantize_add)"
            ]
        );
        for s in &chart.series {
            let xs: Vec<f64> = s.points.iter().map(|p| p.x).collect();
            assert_eq!(xs, [4096.0, 8192.0], "{}", s.name);
            assert!(s.points.iter().all(|p| p.y > 0.0), "{}", s.name);
        }
    }
}
