//! `synkv bench dist`: per-worker push + pull time on a distributed store. Run it under
//! `synkv launch`, e.g. `synkv launch -n 2 -s 2 -- synkv bench dist --all --json`.
//!
//! Each iteration pushes `keys` f32 arrays of `size` elements (worker r pushes `r+1`) and pulls
//! them back, then waits for completion; all workers run the same iterations, so in sync mode
//! an iteration is one round on the servers. A barrier starts every case. GB/s counts the bytes
//! this worker moves (keys × size × 4 × 2, push + pull) over the median time. `--all` runs
//! the standard matrix — 1M, 16M, 100 × 10K elements, first with the default assign, then
//! with SGD (momentum 0.9) on the servers (an optimizer, once set, stays for the job).
//!
//! `--push-only` times pushes alone (each waited for), the part compression shrinks.
//! `--pushpull` makes each iteration one `pushpull` (the PyTorch front-end's operation): the
//! servers answer each part of a big key as its round completes, so the answer of one part
//! travels while the next parts are still pushed.
//!
//! `--report-rss` adds each server's peak resident memory (since it started; run one case per
//! job to measure that case) and the key's size to the records.
//!
//! `--compression 2bit|1bit` runs every case twice in the same job: first uncompressed, then
//! (after `set_gradient_compression`, on fresh keys) with compressed pushes, and prints the
//! ratio compressed / uncompressed per case. Pushes of `r+1` are above the threshold, so each
//! worker's quantized push is `t` (2-bit) or 1 (1-bit) everywhere, which `verify` checks.
//!
//! `--size` takes a list (one case per size); `--plot FILE.png` makes rank 0 draw its median
//! time against the elements per call (size × keys), one series per updater, key count and
//! compression.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use serde::Serialize;
use synkv::optimizer::{Optimizer, Sgd};
use synkv::{create, KVStore, NDArray};

use super::local::UpdaterKind;
use super::plot::{self, Chart, Point};
use super::stats::Stats;

const SGD_MOMENTUM: f64 = 0.9;
const SGD_LR: f64 = 0.1;

/// Arguments of `synkv bench dist`.
#[derive(Debug, Args)]
pub(crate) struct DistArgs {
    /// Elements per array; a comma-separated list runs one case per size.
    #[arg(long, value_delimiter = ',', default_value = "1048576")]
    size: Vec<usize>,
    /// Keys per call.
    #[arg(long, default_value_t = 1)]
    keys: usize,
    /// What the servers do with the summed pushes.
    #[arg(long, value_enum, default_value_t = UpdaterKind::Assign)]
    updater: UpdaterKind,
    /// Timed iterations.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed warm-up iterations.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Store type.
    #[arg(long, default_value = "dist_sync")]
    store: String,
    /// Run the standard matrix (1M, 16M, 100 × 10K; assign, then SGD) instead of one case.
    #[arg(long)]
    all: bool,
    /// Print one JSON object per case instead of a summary.
    #[arg(long)]
    json: bool,
    /// Also run every case with this gradient compression and report the ratio.
    #[arg(long, value_parser = ["2bit", "1bit"])]
    compression: Option<String>,
    /// The compression threshold.
    #[arg(long, default_value_t = 0.5)]
    threshold: f64,
    /// Time pushes only (each iteration pushes and waits for the servers' answers); one pull
    /// at the end checks the values.
    #[arg(long)]
    push_only: bool,
    /// Each iteration is one pushpull (push and pull in one request per part) instead of a
    /// push followed by a pull.
    #[arg(long, conflicts_with = "push_only")]
    pushpull: bool,
    /// Add each server's peak resident memory (MiB, since it started) and the key's size to
    /// every record (`server_peak_rss_mb`, `key_mb`).
    #[arg(long)]
    report_rss: bool,
    /// Also draw rank 0's median times against the elements per call into this PNG file.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
}

/// One measured case, for the chart.
#[derive(Debug, Clone, PartialEq)]
struct Measured {
    size: usize,
    keys: usize,
    updater: UpdaterKind,
    compression: Option<String>,
    stats: Stats,
}

#[derive(Serialize)]
struct Record<'a> {
    #[serde(rename = "impl")]
    implementation: &'a str,
    case: String,
    store: &'a str,
    rank: usize,
    size: usize,
    keys: usize,
    workers: usize,
    servers: usize,
    updater: &'a str,
    compression: &'a str,
    dtype: &'a str,
    iters: usize,
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
    gbps: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    server_peak_rss_mb: Option<Vec<Option<f64>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key_mb: Option<f64>,
}

pub(crate) fn run(args: &DistArgs) -> Result<()> {
    if args.keys == 0 || args.size.contains(&0) || args.iters == 0 {
        bail!("--size, --keys and --iters must be at least 1");
    }
    if let Some(path) = &args.plot {
        plot::check_target(path)?;
    }
    let kv = create(&args.store)?;
    let cases: Vec<(usize, usize, UpdaterKind)> = if args.all {
        let shapes = [(1 << 20, 1), (16 << 20, 1), (10_240, 100)];
        [UpdaterKind::Assign, UpdaterKind::Sgd].into_iter().flat_map(|u| shapes.into_iter().map(move |(s, k)| (s, k, u))).collect()
    } else {
        args.size.iter().map(|&s| (s, args.keys, args.updater)).collect()
    };
    // The optimizer and the compression cannot be turned off again: assign cases run before
    // SGD ones, and each updater's uncompressed cases before its compressed ones (so with
    // `--all --compression`, the SGD cases run compressed only).
    let mut optimizer_set = false;
    let mut compressing = false;
    let mut n = 0;
    let mut measured = Vec::new();
    for updater in [UpdaterKind::Assign, UpdaterKind::Sgd] {
        let mine: Vec<(usize, usize)> = cases.iter().filter(|c| c.2 == updater).map(|c| (c.0, c.1)).collect();
        if mine.is_empty() {
            continue;
        }
        if updater == UpdaterKind::Sgd && !optimizer_set {
            kv.set_optimizer(Optimizer::from(Sgd { momentum: SGD_MOMENTUM, ..Sgd::default() }).with_learning_rate(SGD_LR))?;
            optimizer_set = true;
        }
        let mut plain = Vec::new();
        if !compressing {
            for &(size, keys) in &mine {
                let stats = case(&kv, args, n, size, keys, updater, None)?;
                plain.push(stats.median_ms);
                measured.push(Measured { size, keys, updater, compression: None, stats });
                n += 1;
            }
        }
        if let Some(kind) = &args.compression {
            kv.set_gradient_compression([("type", kind.clone()), ("threshold", args.threshold.to_string())])?;
            compressing = true;
            for (i, &(size, keys)) in mine.iter().enumerate() {
                let stats = case(&kv, args, n, size, keys, updater, Some(kind))?;
                let t = stats.median_ms;
                measured.push(Measured { size, keys, updater, compression: Some(kind.clone()), stats });
                n += 1;
                if let Some(base) = plain.get(i) {
                    println!(
                        "ratio {kind}/uncompressed size={size} keys={keys} updater={} (rank {}): {:.3} ({t:.3} ms / {base:.3} ms)",
                        updater_name(updater),
                        kv.rank(),
                        t / base
                    );
                }
            }
        }
    }
    let (rank, workers, servers) = (kv.rank(), kv.num_workers(), kv.num_servers());
    kv.close()?;
    if let (Some(path), 0) = (&args.plot, rank) {
        chart(args, workers, servers, &measured).write_png(path)?;
        eprintln!("chart written to {}", path.display());
    }
    Ok(())
}

/// Rank 0's chart: median time (min–max whiskers) against size × keys, a series per updater,
/// key count and compression.
fn chart(args: &DistArgs, workers: usize, servers: usize, measured: &[Measured]) -> Chart {
    let what = if args.push_only { "push" } else { "push + pull" };
    let mut c = Chart::new(
        format!(
            "synkv bench dist ({}): {}, {}, {what}, f32, rank 0, median of {} iters",
            args.store,
            count(workers, "worker"),
            count(servers, "server"),
            args.iters
        ),
        "elements per call (size × keys, f32)",
        format!("{what} time per worker (ms)"),
    );
    for m in measured {
        let keys = if m.keys == 1 { "1 key".to_owned() } else { format!("{} keys", m.keys) };
        let mut name = format!("{}, {keys}", updater_name(m.updater));
        if let Some(kind) = &m.compression {
            name.push_str(&format!(", {kind}"));
        }
        c.add(&name, Point::spread((m.size * m.keys) as f64, m.stats.median_ms, m.stats.min_ms, m.stats.max_ms));
    }
    c
}

/// Runs one case; returns its timings (ms).
fn case(
    kv: &KVStore,
    args: &DistArgs,
    n: usize,
    size: usize,
    nkeys: usize,
    updater: UpdaterKind,
    compression: Option<&str>,
) -> Result<Stats> {
    let (rank, workers, servers) = (kv.rank(), kv.num_workers(), kv.num_servers());
    // Fresh keys per case (an int key space per case).
    let base = i32::try_from(n * 1000).unwrap_or(0);
    let keys: Vec<i32> = (0..i32::try_from(nkeys).unwrap_or(i32::MAX)).map(|k| base + k).collect();
    let init: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros([size])).collect();
    kv.init(&keys, &init)?;
    drop(init);
    let values: Vec<NDArray> = keys.iter().map(|_| NDArray::full([size], (rank + 1) as f64)).collect();
    let outs: Vec<NDArray> = keys.iter().map(|_| NDArray::zeros([size])).collect();
    kv.barrier()?;
    let progress = crate::progress::bar((args.warmup + args.iters) as u64, &format!("dist size={} keys={nkeys}", plot::elements(size)));
    let mut samples = Vec::with_capacity(args.iters);
    for i in 0..args.warmup + args.iters {
        let t = Instant::now();
        if args.pushpull {
            kv.pushpull(&keys, &values, &outs)?;
            for o in &outs {
                o.wait_to_read()?;
            }
        } else if args.push_only {
            kv.push(&keys, &values)?;
            kv.wait_all()?;
        } else {
            kv.push(&keys, &values)?;
            kv.pull(&keys, &outs)?;
            for o in &outs {
                o.wait_to_read()?;
            }
        }
        if i >= args.warmup {
            samples.push(t.elapsed().as_secs_f64() * 1e3);
        }
        progress.inc(1);
    }
    progress.finish_and_clear();
    if args.push_only {
        kv.pull(&keys, &outs)?;
        for o in &outs {
            o.wait_to_read()?;
        }
    }
    verify(args, &outs, workers, updater, compression)?;
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    let rss = if args.report_rss {
        kv.barrier()?;
        Some(kv.server_stats()?.iter().map(|s| s.peak_rss_bytes.map(mib)).collect::<Vec<_>>())
    } else {
        None
    };
    let stats = Stats::of(&samples);
    let bytes = (nkeys * size * 4 * if args.push_only { 1 } else { 2 }) as f64;
    let gbps = bytes / (stats.median_ms / 1e3) / 1e9;
    let compression_name = compression.unwrap_or("none");
    let what = if args.push_only {
        "push"
    } else if args.pushpull {
        "pushpull"
    } else {
        "push+pull"
    };
    let case = format!(
        "dist {what} size={size} keys={nkeys} workers={workers} servers={servers} updater={} compression={compression_name}",
        updater_name(updater)
    );
    if args.json {
        let rec = Record {
            implementation: "synkv",
            case,
            store: &args.store,
            rank,
            size,
            keys: nkeys,
            workers,
            servers,
            updater: updater_name(updater),
            compression: compression_name,
            dtype: "f32",
            iters: args.iters,
            median_ms: stats.median_ms,
            min_ms: stats.min_ms,
            max_ms: stats.max_ms,
            gbps,
            key_mb: rss.as_ref().map(|_| (size * 4) as f64 / f64::from(1u32 << 20)),
            server_peak_rss_mb: rss,
        };
        println!("{}", serde_json::to_string(&rec)?);
    } else {
        println!(
            "{case} (rank {rank}, {} iters): median {:.3} ms, min {:.3} ms, max {:.3} ms, {:.2} GB/s",
            args.iters, stats.median_ms, stats.min_ms, stats.max_ms, gbps
        );
        if let Some(rss) = &rss {
            let each: Vec<String> = rss.iter().map(|r| r.map_or_else(|| "n/a".to_owned(), |m| format!("{m:.1} MiB"))).collect();
            println!("server peak RSS (key of {:.1} MiB): {}", (size * 4) as f64 / f64::from(1u32 << 20), each.join(", "));
        }
    }
    Ok(stats)
}

/// `1 server`, `2 servers`.
fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

fn updater_name(u: UpdaterKind) -> &'static str {
    match u {
        UpdaterKind::Assign => "assign",
        UpdaterKind::Sgd => "sgd",
    }
}

/// Checks the pulled values so the timing is of real work.
fn verify(args: &DistArgs, outs: &[NDArray], workers: usize, updater: UpdaterKind, compression: Option<&str>) -> Result<()> {
    // Every pushed value (r+1 ≥ 1) is above the threshold: a 2-bit push is `t`, a 1-bit one 1.
    let grad = match compression {
        None => (workers * (workers + 1) / 2) as f64,
        Some("1bit") => workers as f64,
        Some(_) => workers as f64 * f64::from(args.threshold as f32),
    };
    let expected = match updater {
        UpdaterKind::Assign => grad,
        UpdaterKind::Sgd => {
            let (mut w, mut m) = (0.0f64, 0.0f64);
            for _ in 0..args.warmup + args.iters {
                m = SGD_MOMENTUM * m - SGD_LR * grad;
                w += m;
            }
            w
        }
    };
    for (k, out) in outs.iter().enumerate() {
        let v = out.to_vec::<f64>()?;
        let probe = [0, v.len() / 2, v.len() - 1];
        if let Some(&i) = probe.iter().find(|&&i| (v[i] - expected).abs() > 1e-3 * expected.abs().max(1.0)) {
            bail!("wrong result for key {k}: element {i} is {} but should be {expected}", v[i]);
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
        args: DistArgs,
    }

    #[test]
    fn each_updater_key_count_and_compression_is_a_series_over_size_times_keys() {
        let cli = Cli::try_parse_from(["bench", "--size", "1024,2048", "--iters", "4"]).unwrap();
        assert_eq!(cli.args.size, [1024, 2048]);
        let stats = Stats { median_ms: 2.0, min_ms: 1.0, max_ms: 3.0 };
        let m = |size, keys, updater, compression: Option<&str>| Measured {
            size,
            keys,
            updater,
            compression: compression.map(str::to_owned),
            stats,
        };
        let measured = [
            m(1 << 20, 1, UpdaterKind::Assign, None),
            m(16 << 20, 1, UpdaterKind::Assign, None),
            m(10_240, 100, UpdaterKind::Assign, None),
            m(1 << 20, 1, UpdaterKind::Sgd, Some("2bit")),
        ];
        let c = chart(&cli.args, 2, 1, &measured);
        let names: Vec<&str> = c.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["assign, 1 key", "assign, 100 keys", "sgd, 1 key, 2bit"]);
        assert_eq!(c.series[0].points.len(), 2);
        assert_eq!(c.series[1].points, [Point::spread(1_024_000.0, 2.0, 1.0, 3.0)]);
        assert!(c.title.contains("2 workers, 1 server,"), "{}", c.title);
    }
}
