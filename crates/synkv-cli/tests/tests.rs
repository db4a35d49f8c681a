//! Integration tests of the `synkv` binary: one test target, one module per area (ripgrep's
//! layout). Every multi-process test runs on 127.0.0.1 with ports from a bind to `:0` and is
//! bounded by a deadline (`util::JOB_BOUND`), and starts from a clean environment
//! (`util::command`): the caller's `SYNKV_*`, `DMLC_*`, `RUST_BACKTRACE`, ... never reach it.

mod util;

mod bench_plot;
mod chaos;
mod checkpoints;
mod demo_bench;
mod dist_values;
mod environment;
mod failures;
mod launch;
mod launch_ssh;
mod metrics;
mod orchestrated;
mod real_job;
mod replication;
mod restarts;
mod rogue;
mod security;
mod shm;
mod trace_files;
