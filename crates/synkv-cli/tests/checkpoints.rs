//! Checkpoints of a dist job on real processes (issue 11): a job killed with `kill -9` and
//! restarted from its checkpoint directory ends with the same weights, bit for bit, as one that
//! never stopped; periodic checkpoints every N rounds or N seconds; a damaged shard is refused.
//! The job is `synkv selftest dist ckpt-train` (SGD with momentum, a key split over two
//! servers; see `selftest/real_job.rs`).

use std::path::Path;
use std::time::{Duration, Instant};

use synkv::ps::checkpoint::{read_manifest, Manifest};

use crate::util::{finals, launch, Job, JOB_BOUND};

/// The weights of an uninterrupted job of `rounds` rounds.
fn uninterrupted(rounds: u32) -> Vec<String> {
    let f = launch(2, 2, &[], &["ckpt-train", "--repeat", &rounds.to_string()], &[]);
    assert!(f.status.success(), "{}", f.output);
    finals(&f.output, 2)
}

fn manifest(dir: &Path) -> Option<Manifest> {
    read_manifest(dir).expect("a readable manifest")
}

/// A job restarted from `dir` (it must resume, not start fresh) running to round `rounds`.
fn resume(dir: &Path, rounds: u32) -> (Vec<String>, String) {
    let env = [("SYNKV_CHECKPOINT_DIR", dir.to_str().expect("a UTF-8 path"))];
    let f = launch(2, 2, &[], &["ckpt-resume", "--repeat", &rounds.to_string()], &env);
    assert!(f.status.success(), "{}", f.output);
    (finals(&f.output, 2), f.output)
}

/// An explicit checkpoint after round 3 of 6; the job is then killed with `kill -9` (every
/// process, the servers first) and restarted from the directory: it resumes from round 3 and
/// ends with exactly the weights of a job that ran the 6 rounds without stopping.
#[test]
fn a_job_killed_after_a_checkpoint_resumes_and_ends_with_the_same_weights_bit_for_bit() {
    let want = uninterrupted(6);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path().to_str().expect("a UTF-8 path");
    // Slow rounds after the checkpoint, so that the kill lands in the middle of the job.
    let mut job = Job::start(2, 2, &["ckpt-train", "--repeat", "6", "--checkpoint-at", "3", "--dir", d, "--sleep-secs", "1"], &[]);
    let deadline = Instant::now() + JOB_BOUND;
    assert!(job.workers[0].wait_for_output("checkpoint 1 at round 3", deadline), "{}", job.workers[0].output());
    for p in job.servers.iter_mut().chain(job.workers.iter_mut()) {
        p.kill();
    }
    job.scheduler.kill();
    let m = manifest(dir.path()).expect("a manifest");
    assert_eq!((m.id, m.round, m.num_servers, m.num_workers), (1, 3, 2, 2), "{m:?}");
    let (got, output) = resume(dir.path(), 6);
    assert!(output.contains("starts after round 3"), "{output}");
    assert!(output.contains("resuming from checkpoint 1"), "every worker says it resumes:\n{output}");
    assert_eq!(got, want, "{output}");
}

/// `SYNKV_CHECKPOINT_INTERVAL=2`: a checkpoint every 2 rounds, each a new id, only the newest
/// kept. A server killed with `kill -9` after the checkpoint of round 4 ends the job (the
/// survivors detect it); restarted from the directory, the job ends with the weights of one
/// that never stopped, and goes on checkpointing from where it resumed.
#[test]
fn periodic_checkpoints_survive_a_killed_server_and_the_job_resumes_from_the_newest() {
    let want = uninterrupted(10);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path().to_str().expect("a UTF-8 path");
    let env = [("SYNKV_CHECKPOINT_DIR", d), ("SYNKV_CHECKPOINT_INTERVAL", "2")];
    let mut job = Job::start(2, 2, &["ckpt-train", "--repeat", "10", "--sleep-secs", "0.3"], &env);
    let deadline = Instant::now() + JOB_BOUND;
    while manifest(dir.path()).is_none_or(|m| m.round < 4) {
        assert!(Instant::now() < deadline, "no checkpoint of round 4:\n{}", job.workers[0].output());
        std::thread::sleep(Duration::from_millis(20));
    }
    job.servers[0].kill();
    // The survivors end by failure detection; every one exits with a failure.
    for p in job.workers.iter_mut().chain(job.servers[1..].iter_mut()).chain(std::iter::once(&mut job.scheduler)) {
        let status = p.wait_until(deadline);
        assert!(status.is_some_and(|s| !s.success()), "{status:?}: {}", p.output());
    }
    let m = manifest(dir.path()).expect("a manifest");
    assert!(m.round >= 4 && m.round.is_multiple_of(2) && m.id == m.round / 2, "{m:?}");
    let kept: Vec<_> = std::fs::read_dir(dir.path()).expect("the directory").filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
    assert_eq!(kept.len(), 2, "the manifest and the newest checkpoint only: {kept:?}");

    let env = [("SYNKV_CHECKPOINT_DIR", d), ("SYNKV_CHECKPOINT_INTERVAL", "2")];
    let f = launch(2, 2, &[], &["ckpt-resume", "--repeat", "10"], &env);
    assert!(f.status.success(), "{}", f.output);
    assert!(f.output.contains(&format!("starts after round {}", m.round)), "{}", f.output);
    assert_eq!(finals(&f.output, 2), want, "{}", f.output);
    let last = manifest(dir.path()).expect("a manifest");
    assert_eq!((last.round, last.id), (10, m.id + (10 - m.round) / 2), "{last:?}");
}

/// `SYNKV_CHECKPOINT_INTERVAL=1s`: rank 0 announces a checkpoint a few rounds ahead once a
/// second has passed, and every worker takes it at the same round.
#[test]
fn a_checkpoint_every_second_is_taken_at_one_round_by_every_worker() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path().to_str().expect("a UTF-8 path");
    let env = [("SYNKV_CHECKPOINT_DIR", d), ("SYNKV_CHECKPOINT_INTERVAL", "1s")];
    let f = launch(2, 2, &[], &["ckpt-train", "--repeat", "16", "--sleep-secs", "0.25"], &env);
    assert!(f.status.success(), "{}", f.output);
    // A second has passed by round 4 at the latest (4 × 0.25 s of sleep); the checkpoint is
    // announced 8 rounds ahead; the next one would come 4+ rounds after, past round 16.
    let m = manifest(dir.path()).expect("a checkpoint was taken");
    assert!((9..=16).contains(&m.round), "{m:?}:\n{}", f.output);
    let (got, output) = resume(dir.path(), 16);
    assert_eq!(got, finals(&f.output, 2), "{output}");
}

/// A shard with one byte flipped: the server refuses to start from it, naming the file and the
/// checksum, and the job fails instead of training on damaged weights.
#[test]
fn a_damaged_shard_is_refused_with_a_checksum_error() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path().to_str().expect("a UTF-8 path");
    let f = launch(2, 2, &[], &["ckpt-train", "--repeat", "2", "--checkpoint-at", "2", "--dir", d], &[]);
    assert!(f.status.success(), "{}", f.output);
    let m = manifest(dir.path()).expect("a manifest");
    let shard = dir.path().join(&m.dir).join(&m.shards[1].file);
    let mut bytes = std::fs::read(&shard).expect("the shard");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&shard, bytes).expect("write the shard back");

    let env = [("SYNKV_CHECKPOINT_DIR", d)];
    let f = launch(2, 2, &[], &["ckpt-resume", "--repeat", "4"], &env);
    assert!(!f.status.success(), "{}", f.output);
    assert!(f.output.contains("checksum mismatch"), "{}", f.output);
    assert!(f.output.contains(&m.shards[1].file), "the error names the file:\n{}", f.output);
    assert!(!f.output.contains(" final "), "no worker finished:\n{}", f.output);
}
