//! Starting and supervising the processes of a job, whichever launcher planned them.
//!
//! A launcher turns a job into a list of [`Planned`] commands (the local launcher runs the
//! roles themselves, the ssh launcher runs `ssh host '…'` for the remote ones). [`run_plan`]
//! starts them in order, copies every output line to the job's [`Sink`] under the process's
//! label, waits for them and returns the job's exit status: the first non-zero status (a death
//! by signal within half a second of the first failure counts as the first: it is the likely
//! cause), after the others got the grace period to exit by themselves; 130 on Ctrl-C or
//! SIGTERM. It never waits forever: once the job is over without a failure — the scheduler
//! exited, or every worker did — the processes still running get the grace period too, then
//! are killed and named, and the status is 1 (they hung). It knows each process's [`Part`]
//! (scheduler, server, worker), not where it really runs: a killed `ssh` is all it can kill.
//!
//! With `--max-restarts N`, a worker that fails (non-zero status or a signal) while the job
//! runs is started again with the same command and environment (so the same rank), up to N
//! times in all; with `--replicas 1` a server's death is noted and left to the scheduler.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{JobSpec, Sink};

/// The part a process plays in the job (what tells the launcher the job is over).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Scheduler,
    Server,
    Worker,
}

/// One process to start.
pub(crate) struct Planned {
    /// Its prefix in the output: `scheduler`, `server 0`, `worker 1`.
    pub(crate) label: String,
    /// What it is.
    pub(crate) role: Part,
    /// Program, arguments and environment; stdio is set by [`run_plan`].
    pub(crate) cmd: Command,
    /// Bytes written to its standard input, which is then closed (`None`: stdin is
    /// `/dev/null`). The ssh launcher sends the shared secret this way, never on a command line.
    pub(crate) stdin: Option<Vec<u8>>,
    /// Where it runs, for the launcher's notes (` on node7 via ssh`); empty for this host.
    pub(crate) place: String,
}

/// One started process.
struct Proc {
    label: String,
    role: Part,
    /// Killed by the launcher (its death is not a failure of the job).
    killed: bool,
    child: Child,
    status: Option<ExitStatus>,
    pumps: Vec<JoinHandle<()>>,
    /// A worker's command and standard input, kept to restart it (`--max-restarts`).
    again: Option<(Command, Option<Vec<u8>>)>,
}

/// Starts every process of `plan` in order, supervises them and returns the job's exit status
/// (see the module docs). A process that cannot be started stops the job with status 127.
pub(crate) fn run_plan(plan: Vec<Planned>, spec: &JobSpec) -> u8 {
    let note = &spec.notes;
    let interrupted = Arc::new(AtomicBool::new(false));
    watch_signals(Arc::clone(&interrupted));
    let mut procs: Vec<Proc> = Vec::new();
    for Planned { label, role, mut cmd, stdin, place } in plan {
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
        match cmd.spawn() {
            Ok(mut child) => {
                note(&format!("started {label}{place} (pid {})", child.id()));
                feed(&mut child, stdin.as_deref(), &label, note);
                let mut proc = start(label, role, child, &spec.sink);
                if role == Part::Worker && spec.max_restarts > 0 {
                    proc.again = Some((cmd, stdin));
                }
                procs.push(proc);
            }
            Err(e) => {
                note(&format!("could not start {label}{place} ({:?}): {e}", cmd.get_program()));
                kill_all(&mut procs);
                finish(&mut procs);
                return 127;
            }
        }
    }
    let code = supervise(&mut procs, &interrupted, spec);
    finish(&mut procs);
    code
}

/// Writes `stdin` (if any) to the child's standard input and closes it.
fn feed(child: &mut Child, stdin: Option<&[u8]>, label: &str, note: &super::Notes) {
    if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A few bytes: they fit in the pipe's buffer, so this does not block. A process that
        // died already shows up in `supervise`.
        if let Err(e) = pipe.write_all(bytes) {
            note(&format!("could not write to the standard input of {label}: {e}"));
        }
    }
}

/// Starts a dead worker's command again (same rank: same environment). Whether it did.
fn restart(p: &mut Proc, sink: &Sink, note: &super::Notes) -> bool {
    let Some((mut cmd, stdin)) = p.again.take() else { return false };
    match cmd.spawn() {
        Ok(mut child) => {
            note(&format!("restarted {} (pid {})", p.label, child.id()));
            feed(&mut child, stdin.as_deref(), &p.label, note);
            let fresh = start(p.label.clone(), p.role, child, sink);
            let old = std::mem::replace(p, Proc { again: Some((cmd, stdin)), ..fresh });
            for pump in old.pumps {
                let _ = pump.join();
            }
            true
        }
        Err(e) => {
            note(&format!("could not restart {}: {e}", p.label));
            false
        }
    }
}

fn start(label: String, role: Part, mut child: Child, sink: &Sink) -> Proc {
    let mut pumps = Vec::new();
    if let Some(out) = child.stdout.take() {
        pumps.push(pump(out, label.clone(), false, Arc::clone(sink)));
    }
    if let Some(err) = child.stderr.take() {
        pumps.push(pump(err, label.clone(), true, Arc::clone(sink)));
    }
    Proc { label, role, killed: false, child, status: None, pumps, again: None }
}

/// Hands `src` line by line to `sink`.
fn pump(src: impl Read + Send + 'static, label: String, to_stderr: bool, sink: Sink) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(src);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                line.pop();
            }
            sink(&label, to_stderr, &line);
        }
    })
}

fn code_of(status: ExitStatus) -> u8 {
    if let Some(c) = status.code() {
        return u8::try_from(c.clamp(0, 255)).unwrap_or(1).max(u8::from(c != 0));
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return u8::try_from(128 + sig.clamp(0, 127)).unwrap_or(255);
        }
    }
    1
}

/// Failures this close together count as one event (see `supervise`).
const SAME_FAILURE: Duration = Duration::from_millis(500);

/// Waits for every child; returns the launcher's exit code.
fn supervise(procs: &mut [Proc], interrupted: &AtomicBool, spec: &JobSpec) -> u8 {
    let (grace, note) = (spec.grace, &spec.notes);
    let mut first_failure: Option<(u8, Instant)> = None;
    // Whether the failure chosen so far was a death by signal, and until when a death by
    // signal may still replace it.
    let mut chosen: Option<(bool, Instant)> = None;
    let mut killed = false;
    // When the job ended without a failure (scheduler or every worker gone), and whether
    // stragglers had to be killed after it.
    let mut over: Option<Instant> = None;
    let mut stuck = false;
    let mut restarts_left = spec.max_restarts;
    loop {
        if interrupted.load(Ordering::Acquire) {
            note("interrupted: stopping every process");
            kill_all(procs);
            return 130;
        }
        // Failures seen within a short window happened together; a death by signal (a crash,
        // a kill) is the likelier cause of the others, so it counts as the first. (A killed
        // process can take a moment to become reapable, while its peers already noticed its
        // closed connections and exited.)
        let mut failed_now: Option<(u8, bool)> = None;
        for p in procs.iter_mut().filter(|p| p.status.is_none()) {
            let Ok(Some(status)) = p.child.try_wait() else { continue };
            p.status = Some(status);
            let code = code_of(status);
            if code == 0 {
                note(&format!("{} exited successfully", p.label));
                continue;
            }
            note(&format!("{} exited with status {code}", p.label));
            if p.killed {
                continue; // our own kill, not a failure of the job
            }
            if p.role == Part::Worker && restarts_left > 0 && first_failure.is_none() && over.is_none() {
                let n = spec.max_restarts - restarts_left + 1;
                note(&format!("{} died; restarting it with the same rank (restart {n} of {})", p.label, spec.max_restarts));
                if restart(p, &spec.sink, note) {
                    restarts_left -= 1;
                    continue;
                }
            }
            if p.role == Part::Server && spec.servers_may_die {
                note(&format!(
                    "{} died; with replicas its partitions move to their backups and the job goes on (the scheduler ends it if it cannot)",
                    p.label
                ));
                continue;
            }
            let by_signal = status.code().is_none();
            let replace = match failed_now {
                None => true,
                Some((_, sig)) => by_signal && !sig,
            };
            if replace {
                failed_now = Some((code, by_signal));
            }
        }
        match (first_failure, failed_now, chosen) {
            (None, Some((code, by_signal)), _) => {
                note(&format!("stopping the job: the others get {grace:?} to finish, then they are killed"));
                first_failure = Some((code, Instant::now() + grace));
                chosen = Some((by_signal, Instant::now() + SAME_FAILURE));
            }
            (Some((_, deadline)), Some((code, true)), Some((false, until))) if Instant::now() <= until => {
                first_failure = Some((code, deadline));
                chosen = Some((true, until));
            }
            _ => {}
        }
        if procs.iter().all(|p| p.status.is_some()) {
            return first_failure.map_or(if stuck { 1 } else { 0 }, |(c, _)| c);
        }
        // The job is over when the scheduler has exited or every worker has: whoever is still
        // running must follow within the grace period (they are told, or lose the scheduler).
        if first_failure.is_none() && over.is_none() {
            let done = |role: Part| procs.iter().filter(|p| p.role == role).all(|p| p.status.is_some());
            let has = |role: Part| procs.iter().any(|p| p.role == role);
            let why = if has(Part::Scheduler) && done(Part::Scheduler) {
                Some("the scheduler exited")
            } else if has(Part::Worker) && done(Part::Worker) {
                Some("every worker exited")
            } else {
                None
            };
            if let Some(why) = why {
                let left: Vec<&str> = procs.iter().filter(|p| p.status.is_none()).map(|p| p.label.as_str()).collect();
                note(&format!("{why}: the job is over; {} get {grace:?} to exit", left.join(", ")));
                over = Some(Instant::now() + grace);
            }
        }
        if let (None, Some(deadline)) = (first_failure, over) {
            if !stuck && Instant::now() >= deadline {
                for p in procs.iter().filter(|p| p.status.is_none()) {
                    note(&format!("killing {} (still running {grace:?} after the job was over: it hangs)", p.label));
                }
                kill_all(procs);
                stuck = true;
            }
        }
        if let Some((_, deadline)) = first_failure {
            if !killed && Instant::now() >= deadline {
                for p in procs.iter().filter(|p| p.status.is_none()) {
                    note(&format!("killing {} (still running after the grace period)", p.label));
                }
                kill_all(procs);
                killed = true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill_all(procs: &mut [Proc]) {
    for p in procs.iter_mut().filter(|p| p.status.is_none()) {
        let _ = p.child.kill();
        p.killed = true;
    }
}

/// Reaps every child and waits for its output to be copied.
fn finish(procs: &mut [Proc]) {
    for p in procs.iter_mut() {
        if p.status.is_none() {
            p.status = p.child.wait().ok();
        }
        for h in p.pumps.drain(..) {
            let _ = h.join();
        }
    }
}

/// Sets `flag` on SIGINT or SIGTERM (a helper thread with a tiny runtime).
fn watch_signals(flag: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new().name("synkv-launch-signals".into()).spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        let stop = tokio_util::sync::CancellationToken::new();
        rt.block_on(crate::roles::cancel_on_signal(stop));
        flag.store(true, Ordering::Release);
    });
    if let Err(e) = spawned {
        super::launch_note(&format!("warning: cannot watch for Ctrl-C: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::launch::JobSpec;

    /// `sh -c script` as process `label`.
    fn sh(label: &str, role: Part, script: &str) -> Planned {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        Planned { label: label.into(), role, cmd, stdin: None, place: String::new() }
    }

    /// Runs `plan` with a 1 s grace period; returns the status, the launcher's notes and how
    /// long it took.
    fn run(plan: Vec<Planned>) -> (u8, Vec<String>, Duration) {
        run_with(plan, false)
    }

    /// [`run`], with servers allowed to die (replicas) or not.
    fn run_with(plan: Vec<Planned>, servers_may_die: bool) -> (u8, Vec<String>, Duration) {
        let notes = Arc::new(Mutex::new(Vec::new()));
        let sink_notes = Arc::clone(&notes);
        let spec = JobSpec {
            workers: 1,
            servers: 1,
            command: vec!["sh".into()],
            grace: Duration::from_secs(1),
            sink: Arc::new(|_: &str, _: bool, _: &[u8]| {}),
            notes: Arc::new(move |n: &str| sink_notes.lock().unwrap().push(n.to_owned())),
            env: Vec::new(),
            servers_may_die,
            max_restarts: 0,
        };
        let started = Instant::now();
        let code = run_plan(plan, &spec);
        let notes = notes.lock().unwrap().clone();
        (code, notes, started.elapsed())
    }

    #[test]
    fn a_clean_job_exits_zero_without_killing_anyone() {
        let (code, notes, _) = run(vec![
            sh("scheduler", Part::Scheduler, "sleep 0.3"),
            sh("server 0", Part::Server, "sleep 0.3"),
            sh("worker 0", Part::Worker, "sleep 0.1"),
        ]);
        assert_eq!(code, 0, "{notes:?}");
        assert!(!notes.iter().any(|n| n.contains("killing")), "{notes:?}");
    }

    /// `--launcher hosted`: only workers (they host the roles). No scheduler process is not a
    /// scheduler that exited: workers that run past the grace period are not killed.
    #[test]
    fn a_job_of_workers_only_runs_until_every_worker_exited() {
        let (code, notes, took) = run(vec![sh("worker 0", Part::Worker, "sleep 1.5"), sh("worker 1", Part::Worker, "sleep 1.5")]);
        assert_eq!(code, 0, "{notes:?}");
        assert!(!notes.iter().any(|n| n.contains("killing") || n.contains("the job is over")), "{notes:?}");
        assert!(took >= Duration::from_millis(1500), "{took:?}");
    }

    #[test]
    fn a_process_left_running_after_the_scheduler_exited_is_killed_and_named() {
        let (code, notes, took) = run(vec![
            sh("scheduler", Part::Scheduler, "exit 0"),
            sh("server 0", Part::Server, "exec sleep 60"),
            sh("worker 0", Part::Worker, "sleep 0.5"),
        ]);
        assert_eq!(code, 1, "{notes:?}");
        assert!(notes.iter().any(|n| n.contains("the scheduler exited: the job is over")), "{notes:?}");
        assert!(notes.iter().any(|n| n.starts_with("killing server 0")), "{notes:?}");
        assert!(took < Duration::from_secs(20), "{took:?}");
    }

    #[test]
    fn a_scheduler_and_server_left_running_after_every_worker_exited_are_killed_and_named() {
        let (code, notes, took) = run(vec![
            sh("scheduler", Part::Scheduler, "exec sleep 60"),
            sh("server 0", Part::Server, "exec sleep 60"),
            sh("worker 0", Part::Worker, "exit 0"),
        ]);
        assert_eq!(code, 1, "{notes:?}");
        assert!(notes.iter().any(|n| n.contains("every worker exited")), "{notes:?}");
        assert!(
            notes.iter().any(|n| n.starts_with("killing scheduler")) && notes.iter().any(|n| n.starts_with("killing server 0")),
            "{notes:?}"
        );
        assert!(took < Duration::from_secs(20), "{took:?}");
    }

    #[test]
    fn with_replicas_a_dead_server_does_not_stop_the_job_but_a_dead_scheduler_does() {
        let plan = || {
            vec![
                sh("scheduler", Part::Scheduler, "sleep 0.8"),
                sh("server 0", Part::Server, "kill -9 $$"),
                sh("server 1", Part::Server, "sleep 0.8"),
                sh("worker 0", Part::Worker, "sleep 0.8"),
            ]
        };
        let (code, notes, _) = run_with(plan(), true);
        assert_eq!(code, 0, "{notes:?}");
        assert!(notes.iter().any(|n| n.contains("server 0 died; with replicas")), "{notes:?}");
        assert!(!notes.iter().any(|n| n.contains("stopping the job")), "{notes:?}");
        let (code, notes, _) = run_with(plan(), false);
        assert_ne!(code, 0, "{notes:?}");
        let failing = vec![
            sh("scheduler", Part::Scheduler, "sleep 0.2; exit 1"),
            sh("server 0", Part::Server, "kill -9 $$"),
            sh("server 1", Part::Server, "exec sleep 60"),
            sh("worker 0", Part::Worker, "exec sleep 60"),
        ];
        let (code, notes, took) = run_with(failing, true);
        assert_eq!(code, 1, "{notes:?}");
        assert!(took < Duration::from_secs(20), "{took:?}");
    }

    #[test]
    fn a_failure_still_wins_over_the_end_of_the_job() {
        let (code, notes, _) = run(vec![
            sh("scheduler", Part::Scheduler, "exec sleep 60"),
            sh("server 0", Part::Server, "exec sleep 60"),
            sh("worker 0", Part::Worker, "exit 3"),
        ]);
        assert_eq!(code, 3, "{notes:?}");
    }
}
