//! `synkv bench …`: timings of store operations, printed as a summary or as JSON lines.
//!
//! Every case is timed to completion (the engine is asynchronous, so each iteration ends with
//! `wait_all`), and checked for the right result after the timed iterations so the numbers
//! are of real work.
//!
//! `--size` (`--rows` for sparse) takes a comma-separated list, one case per value, and
//! `--plot FILE.png` draws the measured numbers ([`plot`]); `synkv bench plot` draws recorded
//! JSON lines, synkv's and its peers' ([`plot_results`]). The iterations of a case show a
//! progress bar on a terminal (see `crate::progress`).

mod compression;
mod dist;
mod floor;
mod local;
mod plot;
mod plot_results;
mod sparse;
mod stats;

use anyhow::Result;
use clap::Subcommand;

/// The bench subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// push(list of keys × per-device values) + pull(list) on an in-process store.
    Local(local::LocalArgs),
    /// An embedding table as a row_sparse key: push 1 % of the rows per device, pull 1 %.
    Sparse(sparse::SparseArgs),
    /// push + pull on a distributed store, per worker (run under `synkv launch`).
    Dist(dist::DistArgs),
    /// The loopback floor of a push + pull through a server process: a bare TCP echo, with or
    /// without the frame MAC of a sealed connection.
    Floor(floor::FloorArgs),
    /// 2-bit / 1-bit quantize and dequantize kernels against the memory bandwidth.
    Compression(compression::CompressionArgs),
    /// Draw a chart from recorded JSON lines (`--json` output, benches/compare results).
    Plot(plot_results::PlotArgs),
}

pub(crate) fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Local(args) => local::run(&args),
        BenchCommand::Sparse(args) => sparse::run(&args),
        BenchCommand::Dist(args) => dist::run(&args),
        BenchCommand::Floor(args) => floor::run(&args),
        BenchCommand::Compression(args) => compression::run(&args),
        BenchCommand::Plot(args) => plot_results::run(&args),
    }
}
