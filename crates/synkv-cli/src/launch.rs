//! `synkv launch -n W -s S [--launcher local] -- CMD ARGS…`: start a whole job on this host.
//!
//! The local launcher picks a free port on 127.0.0.1 for the scheduler, then starts, in this
//! order, `synkv scheduler`, `S` × `synkv server` and `W` copies of `CMD ARGS…`, each with
//! MXNet's variables set (`DMLC_ROLE`, `DMLC_PS_ROOT_URI`, `DMLC_PS_ROOT_PORT`,
//! `DMLC_NUM_SERVER`, `DMLC_NUM_WORKER`, `DMLC_TASK_ID` = the index within its role,
//! `DMLC_JOB_CLUSTER=local`) on top of the launcher's own environment (so `SYNKV_*` settings
//! reach every process). With complete task ids the scheduler ranks each role by task id,
//! so worker `i` has rank `i`.
//!
//! Every output line of a child is printed with a prefix — `[scheduler]`, `[server 0]`,
//! `[worker 1]` — on the launcher's stdout or stderr, as the child wrote it. The launcher's own
//! lines start with `[launch]` (on stderr), including each child's pid.
//!
//! Exit status: 0 when every process exits 0. When one exits non-zero (or is killed by a
//! signal: 128 + signal), the others get a grace period to notice — they report the lost node
//! themselves — then the remaining ones are killed, and the launcher exits with that first
//! non-zero status. Ctrl-C or SIGTERM kills every child and exits with 130. The `ssh`
//! launcher is not supported yet.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};

/// How processes are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LauncherKind {
    /// Every process on this host.
    Local,
    /// One process per host of the hostfile over ssh (not supported yet).
    Ssh,
}

/// Arguments of `synkv launch`.
#[derive(Debug, Args)]
pub(crate) struct LaunchArgs {
    /// Number of workers (copies of the command).
    #[arg(short = 'n', long = "num-workers")]
    num_workers: u32,
    /// Number of servers (default: as many as workers, like MXNet's launcher).
    #[arg(short = 's', long = "num-servers")]
    num_servers: Option<u32>,
    /// How to start the processes.
    #[arg(long, value_enum, default_value_t = LauncherKind::Local)]
    launcher: LauncherKind,
    /// Hosts for the ssh launcher, one per line.
    #[arg(short = 'H', long)]
    hostfile: Option<PathBuf>,
    /// Seconds the other processes get to exit by themselves after one failed, before they
    /// are killed (default: SYNKV_HEARTBEAT_TIMEOUT_MS + 5 s).
    #[arg(long)]
    grace_secs: Option<f64>,
    /// The worker command and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

/// Where a child's output goes, line by line: (label, from stderr, the line without its
/// newline).
pub(crate) type Sink = Arc<dyn Fn(&str, bool, &[u8]) + Send + Sync>;

/// Where the launcher's own messages go.
pub(crate) type Notes = Arc<dyn Fn(&str) + Send + Sync>;

/// A job to run on this host.
pub(crate) struct JobSpec {
    pub(crate) workers: u32,
    pub(crate) servers: u32,
    /// The worker program and its arguments.
    pub(crate) command: Vec<String>,
    /// Time the others get to exit after one failed.
    pub(crate) grace: Duration,
    pub(crate) sink: Sink,
    pub(crate) notes: Notes,
}

/// The `synkv launch` sink: every line prefixed with `[label] `, to stdout or stderr as the
/// child wrote it.
pub(crate) fn prefixing_sink() -> Sink {
    Arc::new(|label: &str, to_stderr: bool, line: &[u8]| {
        let mut buf = format!("[{label}] ").into_bytes();
        buf.extend_from_slice(line);
        buf.push(b'\n');
        let _ = if to_stderr { std::io::stderr().lock().write_all(&buf) } else { std::io::stdout().lock().write_all(&buf) };
    })
}

/// One started process.
struct Proc {
    label: String,
    child: Child,
    status: Option<ExitStatus>,
    pumps: Vec<JoinHandle<()>>,
}

pub(crate) fn run(args: &LaunchArgs) -> ExitCode {
    match launch(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("[launch] error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn launch(args: &LaunchArgs) -> Result<u8> {
    if args.launcher == LauncherKind::Ssh || args.hostfile.is_some() {
        bail!("the ssh launcher (and -H hostfile) is not supported yet; use --launcher local to run every process on this host");
    }
    let spec = JobSpec {
        workers: args.num_workers,
        servers: args.num_servers.unwrap_or(args.num_workers),
        command: args.command.clone(),
        grace: args.grace_secs.map_or_else(default_grace, Duration::from_secs_f64),
        sink: prefixing_sink(),
        notes: Arc::new(|note: &str| eprintln!("[launch] {note}")),
    };
    run_job(&spec)
}

/// Starts the scheduler, the servers and the workers of `spec`, supervises them and returns
/// the job's exit status (see the module docs).
pub(crate) fn run_job(spec: &JobSpec) -> Result<u8> {
    let (workers, servers, note) = (spec.workers, spec.servers, &spec.notes);
    if workers == 0 || servers == 0 {
        bail!("-n and -s must be at least 1");
    }
    if spec.command.is_empty() {
        bail!("no worker command given");
    }
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).context("finding a free port for the scheduler")?.port();
    let exe = std::env::current_exe().context("locating the synkv executable")?;
    let interrupted = Arc::new(AtomicBool::new(false));
    watch_signals(Arc::clone(&interrupted));

    let common = |cmd: &mut Command, role: &str, task: Option<u32>| {
        cmd.env("DMLC_ROLE", role)
            .env("DMLC_PS_ROOT_URI", "127.0.0.1")
            .env("DMLC_PS_ROOT_PORT", port.to_string())
            .env("DMLC_NUM_SERVER", servers.to_string())
            .env("DMLC_NUM_WORKER", workers.to_string())
            .env("DMLC_JOB_CLUSTER", "local")
            .env_remove("DMLC_TASK_ID")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(t) = task {
            cmd.env("DMLC_TASK_ID", t.to_string());
        }
    };
    let mut procs: Vec<Proc> = Vec::new();
    let mut plan: Vec<(String, Command)> = Vec::new();
    let mut cmd = Command::new(&exe);
    cmd.arg("scheduler");
    common(&mut cmd, "scheduler", None);
    plan.push(("scheduler".into(), cmd));
    for i in 0..servers {
        let mut cmd = Command::new(&exe);
        cmd.arg("server");
        common(&mut cmd, "server", Some(i));
        plan.push((format!("server {i}"), cmd));
    }
    for i in 0..workers {
        let mut cmd = Command::new(&spec.command[0]);
        cmd.args(&spec.command[1..]);
        common(&mut cmd, "worker", Some(i));
        plan.push((format!("worker {i}"), cmd));
    }
    note(&format!("scheduler at 127.0.0.1:{port}, {servers} servers, {workers} workers"));
    for (label, mut cmd) in plan {
        match cmd.spawn() {
            Ok(child) => procs.push(start(label, child, spec)),
            Err(e) => {
                note(&format!("could not start {label} ({:?}): {e}", cmd.get_program()));
                kill_all(&mut procs);
                finish(&mut procs);
                return Ok(127);
            }
        }
    }
    let code = supervise(&mut procs, &interrupted, spec);
    finish(&mut procs);
    Ok(code)
}

/// The heartbeat timeout the children use, plus 5 s.
pub(crate) fn default_grace() -> Duration {
    let ms = std::env::var("SYNKV_HEARTBEAT_TIMEOUT_MS").ok().and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(10_000);
    Duration::from_millis(ms) + Duration::from_secs(5)
}

fn start(label: String, mut child: Child, spec: &JobSpec) -> Proc {
    (spec.notes)(&format!("started {label} (pid {})", child.id()));
    let mut pumps = Vec::new();
    if let Some(out) = child.stdout.take() {
        pumps.push(pump(out, label.clone(), false, Arc::clone(&spec.sink)));
    }
    if let Some(err) = child.stderr.take() {
        pumps.push(pump(err, label.clone(), true, Arc::clone(&spec.sink)));
    }
    Proc { label, child, status: None, pumps }
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

/// Waits for every child; returns the launcher's exit code.
fn supervise(procs: &mut [Proc], interrupted: &AtomicBool, spec: &JobSpec) -> u8 {
    let (grace, note) = (spec.grace, &spec.notes);
    let mut first_failure: Option<(u8, Instant)> = None;
    let mut killed = false;
    loop {
        if interrupted.load(Ordering::Acquire) {
            note("interrupted: stopping every process");
            kill_all(procs);
            return 130;
        }
        // Failures seen in one pass happened within a few ms; a death by signal (a crash, a
        // kill) is the likelier cause of the others, so it counts as the first.
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
            let by_signal = status.code().is_none();
            let replace = match failed_now {
                None => true,
                Some((_, sig)) => by_signal && !sig,
            };
            if replace {
                failed_now = Some((code, by_signal));
            }
        }
        if let (None, Some((code, _))) = (first_failure, failed_now) {
            note(&format!("stopping the job: the others get {grace:?} to finish, then they are killed"));
            first_failure = Some((code, Instant::now() + grace));
        }
        if procs.iter().all(|p| p.status.is_some()) {
            return first_failure.map_or(0, |(c, _)| c);
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
        eprintln!("[launch] warning: cannot watch for Ctrl-C: {e}");
    }
}
