//! Processes started by tests begin from a clean synkv environment (issue 14, item 7): every
//! variable that `synkv`, its launcher, the store library or a program they start reads is
//! removed from what the child inherits, so a test passes whatever the contributor's shell
//! holds (`RUST_BACKTRACE=1`, a leftover `DMLC_ROLE`, `SYNKV_SECRET`, a torchrun or Slurm
//! allocation, ...); each test then sets what it needs. `PATH`, `HOME`, `LD_LIBRARY_PATH`
//! and cargo's variables are kept.
//!
//! Shared by `synkv-cli`'s integration tests (`tests/util.rs`), and by `#[path]` with
//! `synkv-capi`'s (`tests/util/mod.rs`) and the core's (`crates/synkv/tests/common/mod.rs`,
//! which removes these variables from a test process that must be outside a job);
//! `crates/synkv-python/python/tests/envs.py` holds the same list for the Python tests. Keep
//! the two lists in step.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::process::Command;

/// Name prefixes of the variables a job reads: synkv's own, ps-lite's and MXNet's, and the
/// rank and size variables of the orchestrators synkv detects (torchrun, Slurm, Open MPI,
/// PMI / PMIx launchers such as MPICH and Intel MPI).
pub const JOB_VARIABLE_PREFIXES: &[&str] =
    &["SYNKV_", "DMLC_", "MXNET_", "PS_", "PET_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_"];

/// Whole names of the variables a job reads: a server's `PORT`, Rust's backtrace and log
/// switches (the ssh launcher forwards `RUST_LOG`, `RUST_BACKTRACE` and `OMP_NUM_THREADS`
/// onto command lines a test parses), colour switches (output is parsed), and torchrun's and
/// MPI's rank variables.
pub const JOB_VARIABLES: &[&str] = &[
    "PORT",
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
    "RUST_LOG",
    "OMP_NUM_THREADS",
    "NO_COLOR",
    "CLICOLOR",
    "CLICOLOR_FORCE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
];

/// Whether a child of a test must not inherit `name` (see the module docs).
pub fn is_job_variable(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else { return false };
    JOB_VARIABLES.contains(&name) || JOB_VARIABLE_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Removes from what `cmd` inherits every job variable of this process's environment. Call it
/// before setting the variables the test wants: a later `env` wins over the removal.
pub fn clean_env(cmd: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if is_job_variable(&name) {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// `Command::new(program)` starting from a clean environment ([`clean_env`]).
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    clean_env(&mut cmd);
    cmd
}

/// Panics unless every job variable of this process's environment is either removed from or
/// set explicitly on `cmd`: a command built with `Command::new` instead of [`command`] fails
/// here (in a shell that holds such a variable) instead of misbehaving later.
#[track_caller]
pub fn assert_clean(cmd: &Command) {
    let decided: Vec<&OsStr> = cmd.get_envs().map(|(k, _)| k).collect();
    let leaked: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| is_job_variable(k) && !decided.contains(&k.as_os_str()))
        .map(|k| k.to_string_lossy().into_owned())
        .collect();
    assert!(
        leaked.is_empty(),
        "{cmd:?} would inherit {leaked:?} from the caller's environment; build it with util::command (or util::synkv_command)"
    );
}
