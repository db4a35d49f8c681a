//! `synkv selftest dist <case>` (hidden): worker programs for the multi-process tests.
//!
//! Each case is what one worker of a job runs (under `synkv launch`, or started by a test with
//! the `DMLC_*` variables set). It creates a dist store, runs the scenario, checks every pulled
//! value against the numbers MXNet's nightly tests expect, prints `selftest <case> ok (rank r)`
//! and closes the store. A wrong value or an unexpected error is an error (exit status 1),
//! with a message that says which key, which element, what was expected.

mod cases;
mod chaos;
mod compression;
mod partitions;
mod pull_back;
mod real_job;
mod sparse;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use synkv::NDArray;

/// The selftest subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum SelftestCommand {
    /// A distributed scenario, run by every worker of a job.
    Dist(DistArgs),
}

/// Arguments of `synkv selftest dist`.
#[derive(Debug, Args)]
pub(crate) struct DistArgs {
    /// The scenario (see `cases.rs`).
    case: String,
    /// Store type to create.
    #[arg(long, default_value = "dist_sync")]
    store: String,
    /// Repetitions of the push/pull rounds.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Seconds a looping case runs before giving up.
    #[arg(long, default_value_t = 60.0)]
    max_secs: f64,
    /// Per-device values pushed per key (devices are reduced on the worker).
    #[arg(long, default_value_t = 1)]
    devices: usize,
    /// Seconds a case sleeps where it simulates a slow worker (finish-apart, straggler, hold).
    #[arg(long, default_value_t = 0.0)]
    sleep_secs: f64,
    /// Number of keys (many-keys).
    #[arg(long, default_value_t = 200_000)]
    keys: usize,
    /// Keys (of `--size` floats) push-hold also pushes in one call, once, after its rounds:
    /// a batch of rounds the server updates side by side.
    #[arg(long, default_value_t = 0)]
    batch_keys: usize,
    /// Floats of each of chaos's small keys: from 4096 (16 KiB) the rounds one push completes
    /// update side by side on the servers.
    #[arg(long, default_value_t = 4)]
    key_elems: usize,
    /// Elements of the key (big-states, hold).
    #[arg(long, default_value_t = 100_000)]
    size: usize,
    /// A file whose appearance ends the wait of `hold`.
    #[arg(long)]
    until_file: Option<std::path::PathBuf>,
    /// Take a checkpoint after this round (ckpt-train).
    #[arg(long)]
    checkpoint_at: Option<u64>,
    /// The checkpoint directory (ckpt-train).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Elements of the big key, split over the servers (ckpt-train; a multiple of 1000).
    #[arg(long, default_value_t = 1_200_000)]
    big_elems: usize,
    /// Rank 1 dies (exit 137) right after the pull of this round, once (restart-train; the
    /// marker file that says it died is in `--dir`).
    #[arg(long)]
    die_at: Option<u64>,
    /// Gradient compression of the pushes (ckpt-train): `2bit` or `1bit`.
    #[arg(long)]
    compression: Option<String>,
    /// Add a row_sparse key whose pushes touch a few rows each round (ckpt-train).
    #[arg(long)]
    sparse: bool,
    /// Seed of the random pauses (chaos).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Longest random pause before a round, in milliseconds (chaos).
    #[arg(long, default_value_t = 0)]
    max_delay_ms: u64,
}

pub(crate) fn run(cmd: SelftestCommand) -> Result<()> {
    match cmd {
        SelftestCommand::Dist(args) => cases::run(&args),
    }
}

/// Checks that every element of `out` is within `tol` (relative) of `want`.
pub(crate) fn expect_all(what: &str, out: &NDArray, want: f64, tol: f64) -> Result<()> {
    let v = out.to_vec::<f64>()?;
    if let Some((i, got)) = v.iter().enumerate().find(|(_, x)| (**x - want).abs() > tol * want.abs().max(1.0)) {
        bail!("{what}: element {i} is {got}, expected {want} (all {} elements)", v.len());
    }
    Ok(())
}
