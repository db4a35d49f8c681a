//! The `synkv` command: parses arguments, runs one subcommand, returns an exit code.
//!
//! - `synkv demo` — the MXNet KVStore tutorial's steps on a `local` store; `synkv demo --dist`
//!   trains logistic regression on a scheduler, 2 servers and 2 workers on this host;
//! - `synkv bench local …` — push+pull timings of the in-process store (`--plot FILE.png`
//!   draws them); `synkv bench plot` draws recorded results;
//! - `synkv scheduler`, `synkv server` — run a cluster role from the `DMLC_*` environment;
//! - `synkv launch -n W -s S [--launcher ssh -H hostfile] -- CMD…` — start a whole job, on
//!   this host or over ssh;
//! - `synkv chaos` — kill random processes of a dist job, restart it from its checkpoints,
//!   check that every update counted exactly once;
//! - `synkv selftest dist <case>` (hidden) — worker programs for the multi-process tests.

mod bench;
mod chaos;
mod demo;
mod dist_demo;
mod launch;
mod progress;
mod rng;
mod roles;
mod selftest;

use clap::{Parser, Subcommand};

/// synkv: a parameter-synchronisation key-value store for deep-learning training.
#[derive(Debug, Parser)]
#[command(name = "synkv", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the KVStore tutorial's steps on a `local` store and print each result; with
    /// `--dist`, train a small model on a whole distributed job on this host.
    Demo(dist_demo::DistDemoArgs),
    /// Measure store operations.
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
        /// No progress bars (they are drawn only when stderr is a terminal anyway).
        #[arg(long, global = true)]
        no_progress: bool,
    },
    /// Run the scheduler of a distributed job (reads DMLC_* from the environment).
    Scheduler,
    /// Run a parameter server of a distributed job (reads DMLC_* from the environment).
    Server,
    /// Start a scheduler, servers and workers: `synkv launch -n 2 -s 2 [--launcher ssh -H hosts] -- CMD…`.
    Launch(launch::LaunchArgs),
    /// Kill random processes of a dist job and restart it from its checkpoints until it
    /// finishes; check that no update was lost or counted twice.
    Chaos(chaos::ChaosArgs),
    /// Worker programs for synkv's own multi-process tests.
    #[command(hide = true)]
    Selftest {
        #[command(subcommand)]
        which: selftest::SelftestCommand,
    },
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SYNKV_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) if args.dist_worker => dist_demo::worker(&args),
        Command::Demo(args) if args.dist => dist_demo::run(&args),
        Command::Demo(_) => demo::run(),
        Command::Bench { which, no_progress } => {
            if no_progress {
                progress::disable();
            }
            bench::run(which)
        }
        Command::Scheduler => roles::run(roles::RoleCommand::Scheduler),
        Command::Server => roles::run(roles::RoleCommand::Server),
        Command::Launch(args) => return launch::run(&args),
        Command::Chaos(args) => chaos::run(&args),
        Command::Selftest { which } => selftest::run(which),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("synkv: error: {}", describe(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined by `: `, leaving out a cause whose text the message so far
/// already ends with (synkv's errors include their cause's text, and also report it as
/// their `source`).
fn describe(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !out.is_empty() && out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let inner = anyhow::anyhow!("timed out");
        let e = inner.context("push failed: timed out").context("running the case");
        assert_eq!(super::describe(&e), "running the case: push failed: timed out");
    }
}
