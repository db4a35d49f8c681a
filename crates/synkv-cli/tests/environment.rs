//! The tests' own contract (issue 14, item 7): a process a test starts inherits none of the
//! variables a job reads, whatever the caller's shell holds, and keeps the rest.

use std::ffi::OsStr;

use crate::util::{command, is_job_variable, run_bounded};

#[test]
fn job_variables_are_told_apart_from_the_rest() {
    for name in [
        "SYNKV_SECRET",
        "SYNKV_LOG",
        "DMLC_ROLE",
        "DMLC_PS_ROOT_URI",
        "MXNET_KVSTORE_BIGARRAY_BOUND",
        "PS_VERBOSE",
        "PORT",
        "RUST_BACKTRACE",
        "RUST_LOG",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "PET_NPROC_PER_NODE",
        "SLURM_PROCID",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_RANK",
        "MPI_LOCALNRANKS",
    ] {
        assert!(is_job_variable(OsStr::new(name)), "{name}");
    }
    for name in ["PATH", "HOME", "LD_LIBRARY_PATH", "CARGO_TARGET_TMPDIR", "TMPDIR", "PS1", "RANKING", "SYNKV"] {
        assert!(!is_job_variable(OsStr::new(name)), "{name}");
    }
}

/// Run with job variables set (`RUST_BACKTRACE=1 DMLC_ROLE=server cargo test …`) this checks
/// the cleaning itself; in a clean shell it checks that what a test sets does arrive.
#[test]
fn a_child_sees_what_the_test_sets_and_no_job_variable_of_the_caller() {
    let mut cmd = command("env");
    cmd.arg("-0").env("DMLC_NUM_WORKER", "2");
    let f = run_bounded("env", cmd, &[]);
    assert!(f.status.success(), "{}", f.output);
    let names: Vec<&str> = f.output.split('\0').filter_map(|l| l.split_once('=').map(|(k, _)| k)).collect();
    assert!(names.contains(&"PATH"), "{}", f.output);
    let mut jobs: Vec<&str> = names.into_iter().filter(|n| is_job_variable(OsStr::new(n))).collect();
    jobs.sort_unstable();
    let want = ["DMLC_NUM_WORKER", "SYNKV_HEARTBEAT_INTERVAL_MS", "SYNKV_HEARTBEAT_TIMEOUT_MS", "SYNKV_LOG", "SYNKV_TIMEOUT_MS"];
    assert_eq!(jobs, want, "{}", f.output);
}
