//! The `synkv` command: parses arguments, runs one subcommand, returns an exit code.
//!
//! - `synkv demo` — the MXNet KVStore tutorial's steps on a `local` store;
//! - `synkv bench local …` — push+pull timings of the in-process store.

mod bench;
mod demo;

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
    /// Run the KVStore tutorial's steps on a `local` store and print each result.
    Demo,
    /// Measure store operations.
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
    },
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("SYNKV_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo => demo::run(),
        Command::Bench { which } => bench::run(which),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("synkv: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
