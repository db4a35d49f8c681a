//! Failures in a running 2-server × 3-worker job: `kill -9` a worker, a server, the scheduler
//! (separate tests). Every survivor must report the dead node by role, rank and address and
//! exit non-zero within the heartbeat timeout plus a margin; under `synkv launch` the launcher
//! exits non-zero. Nothing may hang: every wait here has a deadline.

use std::time::{Duration, Instant};

use crate::util::{command, synkv, Job, Proc, FAST, JOB_BOUND};

/// Heartbeat timeout (2 s, `util::FAST`) plus generous slack for a loaded 2-core machine.
const REPORT_BOUND: Duration = Duration::from_secs(20);

enum Victim {
    Worker(usize),
    Server(usize),
    Scheduler,
}

fn kill_one_and_check_survivors(victim: Victim, expect: &str) {
    let mut job = Job::start(2, 3, &["until-failure", "--max-secs", "80"], &[]);
    let ready = Instant::now() + Duration::from_secs(40);
    for w in &job.workers {
        assert!(w.wait_for_output("selftest until-failure: running", ready), "{} never started:\n{}", w.label, w.output());
    }
    let killed = match victim {
        Victim::Worker(i) => &mut job.workers[i],
        Victim::Server(i) => &mut job.servers[i],
        Victim::Scheduler => &mut job.scheduler,
    };
    let killed_label = killed.label.clone();
    killed.kill();
    let deadline = Instant::now() + REPORT_BOUND;
    for p in job.all_mut().filter(|p| p.label != killed_label) {
        let status = p.wait_until(deadline);
        let out = p.output();
        let status = status.unwrap_or_else(|| panic!("{} still running {REPORT_BOUND:?} after {killed_label} was killed:\n{out}", p.label));
        assert!(!status.success(), "{} exited 0 after {killed_label} was killed:\n{out}", p.label);
        assert!(out.contains(expect), "{} does not name the dead node ({expect:?}):\n{out}", p.label);
    }
}

#[test]
fn a_killed_worker_is_named_by_every_survivor() {
    kill_one_and_check_survivors(Victim::Worker(1), "lost worker rank 1 (id 11) on 127.0.0.1");
}

#[test]
fn a_killed_server_is_named_by_every_survivor() {
    kill_one_and_check_survivors(Victim::Server(0), "lost server rank 0 (id 8) at 127.0.0.1:");
}

#[test]
fn a_killed_scheduler_is_named_by_every_survivor() {
    kill_one_and_check_survivors(Victim::Scheduler, "lost scheduler at 127.0.0.1:");
}

/// Under the launcher: kill -9 one worker; the launcher exits non-zero (the killed worker's
/// 137) after the survivors reported the dead worker.
#[test]
fn under_the_launcher_a_killed_worker_ends_the_job_with_a_failure() {
    let exe = synkv();
    let mut cmd = command(&exe);
    cmd.args(["launch", "-n", "3", "-s", "2", "--grace-secs", "10", "--"]).arg(&exe);
    cmd.args(["selftest", "dist", "until-failure", "--max-secs", "80"]).envs(FAST).env("SYNKV_LOG", "warn");
    let mut launcher = Proc::start("launch", cmd);
    let ready = Instant::now() + Duration::from_secs(40);
    for w in 0..3 {
        let line = format!("[worker {w}] selftest until-failure: running");
        assert!(launcher.wait_for_output(&line, ready), "worker {w} never started:\n{}", launcher.output());
    }
    let out = launcher.output();
    let pid = out
        .lines()
        .find_map(|l| l.strip_prefix("[launch] started worker 1 (pid ").and_then(|r| r.strip_suffix(')')))
        .unwrap_or_else(|| panic!("no pid for worker 1:\n{out}"));
    let killed = command("kill").args(["-9", pid]).status().expect("kill");
    assert!(killed.success());
    let status = launcher.wait_until(Instant::now() + REPORT_BOUND).unwrap_or_else(|| panic!("the launcher hangs:\n{}", launcher.output()));
    let out = launcher.output();
    assert_eq!(status.code(), Some(137), "{out}");
    for survivor in ["[worker 0]", "[worker 2]", "[server 0]", "[server 1]", "[scheduler]"] {
        let named = out.lines().any(|l| l.starts_with(survivor) && l.contains("lost worker rank 1 (id 11)"));
        assert!(named, "{survivor} did not report the dead worker:\n{out}");
    }
    assert!(JOB_BOUND > REPORT_BOUND);
}
