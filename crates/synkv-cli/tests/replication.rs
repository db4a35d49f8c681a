//! Hot replication on real processes (issue 11, `SYNKV_SERVER_REPLICAS=1`): a server killed
//! with `kill -9` in the middle of a job is replaced by the backup copies of its partitions,
//! the workers re-send what was in flight, and the job ends with exactly the weights of a job
//! that lost no server. The job is `synkv selftest dist ckpt-train` (SGD with momentum on the
//! servers, a small key and a key split over every server).

use std::time::Instant;

use crate::util::{command, finals, launch, Job, JOB_BOUND};

const REPLICAS: (&str, &str) = ("SYNKV_SERVER_REPLICAS", "1");

/// The weights in one worker's own output.
fn final_of(output: &str) -> String {
    let line = output.lines().find(|l| l.contains(" final ")).unwrap_or_else(|| panic!("no final weights:\n{output}"));
    line.split(" final ").nth(1).unwrap_or_default().to_owned()
}

/// Runs `ckpt-train` on 3 servers with replicas and kills server `victim` once a worker has
/// pushed round `after`; every other process must end successfully with the weights of an
/// undisturbed job (`mode`: extra selftest arguments).
fn survive_a_killed_server(victim: usize, after: u32, extra: &[&str]) {
    let mut args = vec!["ckpt-train", "--repeat", "12"];
    args.extend_from_slice(extra);
    let want = {
        let f = launch(2, 3, &[], &args, &[]);
        assert!(f.status.success(), "{}", f.output);
        finals(&f.output, 2)
    };
    let mut slow = args.clone();
    slow.extend_from_slice(&["--sleep-secs", "0.25"]);
    let mut job = Job::start(3, 2, &slow, &[REPLICAS]);
    let deadline = Instant::now() + JOB_BOUND;
    let pushed = format!("round {after} pushed");
    assert!(job.workers[0].wait_for_output(&pushed, deadline), "{}", job.workers[0].output());
    job.servers[victim].kill();
    let mut output = String::new();
    let survivors = job.workers.iter_mut().chain(job.servers.iter_mut().enumerate().filter(|(i, _)| *i != victim).map(|(_, s)| s));
    for p in survivors.chain(std::iter::once(&mut job.scheduler)) {
        let status = p.wait_until(deadline);
        output.push_str(&p.output());
        assert!(status.is_some_and(|s| s.success()), "{status:?}:\n{}", p.output());
    }
    assert!(output.contains("moved to their backups"), "{output}");
    let got: Vec<String> = job.workers.iter().map(|w| final_of(&w.output())).collect();
    assert_eq!(got, want, "{output}");
}

/// The primary of one partition dies mid-job: its backup takes over and nothing is lost or
/// applied twice.
#[test]
fn a_killed_server_fails_over_to_its_backup_and_the_weights_are_exact() {
    survive_a_killed_server(1, 4, &[]);
}

/// The same with server rank 0 (the one that also holds the small key's partition).
#[test]
fn killing_server_zero_fails_over_too() {
    survive_a_killed_server(0, 3, &[]);
}

/// 2-bit compressed pushes (the server dequantizes; the backup gets the round's sum) fail
/// over exactly too.
#[test]
fn a_killed_server_fails_over_with_compressed_pushes() {
    survive_a_killed_server(2, 5, &["--compression", "2bit"]);
}

/// A row_sparse key (rows pushed each round, pulled with row_sparse_pull) fails over exactly.
#[test]
fn a_killed_server_fails_over_with_a_row_sparse_key() {
    survive_a_killed_server(1, 6, &["--sparse"]);
}

/// A checkpoint taken after a failover has every partition's shard (written by whichever
/// server holds it now); a job restarted from it ends with the weights of one that never
/// stopped.
#[test]
fn a_checkpoint_after_a_failover_is_whole_and_resumes_bit_for_bit() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path().to_str().expect("a UTF-8 path");
    let want = {
        let f = launch(2, 3, &[], &["ckpt-train", "--repeat", "10"], &[]);
        assert!(f.status.success(), "{}", f.output);
        finals(&f.output, 2)
    };
    let args = ["ckpt-train", "--repeat", "7", "--checkpoint-at", "7", "--dir", d, "--sleep-secs", "0.25"];
    let mut job = Job::start(3, 2, &args, &[REPLICAS]);
    let deadline = Instant::now() + JOB_BOUND;
    assert!(job.workers[0].wait_for_output("round 3 pushed", deadline), "{}", job.workers[0].output());
    job.servers[2].kill();
    for p in job.workers.iter_mut().chain(job.servers[..2].iter_mut()).chain(std::iter::once(&mut job.scheduler)) {
        let status = p.wait_until(deadline);
        assert!(status.is_some_and(|s| s.success()), "{status:?}:\n{}", p.output());
    }
    assert!(job.workers[0].output().contains("checkpoint 1 at round 7"), "{}", job.workers[0].output());
    let env = [("SYNKV_CHECKPOINT_DIR", d)];
    let f = launch(2, 3, &[], &["ckpt-resume", "--repeat", "10"], &env);
    assert!(f.status.success(), "{}", f.output);
    assert!(f.output.contains("starts after round 7"), "{}", f.output);
    assert_eq!(finals(&f.output, 2), want, "{}", f.output);
}

/// `synkv launch --replicas 1`: the launcher passes the setting on, and a server killed
/// under it does not stop the job; the launcher exits 0 and says what happened.
#[test]
fn the_launcher_with_replicas_keeps_a_job_going_when_a_server_is_killed() {
    let exe = crate::util::synkv();
    let mut cmd = command(&exe);
    cmd.args(["launch", "-n", "2", "-s", "3", "--replicas", "1", "--"]);
    cmd.arg(&exe).args(["selftest", "dist", "ckpt-train", "--repeat", "10", "--sleep-secs", "0.25"]);
    cmd.envs(crate::util::FAST).env("SYNKV_LOG", "warn");
    let mut launcher = crate::util::Proc::start("launch", cmd);
    let deadline = Instant::now() + JOB_BOUND;
    assert!(launcher.wait_for_output("round 3 pushed", deadline), "{}", launcher.output());
    let out = launcher.output();
    let pid: i32 = out
        .lines()
        .find_map(|l| l.split("started server 1 (pid ").nth(1))
        .and_then(|r| r.trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("no pid of server 1:\n{out}"));
    let killed = command("kill").args(["-9", &pid.to_string()]).status().expect("kill");
    assert!(killed.success());
    let status = launcher.wait_until(deadline);
    let out = launcher.output();
    assert!(status.is_some_and(|s| s.success()), "{status:?}:\n{out}");
    assert!(out.contains("server 1 died; with replicas"), "{out}");
    assert_eq!(out.lines().filter(|l| l.contains(" final ")).count(), 2, "{out}");
}

/// Two servers killed at once: the second held a partition whose backup was the first (or
/// was still being copied), so the job cannot go on. It must end — every survivor exits with
/// a failure, by failure detection — and say why, never hang.
#[test]
fn two_servers_killed_at_once_end_the_job_cleanly() {
    let args = ["ckpt-train", "--repeat", "40", "--sleep-secs", "0.25"];
    let mut job = Job::start(3, 2, &args, &[REPLICAS]);
    let deadline = Instant::now() + JOB_BOUND;
    assert!(job.workers[0].wait_for_output("round 2 pushed", deadline), "{}", job.workers[0].output());
    job.servers[1].kill();
    job.servers[2].kill();
    let mut output = String::new();
    for p in job.workers.iter_mut().chain(std::iter::once(&mut job.servers[0])).chain(std::iter::once(&mut job.scheduler)) {
        let status = p.wait_until(deadline);
        output.push_str(&p.output());
        assert!(status.is_some_and(|s| !s.success()), "{status:?}: {}", p.output());
    }
    assert!(output.contains("no complete backup"), "the scheduler says why:\n{output}");
}

/// Replication with no failure costs nothing in values: the weights equal a job without
/// replicas.
#[test]
fn replicas_without_failures_give_the_same_weights() {
    let args = ["ckpt-train", "--repeat", "6"];
    let plain = launch(2, 3, &[], &args, &[]);
    let replicated = launch(2, 3, &[], &args, &[REPLICAS]);
    assert!(plain.status.success() && replicated.status.success(), "{}\n{}", plain.output, replicated.output);
    assert_eq!(finals(&plain.output, 2), finals(&replicated.output, 2), "{}", replicated.output);
}

/// With one server, replicas are refused with a message that says what to do.
#[test]
fn replicas_need_two_servers() {
    let f = launch(1, 1, &[], &["ckpt-train", "--repeat", "1"], &[REPLICAS]);
    assert!(!f.status.success(), "{}", f.output);
    assert!(f.output.contains("SYNKV_SERVER_REPLICAS") && f.output.contains("at least 2 servers"), "{}", f.output);
}
