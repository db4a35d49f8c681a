//! `synkv launch` (local launcher): environment, output prefixes, exit status. The ssh
//! launcher's tests are in `launch_ssh.rs`.

use crate::util::{command, run_bounded, synkv, synkv_command};

#[test]
fn a_clean_job_exits_zero_and_prefixes_every_line() {
    let f = crate::util::launch(2, 1, &[], &["init-rank0"], &[]);
    assert!(f.status.success(), "{}", f.output);
    for w in 0..2 {
        assert!(f.output.contains(&format!("[worker {w}] selftest init-rank0 ok (rank {w} of 2 workers, 1 servers)")), "{}", f.output);
    }
    assert!(f.output.contains("[launch] scheduler exited successfully"), "{}", f.output);
    assert!(f.output.contains("[launch] server 0 exited successfully"), "{}", f.output);
}

#[test]
fn workers_see_the_dmlc_variables() {
    let exe = synkv();
    let mut cmd = command(&exe);
    cmd.args(["launch", "-n", "2", "-s", "1", "--grace-secs", "1", "--", "sh", "-c"]);
    // Not a store user: the scheduler and server wait for a rendezvous that never comes, so
    // the job ends by the grace period once a worker fails.
    cmd.arg("echo role=$DMLC_ROLE task=$DMLC_TASK_ID workers=$DMLC_NUM_WORKER servers=$DMLC_NUM_SERVER uri=$DMLC_PS_ROOT_URI; exit 3");
    let f = run_bounded("launch", cmd, &[]);
    assert_eq!(f.status.code(), Some(3), "{}", f.output);
    assert!(f.output.contains("[worker 1] role=worker task=1 workers=2 servers=1 uri=127.0.0.1"), "{}", f.output);
    assert!(f.output.contains("killing scheduler"), "stragglers are killed after the grace period:\n{}", f.output);
}

#[test]
fn a_missing_worker_program_fails_the_job() {
    let mut cmd = synkv_command();
    cmd.args(["launch", "-n", "1", "-s", "1", "--", "/nonexistent/program"]);
    let f = run_bounded("launch", cmd, &[]);
    assert_eq!(f.status.code(), Some(127), "{}", f.output);
    assert!(f.output.contains("could not start worker 0"), "{}", f.output);
}

#[test]
fn a_job_runs_over_the_congestion_control_it_names_and_one_the_kernel_lacks_stops_it_at_start() {
    // reno is built into every Linux kernel; SYNKV_SHM=0 puts every byte on the TCP sockets.
    let ok = crate::util::launch(
        2,
        2,
        &[],
        &["partitions"],
        &[("SYNKV_TCP_CONGESTION", "reno"), ("SYNKV_SHM", "0"), ("SYNKV_PARTITION_BYTES", "65536")],
    );
    assert!(ok.status.success(), "{}", ok.output);

    let bad = crate::util::launch(1, 1, &[], &["init-rank0"], &[("SYNKV_TCP_CONGESTION", "no_such_cc")]);
    assert!(!bad.status.success(), "{}", bad.output);
    assert!(bad.output.contains("SYNKV_TCP_CONGESTION") && bad.output.contains("refuses \"no_such_cc\""), "{}", bad.output);
}

/// `--launcher hosted`: no scheduler or server process; the workers host them (rank 0 the
/// scheduler, ranks 0 and 1 a server) and T24's values are exact. `DMLC_*` variables in the
/// launcher's environment do not reach them (they would turn the orchestrator detection off),
/// and another launcher's rank variables do not move them.
#[test]
fn the_hosted_launcher_runs_workers_that_host_the_scheduler_and_the_servers() {
    let stray = [
        ("DMLC_PS_ROOT_URI", "10.255.255.1"),
        ("DMLC_ROLE", "server"),
        ("DMLC_NUM_SERVER", "9"),
        // Another launcher's place (torchrun's): SYNKV_RANK and its kin come first.
        ("RANK", "5"),
        ("WORLD_SIZE", "9"),
        ("MASTER_ADDR", "10.255.255.1"),
        ("MASTER_PORT", "1"),
    ];
    let f = crate::util::launch(3, 2, &["--launcher", "hosted"], &["t24"], &stray);
    assert!(f.status.success(), "{}", f.output);
    for w in 0..3 {
        assert!(f.output.contains(&format!("[worker {w}] selftest t24 ok (rank {w} of 3 workers, 2 servers)")), "{}", f.output);
    }
    assert!(f.output.contains("started worker 0 (hosts the scheduler and a server)"), "{}", f.output);
    assert!(f.output.contains("started worker 1 (hosts a server)"), "{}", f.output);
    assert!(!f.output.contains("[scheduler]") && !f.output.contains("[server "), "no role process:\n{}", f.output);
}

/// Each hosted worker sees its place in the torchrun-like variables, and a failing one stops
/// the job with its status: the others are killed after the grace period.
#[test]
fn the_hosted_launcher_places_each_worker_and_stops_the_job_on_a_failure() {
    let mut cmd = synkv_command();
    cmd.args(["launch", "--launcher", "hosted", "-n", "2", "--grace-secs", "1", "--", "sh", "-c"]);
    cmd.arg(
        "echo rank=$SYNKV_RANK of=$SYNKV_WORLD_SIZE local=$SYNKV_LOCAL_RANK/$SYNKV_LOCAL_WORLD_SIZE servers=$SYNKV_NUM_SERVERS \
         root=$SYNKV_ROOT_ADDR uri=${DMLC_PS_ROOT_URI-unset}; [ $SYNKV_RANK = 1 ] && exit 3; exec sleep 60",
    );
    let f = run_bounded("launch", cmd, &[("DMLC_PS_ROOT_URI", "127.0.0.1")]);
    assert_eq!(f.status.code(), Some(3), "{}", f.output);
    assert!(f.output.contains("[worker 1] rank=1 of=2 local=1/2 servers=2 root=127.0.0.1 uri=unset"), "{}", f.output);
    assert!(f.output.contains("[worker 0] rank=0 of=2 local=0/2 servers=2"), "{}", f.output);
    assert!(f.output.contains("killing worker 0"), "the other worker is killed after the grace period:\n{}", f.output);

    // --dry-run shows what each worker is given and what it does not inherit.
    let mut cmd = synkv_command();
    cmd.args(["launch", "--launcher", "hosted", "-n", "2", "-s", "1", "--dry-run", "--", "./train"]);
    let f = run_bounded("launch", cmd, &[("DMLC_ROLE", "worker")]);
    assert!(f.status.success(), "{}", f.output);
    let line = f.output.lines().find(|l| l.starts_with("[worker 1] ")).unwrap_or_else(|| panic!("no worker 1 line:\n{}", f.output));
    assert!(line.starts_with("[worker 1] env -u DMLC_ROLE "), "{line}");
    assert!(line.contains(" SYNKV_RANK=1 ") && line.contains(" SYNKV_NUM_SERVERS=1 ") && line.ends_with(" ./train"), "{line}");

    let mut cmd = synkv_command();
    cmd.args(["launch", "--launcher", "hosted", "-n", "2", "-s", "3", "--", "true"]);
    let f = run_bounded("launch", cmd, &[]);
    assert!(!f.status.success(), "{}", f.output);
    assert!(f.output.contains("-s must be in 1..=2"), "{}", f.output);
}
