//! Worker restarts (issue 11, item 4): `synkv launch --max-restarts N` restarts a worker that
//! dies with the same rank; the new process rejoins the running servers, continues its
//! predecessor's round-id count and trains on, and every push is counted exactly once. The
//! job is `synkv selftest dist restart-train` (see `selftest/real_job.rs`): rank 1's first
//! process exits with status 137 right after round K, its successor pushes R rounds more.

use crate::util::launch;

/// The value the restarted worker (rank 1) pulls last: `1 + 2R + K` when every push of the
/// 2 workers counted once.
fn restarted_final(output: &str) -> String {
    let line = output
        .lines()
        .find(|l| l.starts_with("[worker 1] ") && l.contains(" final "))
        .unwrap_or_else(|| panic!("no final of rank 1:\n{output}"));
    line.split(" final ").nth(1).unwrap_or_default().to_owned()
}

fn restart_job(store: &str, servers: u32, extra: &[&str]) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path().to_str().expect("a UTF-8 path");
    let (r, k) = (8, 3);
    let args = ["restart-train", "--store", store, "--repeat", "8", "--die-at", "3", "--dir", d, "--sleep-secs", "0.1"];
    let mut flags = vec!["--max-restarts", "1"];
    flags.extend_from_slice(extra);
    let f = launch(2, servers, &flags, &args, &[]);
    assert!(f.status.success(), "{}", f.output);
    assert!(f.output.contains("worker 1 died; restarting it with the same rank (restart 1 of 1)"), "{}", f.output);
    assert!(f.output.contains("rank 1 starts again (restarted)"), "{}", f.output);
    assert!(f.output.contains("rejoins the running job as worker rank 1"), "{}", f.output);
    let want = 1 + 2 * r + k;
    assert_eq!(restarted_final(&f.output), format!("small={want} big={want}"), "{}", f.output);
}

/// Sync: the rounds go on without the dead worker, its successor's pushes join the rounds in
/// progress; nothing lost, nothing counted twice, the key split over both servers included.
#[test]
fn a_sync_worker_killed_mid_job_is_restarted_and_every_push_counts_once() {
    restart_job("dist_sync", 2, &[]);
}

#[test]
fn an_async_worker_killed_mid_job_is_restarted_and_every_push_counts_once() {
    restart_job("dist_async", 2, &[]);
}

/// With replicas on as well (3 servers): the restarted worker's round ids come from the
/// primaries, the backups follow.
#[test]
fn a_restarted_worker_and_replicas_work_together() {
    restart_job("dist_sync", 3, &["--replicas", "1"]);
}

/// Without `--max-restarts` a dead worker still ends the job (with its exit status).
#[test]
fn without_restarts_a_dead_worker_ends_the_job() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path().to_str().expect("a UTF-8 path");
    let f = launch(2, 2, &[], &["restart-train", "--repeat", "8", "--die-at", "3", "--dir", d], &[]);
    assert!(!f.status.success(), "{}", f.output);
    assert!(!f.output.contains("restarting it"), "{}", f.output);
}

/// Restarts allowed but none comes (`SYNKV_WORKER_RESTARTS=1` without a launcher that
/// restarts): the others go on, then the scheduler ends the job once no process took the
/// rank within `SYNKV_TIMEOUT_MS`, naming it. No hang.
#[test]
fn a_dead_worker_that_never_comes_back_ends_the_job_after_the_timeout() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path().to_str().expect("a UTF-8 path");
    let env = [("SYNKV_WORKER_RESTARTS", "1"), ("SYNKV_TIMEOUT_MS", "3000")];
    let f = launch(2, 2, &[], &["restart-train", "--repeat", "200", "--die-at", "2", "--dir", d, "--sleep-secs", "0.05"], &env);
    assert!(!f.status.success(), "{}", f.output);
    assert!(f.output.contains("no restarted worker took rank 1"), "{}", f.output);
}
