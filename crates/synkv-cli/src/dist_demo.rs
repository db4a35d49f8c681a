//! `synkv demo --dist`: a whole distributed job on this host — 1 scheduler, 2 servers, 2
//! workers — training logistic regression on synthetic data with SGD on the servers.
//!
//! The demo process runs the job like `synkv launch` (same launcher code) with itself as the
//! worker program (`synkv demo --dist-worker`, hidden). Each worker generates its own shard of
//! a synthetic, nearly separable binary classification problem, computes the gradient of the
//! mean log-loss on each mini-batch, and `pushpull`s it; the servers sum the workers'
//! gradients and apply SGD with momentum (rescaled by 1/workers, so the step uses the average
//! gradient). Worker 0 reports progress as `@progress` lines, which the demo process draws as
//! a progress bar, plus the loss and accuracy of each epoch and the final test accuracy.

use crate::rng::SplitMix64;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use clap::Args;
use synkv::optimizer::{Optimizer, Sgd};
use synkv::{create, NDArray};

use crate::launch::{default_grace, run_job, JobSpec};

const FEATURES: usize = 32;
const SAMPLES_PER_WORKER: usize = 8000;
const TEST_SAMPLES: usize = 4000;
const BATCH: usize = 200;
const LEARNING_RATE: f64 = 0.03;
const MOMENTUM: f64 = 0.5;

/// Options of `synkv demo --dist`.
#[derive(Debug, Args)]
pub(crate) struct DistDemoArgs {
    /// Run the distributed demo: a scheduler, servers and workers on 127.0.0.1.
    #[arg(long)]
    pub(crate) dist: bool,
    /// Act as one worker of the distributed demo (started by `demo --dist`).
    #[arg(long, hide = true)]
    pub(crate) dist_worker: bool,
    /// Passes over each worker's data.
    #[arg(long, default_value_t = 8)]
    epochs: usize,
    /// Workers of the distributed demo.
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Servers of the distributed demo.
    #[arg(long, default_value_t = 2)]
    servers: u32,
}

/// Samples (features with a trailing 1 for the bias, label 0/1) of the shared true model.
fn dataset(seed: u64, n: usize) -> Vec<(Vec<f32>, f32)> {
    let mut truth = SplitMix64(42);
    let w: Vec<f64> = (0..FEATURES).map(|_| truth.normal()).collect();
    let mut rng = SplitMix64(seed);
    (0..n)
        .map(|_| {
            let mut x: Vec<f32> = (0..FEATURES).map(|_| rng.normal() as f32).collect();
            let logit: f64 = x.iter().zip(&w).map(|(a, b)| f64::from(*a) * b).sum::<f64>() + 0.5 + 1.5 * rng.normal();
            x.push(1.0);
            (x, if logit > 0.0 { 1.0 } else { 0.0 })
        })
        .collect()
}

fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

/// Mean log-loss and accuracy of weights `w` on `data`.
fn evaluate(w: &[f32], data: &[(Vec<f32>, f32)]) -> (f64, f64) {
    let (mut loss, mut right) = (0.0f64, 0usize);
    for (x, y) in data {
        let p = sigmoid(x.iter().zip(w).map(|(a, b)| a * b).sum());
        loss -= f64::from(if *y > 0.5 { p.max(1e-7).ln() } else { (1.0 - p).max(1e-7).ln() });
        right += usize::from((p > 0.5) == (*y > 0.5));
    }
    (loss / data.len() as f64, right as f64 / data.len() as f64)
}

/// One worker of the demo job.
pub(crate) fn worker(args: &DistDemoArgs) -> Result<()> {
    let kv = create("dist_sync").context("creating the dist_sync store (run this under `synkv demo --dist`)")?;
    let (rank, n) = (kv.rank(), kv.num_workers());
    let sgd =
        Optimizer::from(Sgd { momentum: MOMENTUM, ..Sgd::default() }).with_learning_rate(LEARNING_RATE).with_rescale_grad(1.0 / n as f64);
    kv.set_optimizer(sgd)?;
    let dim = FEATURES + 1;
    kv.init("weights", &NDArray::zeros([dim]))?;
    let data = dataset(1 + rank as u64, SAMPLES_PER_WORKER);
    let weights = NDArray::zeros([dim]);
    let mut w = vec![0.0f32; dim];
    let batches = data.len() / BATCH;
    for epoch in 1..=args.epochs {
        let mut epoch_loss = 0.0f64;
        for (b, batch) in data.chunks(BATCH).enumerate() {
            let mut grad = vec![0.0f32; dim];
            for (x, y) in batch {
                let p = sigmoid(x.iter().zip(&w).map(|(a, b)| a * b).sum());
                epoch_loss -= f64::from(if *y > 0.5 { p.max(1e-7).ln() } else { (1.0 - p).max(1e-7).ln() });
                for (g, xi) in grad.iter_mut().zip(x) {
                    *g += (p - y) * xi / batch.len() as f32;
                }
            }
            kv.pushpull("weights", &NDArray::from_vec([dim], grad)?, &weights)?;
            w = weights.to_vec::<f32>()?;
            if rank == 0 {
                println!("@progress {epoch} {} {} {} {:.4}", args.epochs, b + 1, batches, epoch_loss / ((b + 1) * BATCH) as f64);
            }
        }
        let (_, accuracy) = evaluate(&w, &data);
        if rank == 0 {
            let loss = epoch_loss / data.len() as f64;
            println!("epoch {epoch}/{}: mean loss {loss:.4}, train accuracy {:.1}%", args.epochs, 100.0 * accuracy);
        }
    }
    if rank == 0 {
        let (loss, accuracy) = evaluate(&w, &dataset(999, TEST_SAMPLES));
        println!(
            "final: test accuracy {:.1}% (test loss {loss:.4}) after {} epochs, {n} workers × {SAMPLES_PER_WORKER} samples, {} servers, SGD on the servers",
            100.0 * accuracy,
            args.epochs,
            kv.num_servers()
        );
    }
    kv.close()?;
    Ok(())
}

/// Draws worker 0's progress lines as a bar; passes its other lines and every error through.
fn sink(tty: bool) -> crate::launch::Sink {
    let bar_shown = Arc::new(Mutex::new(false));
    Arc::new(move |label: &str, from_stderr: bool, line: &[u8]| {
        let text = String::from_utf8_lossy(line);
        let mut shown = bar_shown.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out = std::io::stdout().lock();
        if let Some(rest) = text.strip_prefix("@progress ") {
            if !tty || label != "worker 0" {
                return;
            }
            let f: Vec<&str> = rest.split(' ').collect();
            if let [epoch, epochs, batch, batches, loss] = f.as_slice() {
                let (b, nb) = (batch.parse::<usize>().unwrap_or(0), batches.parse::<usize>().unwrap_or(1).max(1));
                let filled = 30 * b / nb;
                let bar = format!("{}{}", "#".repeat(filled), "-".repeat(30 - filled));
                let _ = write!(out, "\r  epoch {epoch}/{epochs} [{bar}] {:3}%  loss {loss}  ", 100 * b / nb);
                let _ = out.flush();
                *shown = true;
            }
            return;
        }
        if *shown {
            let _ = write!(out, "\r{:80}\r", "");
            *shown = false;
        }
        if from_stderr {
            let _ = writeln!(std::io::stderr().lock(), "[{label}] {text}");
        } else if label == "worker 0" {
            let _ = writeln!(out, "  {text}");
        }
    })
}

/// Runs the whole demo job and reports its outcome.
pub(crate) fn run(args: &DistDemoArgs) -> Result<()> {
    let exe = std::env::current_exe().context("locating the synkv executable")?;
    println!(
        "synkv demo --dist: 1 scheduler, {} servers and {} workers on 127.0.0.1 train logistic regression\n\
         ({FEATURES} features, {SAMPLES_PER_WORKER} synthetic samples per worker, batches of {BATCH});\n\
         each worker pushes its mini-batch gradient, the servers sum the workers' gradients and apply\n\
         SGD (learning rate {LEARNING_RATE}, momentum {MOMENTUM}), every worker pulls the new weights.\n",
        args.servers, args.workers
    );
    let spec = JobSpec {
        workers: args.workers,
        servers: args.servers,
        command: vec![
            exe.to_string_lossy().into_owned(),
            "demo".into(),
            "--dist-worker".into(),
            "--epochs".into(),
            args.epochs.to_string(),
        ],
        grace: default_grace(),
        env: Vec::new(),
        servers_may_die: false,
        max_restarts: 0,
        sink: sink(std::io::stdout().is_terminal()),
        notes: Arc::new(|note: &str| {
            if note.contains("status") || note.contains("could not") || note.contains("killing") || note.contains("interrupted") {
                crate::launch::launch_note(note);
            }
        }),
    };
    match run_job(&spec)? {
        0 => {
            println!("\nevery process exited cleanly (scheduler, servers, workers)");
            Ok(())
        }
        code => bail!("the demo job failed (status {code})"),
    }
}
