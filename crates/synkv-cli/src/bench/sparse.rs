//! `synkv bench sparse`: an embedding table as a row_sparse key; each iteration pushes a
//! random 1 % of the rows from every device and `row_sparse_pull`s another 1 %.
//!
//! The point is the scaling: the cost must follow the rows touched, not the table size, so
//! run it for 1M and 10M rows and compare rows/s.
//!
//! `--rows` takes a list (`--rows 1000000,10000000`): one case per table, each on a fresh
//! store; `--plot FILE.png` draws the median time against the table's rows.

use crate::rng::SplitMix64;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use synkv::ndarray::Buffer;
use synkv::optimizer::{Optimizer, Sgd};
use synkv::{create, Context, DType, NDArray};

use super::plot::{self, Chart, Point};
use super::stats::Stats;

/// What a push does with the summed rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SparseUpdater {
    /// SGD with lazy updates (only the pushed rows change).
    Sgd,
    /// The key becomes the pushed rows (MXNet's default assign).
    Assign,
}

/// Arguments of `synkv bench sparse`.
#[derive(Debug, Args)]
pub(crate) struct SparseArgs {
    /// Rows of the embedding table; a comma-separated list runs one case per table size.
    #[arg(long, value_delimiter = ',', default_value = "1000000")]
    rows: Vec<usize>,
    /// Elements per row.
    #[arg(long, default_value_t = 64)]
    row_len: usize,
    /// Fraction of the rows pushed per device, and pulled, per iteration.
    #[arg(long, default_value_t = 0.01)]
    fraction: f64,
    /// Rows pushed per device, and pulled, per iteration (overrides --fraction).
    #[arg(long)]
    touched: Option<usize>,
    /// Devices pushing each iteration.
    #[arg(long, default_value_t = 2)]
    devices: usize,
    /// Updater applied on push.
    #[arg(long, value_enum, default_value_t = SparseUpdater::Sgd)]
    updater: SparseUpdater,
    /// Timed iterations.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed warm-up iterations.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Print one JSON object per case instead of a summary.
    #[arg(long)]
    json: bool,
    /// Also draw the median time against the table's rows into this PNG file.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<PathBuf>,
}

#[derive(Serialize)]
struct Record {
    #[serde(rename = "impl")]
    implementation: &'static str,
    case: String,
    rows: usize,
    row_len: usize,
    touched_rows: usize,
    devices: usize,
    updater: &'static str,
    iters: usize,
    median_ms: f64,
    min_ms: f64,
    max_ms: f64,
    rows_per_s: f64,
}

/// `n` distinct sorted row ids below `rows`.
fn row_ids(rng: &mut SplitMix64, n: usize, rows: usize) -> Vec<i64> {
    let mut ids: Vec<i64> = (0..n * 2).map(|_| (rng.next_u64() % rows as u64) as i64).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.truncate(n);
    ids
}

pub(crate) fn run(args: &SparseArgs) -> Result<()> {
    if args.rows.contains(&0) || args.row_len == 0 || args.devices == 0 || args.iters == 0 || !(args.fraction > 0.0 && args.fraction <= 1.0)
    {
        bail!("--rows, --row-len, --devices and --iters must be at least 1, and --fraction in (0, 1]");
    }
    if let Some(path) = &args.plot {
        plot::check_target(path)?;
    }
    let mut chart = Chart::new(
        format!(
            "synkv bench sparse: {} devices push, then row_sparse_pull, row_len={} f32, updater={}, median of {} iters",
            args.devices,
            args.row_len,
            updater_name(args.updater),
            args.iters
        ),
        "rows of the embedding table",
        "push + row_sparse_pull time (ms)",
    );
    for &rows in &args.rows {
        let stats = case(args, rows)?;
        let series = match args.touched {
            Some(t) => format!("{t} rows touched"),
            None => format!("{} % of the rows touched", args.fraction * 100.0),
        };
        chart.add(&series, Point::spread(rows as f64, stats.median_ms, stats.min_ms, stats.max_ms));
    }
    if let Some(path) = &args.plot {
        chart.write_png(path)?;
        eprintln!("chart written to {}", path.display());
    }
    Ok(())
}

fn updater_name(u: SparseUpdater) -> &'static str {
    match u {
        SparseUpdater::Sgd => "sgd",
        SparseUpdater::Assign => "assign",
    }
}

/// Runs the case of a table of `rows` rows on a fresh store, prints it and returns its
/// timings.
fn case(args: &SparseArgs, rows: usize) -> Result<Stats> {
    let touched = args.touched.unwrap_or((rows as f64 * args.fraction) as usize).clamp(1, rows);
    let kv = create("local")?;
    let shape = [rows, args.row_len];
    let all_rows: Vec<i64> = (0..rows as i64).collect();
    let table = NDArray::row_sparse(shape, all_rows, Buffer::zeros(DType::F32, rows * args.row_len), Context::cpu(0))?;
    kv.init(0, &table)?;
    drop(table);
    let updater = match args.updater {
        SparseUpdater::Sgd => {
            kv.set_optimizer(Optimizer::from(Sgd { lazy_update: true, ..Sgd::default() }).with_learning_rate(0.1))?;
            "sgd"
        }
        SparseUpdater::Assign => "assign",
    };

    // A few pre-made batches, cycled, so the timing excludes generating them.
    let mut rng = SplitMix64(0x9E37_79B9_7F4A_7C15);
    let batches: Vec<(Vec<NDArray>, NDArray)> = (0..4)
        .map(|_| -> Result<_> {
            let grads = (0..args.devices)
                .map(|d| {
                    let ids = row_ids(&mut rng, touched, rows);
                    let data = Buffer::filled(DType::F32, ids.len() * args.row_len, 1.0);
                    NDArray::row_sparse(shape, ids, data, Context::cpu(d))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let pull_ids: Vec<i64> = row_ids(&mut rng, touched, rows);
            let ids = NDArray::from_vec([pull_ids.len()], pull_ids)?;
            Ok((grads, ids))
        })
        .collect::<Result<_>>()?;
    let out = NDArray::row_sparse_zeros(shape, DType::F32, Context::cpu(0));

    let progress = crate::progress::bar((args.warmup + args.iters) as u64, &format!("sparse rows={}", plot::si(rows as f64)));
    let mut samples = Vec::with_capacity(args.iters);
    for i in 0..args.warmup + args.iters {
        progress.inc(1);
        let (grads, ids) = &batches[i % batches.len()];
        let t = Instant::now();
        kv.push(0, grads)?;
        kv.row_sparse_pull(0, &out, ids)?;
        out.wait_to_read()?;
        kv.wait_all()?;
        if i >= args.warmup {
            samples.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    progress.finish_and_clear();
    let got = out.indices()?.len();
    if got == 0 || got > touched {
        bail!("row_sparse_pull returned {got} rows, expected up to {touched}");
    }

    let stats = Stats::of(&samples);
    let rows_moved = (touched * (args.devices + 1)) as f64;
    let rows_per_s = rows_moved / (stats.median_ms / 1e3);
    let case = format!("sparse rows={} row_len={} touched={} devices={} updater={updater}", rows, args.row_len, touched, args.devices);
    if args.json {
        let rec = Record {
            implementation: "synkv",
            case,
            rows,
            row_len: args.row_len,
            touched_rows: touched,
            devices: args.devices,
            updater,
            iters: args.iters,
            median_ms: stats.median_ms,
            min_ms: stats.min_ms,
            max_ms: stats.max_ms,
            rows_per_s,
        };
        println!("{}", serde_json::to_string(&rec)?);
    } else {
        println!(
            "{case} ({} iters): median {:.3} ms, min {:.3} ms, max {:.3} ms, {:.2} M rows/s",
            args.iters,
            stats.median_ms,
            stats.min_ms,
            stats.max_ms,
            rows_per_s / 1e6
        );
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SparseArgs,
    }

    #[test]
    fn tables_are_a_list_and_a_small_run_draws_its_chart() {
        crate::progress::disable(); // no bar on a developer's terminal while tests run
        let cli =
            Cli::try_parse_from(["bench", "--rows", "1000,10000", "--row-len", "4", "--touched", "50", "--iters", "2", "--warmup", "0"])
                .unwrap();
        assert_eq!(cli.args.rows, [1000, 10000]);
        if !plot::tests::font_or_skip("tables_are_a_list_and_a_small_run_draws_its_chart") {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse.png");
        let mut cli = cli;
        cli.args.plot = Some(path.clone());
        run(&cli.args).unwrap();
        assert_eq!(plot::tests::png_size(&std::fs::read(&path).unwrap()), (plot::WIDTH, plot::HEIGHT));
    }
}
