//! `synkv launch -n W -s S [--launcher local|ssh -H hostfile] -- CMD ARGS…`: start a whole job.
//!
//! (`--launcher mpi|slurm` hands the job to `mpirun` or `srun` instead, whose processes host
//! the scheduler and the servers themselves: [`engines`]; `--launcher hosted` starts such
//! processes on this host itself: [`hosted`]. What follows is about local and ssh.)
//!
//! Both launchers start, in this order, `synkv scheduler`, `S` × `synkv server` and `W` copies
//! of `CMD ARGS…`, each with MXNet's variables set (`DMLC_ROLE`, `DMLC_PS_ROOT_URI`,
//! `DMLC_PS_ROOT_PORT`, `DMLC_NUM_SERVER`, `DMLC_NUM_WORKER`, `DMLC_TASK_ID` = the index within
//! its role, `DMLC_JOB_CLUSTER=local` or `ssh`). With complete task ids the scheduler ranks each
//! role by task id, so worker `i` has rank `i`.
//!
//! - **local** (this file): every process on this host; the scheduler on a free port of
//!   127.0.0.1; the children inherit the launcher's whole environment (so `SYNKV_*` settings
//!   reach every process).
//! - **ssh** ([`ssh`]): the scheduler on this host, servers and workers round-robin over the
//!   hosts of a [`hostfile`], each through `ssh`, with the `SYNKV_*` settings forwarded (the
//!   secret on ssh's standard input, never on a command line).
//!
//! Every output line of a child is printed with a prefix — `[scheduler]`, `[server 0]`,
//! `[worker 1]` — on the launcher's stdout or stderr, as the child wrote it. The launcher's own
//! lines start with `[launch]` (on stderr), including each child's pid (for ssh, the local
//! `ssh` process's). `--dry-run` prints the commands instead of running them. On a terminal,
//! a progress bar counts the processes registered with the scheduler until the job has formed
//! ([`peers`]; `--no-progress` turns it off).
//!
//! Exit status ([`supervise`]): 0 when every process exits 0. When one exits non-zero (or is
//! killed by a signal: 128 + signal), the others get a grace period to notice — they report
//! the lost node themselves — then the remaining ones are killed, and the launcher exits with
//! that first non-zero status. The launcher never waits forever: once the job is over — the
//! scheduler exited, or every worker did — the processes still running get the same grace
//! period, then are killed and named, and the launcher exits 1. Ctrl-C or SIGTERM kills every
//! child and exits with 130.

mod engines;
mod hosted;
mod hostfile;
mod peers;
mod ssh;
mod supervise;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};

use supervise::{run_plan, Part, Planned};

/// How processes are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LauncherKind {
    /// Every process on this host.
    Local,
    /// The scheduler on this host, servers and workers round-robin over the hostfile's hosts,
    /// through ssh (`SYNKV_SSH`, default `ssh`).
    Ssh,
    /// Open MPI's `mpirun -n W`: the processes host the scheduler and the servers themselves
    /// (see [`engines`]).
    Mpi,
    /// Slurm's `srun -n W`: the tasks host the scheduler and the servers themselves.
    Slurm,
    /// Every process on this host, each a worker started as torchrun starts them: rank 0
    /// hosts the scheduler and `-s` processes (default: all) a server each (see [`hosted`]).
    Hosted,
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
    /// Hosts for the ssh launcher: one `[user@]host[:port]` per line, `#` comments.
    #[arg(short = 'H', long)]
    hostfile: Option<PathBuf>,
    /// ssh launcher: the scheduler's address, one of this host's that every host can reach
    /// (default: DMLC_PS_ROOT_URI, else 127.0.0.1 if every host is loopback, else this host's
    /// address on the route to the first remote host).
    #[arg(long)]
    root_uri: Option<String>,
    /// ssh launcher: the scheduler's port (default: DMLC_PS_ROOT_PORT, else a free port).
    #[arg(long)]
    root_port: Option<u16>,
    /// ssh launcher: the synkv executable on the remote hosts, for the servers (default: the
    /// path of this one).
    #[arg(long)]
    remote_synkv: Option<String>,
    /// Print the command of every process (the secret redacted) and exit without starting any.
    #[arg(long)]
    dry_run: bool,
    /// mpi and slurm launchers: an argument for mpirun or srun, before the command (repeat
    /// for more: `--launcher-arg=--oversubscribe`).
    #[arg(long = "launcher-arg", allow_hyphen_values = true)]
    launcher_args: Vec<String>,
    /// Seconds the other processes get to exit by themselves after one failed, before they
    /// are killed (default: SYNKV_HEARTBEAT_TIMEOUT_MS + 5 s).
    #[arg(long)]
    grace_secs: Option<f64>,
    /// Backup copies of every server's partition on another server (0 or 1; sets
    /// SYNKV_SERVER_REPLICAS for every process, default: that variable, else 0). With 1, a
    /// server that dies is replaced by the backups and the job goes on (needs 2+ servers).
    #[arg(long)]
    replicas: Option<u32>,
    /// Restart a worker that dies (same rank) up to this many times in all; sets
    /// SYNKV_WORKER_RESTARTS=1 for every process, so a worker's death does not end the job
    /// (see docs/dist.md for what a restarted worker does).
    #[arg(long, default_value_t = 0)]
    max_restarts: u32,
    /// No progress bar while the job forms (it is drawn only when stderr is a terminal anyway).
    #[arg(long)]
    no_progress: bool,
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
    /// Variables set for every process (besides the inherited environment).
    pub(crate) env: Vec<(String, String)>,
    /// Whether a server's death leaves the job running (replicas): the scheduler decides
    /// whether the job goes on, and ends it if not.
    pub(crate) servers_may_die: bool,
    /// Worker restarts allowed in all (`--max-restarts`).
    pub(crate) max_restarts: u32,
}

/// The replica count of a job: `--replicas`, else `SYNKV_SERVER_REPLICAS`, else 0.
fn replicas(flag: Option<u32>) -> Result<u32> {
    let n = match flag {
        Some(n) => n,
        None => match std::env::var("SYNKV_SERVER_REPLICAS") {
            Ok(v) if !v.trim().is_empty() => v.trim().parse().with_context(|| format!("SYNKV_SERVER_REPLICAS={v:?} is not 0 or 1"))?,
            _ => 0,
        },
    };
    if n > 1 {
        bail!("--replicas {n}: synkv keeps at most one backup copy of each partition; use 0 or 1");
    }
    Ok(n)
}

/// Writes `[launch] NOTE` to stderr in one write, so that it never lands inside a line the
/// children's output (or the launcher's stdout) writes at the same time.
pub(crate) fn launch_note(note: &str) {
    let line = format!("[launch] {note}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
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

pub(crate) fn run(args: &LaunchArgs) -> ExitCode {
    match launch(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            launch_note(&format!("error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

/// Every job is authenticated by default: without `SYNKV_SECRET` in the launcher's environment
/// (and without `SYNKV_INSECURE=1`), a fresh random 256-bit secret is put there, for this job's
/// processes only: the local children inherit it, `mpirun -x SYNKV_SECRET` and `srun` pass it
/// by name, ssh sends it on the remote shell's standard input. It never appears on a command
/// line or in a log.
pub(crate) fn ensure_job_secret() -> Result<()> {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    if set("SYNKV_SECRET") || std::env::var_os("SYNKV_INSECURE").is_some_and(|v| v == "1") {
        return Ok(());
    }
    let secret = synkv::ps::Secret::generate().context("generating the job's secret")?;
    // The launcher has started no thread yet (it is called before any child or runtime).
    std::env::set_var("SYNKV_SECRET", secret);
    Ok(())
}

fn launch(args: &LaunchArgs) -> Result<u8> {
    ensure_job_secret()?;
    match args.launcher {
        LauncherKind::Mpi | LauncherKind::Slurm => return engines::run(args),
        LauncherKind::Local | LauncherKind::Ssh | LauncherKind::Hosted if !args.launcher_args.is_empty() => {
            bail!("--launcher-arg belongs to the mpi and slurm launchers")
        }
        LauncherKind::Local | LauncherKind::Ssh | LauncherKind::Hosted => {}
    }
    if args.no_progress {
        crate::progress::disable();
    }
    let mut spec = JobSpec {
        workers: args.num_workers,
        servers: args.num_servers.unwrap_or(args.num_workers),
        command: args.command.clone(),
        grace: match args.grace_secs {
            None => default_grace(),
            Some(s) => Duration::try_from_secs_f64(s).map_err(|_| anyhow::anyhow!("--grace-secs {s} is not a number of seconds ≥ 0"))?,
        },
        sink: prefixing_sink(),
        notes: Arc::new(launch_note),
        env: args
            .replicas
            .map(|n| ("SYNKV_SERVER_REPLICAS".to_owned(), n.to_string()))
            .into_iter()
            .chain((args.max_restarts > 0).then(|| ("SYNKV_WORKER_RESTARTS".to_owned(), "1".to_owned())))
            .collect(),
        servers_may_die: replicas(args.replicas)? > 0,
        max_restarts: args.max_restarts,
    };
    check_counts(&spec)?;
    if spec.servers_may_die && spec.servers < 2 {
        bail!(
            "--replicas 1 (or SYNKV_SERVER_REPLICAS=1) keeps each partition's copy on another server: it needs at least 2 servers (-s 2)"
        );
    }
    let mut plan = match args.launcher {
        LauncherKind::Local => {
            if args.hostfile.is_some() || args.root_uri.is_some() || args.root_port.is_some() || args.remote_synkv.is_some() {
                bail!("-H/--hostfile, --root-uri, --root-port and --remote-synkv belong to the ssh launcher; add --launcher ssh");
            }
            local_plan(&spec)?
        }
        LauncherKind::Ssh => ssh_plan(args, &spec)?,
        LauncherKind::Hosted => {
            if args.hostfile.is_some() || args.root_uri.is_some() || args.root_port.is_some() || args.remote_synkv.is_some() {
                bail!("-H/--hostfile, --root-uri, --root-port and --remote-synkv belong to the ssh launcher");
            }
            if args.max_restarts > 0 {
                bail!("--max-restarts: worker restarts are not supported when the processes host the scheduler and the servers (--launcher hosted)");
            }
            hosted::plan(&spec)?
        }
        LauncherKind::Mpi | LauncherKind::Slurm => unreachable!("handled above"),
    };
    if args.dry_run {
        print_plan(&plan, std::env::var("SYNKV_SECRET").ok().filter(|s| !s.is_empty()).as_deref());
        return Ok(0);
    }
    // The bar reads the scheduler's output; hosted roles log in their worker's.
    let bar = if plan.iter().any(|p| p.role == Part::Scheduler) { peers::watch(&mut plan, &mut spec) } else { None };
    let code = run_plan(plan, &spec);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(code)
}

fn check_counts(spec: &JobSpec) -> Result<()> {
    if spec.workers == 0 || spec.servers == 0 {
        bail!("-n and -s must be at least 1");
    }
    if spec.command.is_empty() {
        bail!("no worker command given");
    }
    Ok(())
}

/// Starts the scheduler, the servers and the workers of `spec` on this host, supervises them
/// and returns the job's exit status (see the module docs).
pub(crate) fn run_job(spec: &JobSpec) -> Result<u8> {
    check_counts(spec)?;
    ensure_job_secret()?;
    Ok(run_plan(local_plan(spec)?, spec))
}

/// The local launcher's processes: everything on this host, the scheduler on 127.0.0.1.
fn local_plan(spec: &JobSpec) -> Result<Vec<Planned>> {
    let (workers, servers) = (spec.workers, spec.servers);
    let port = synkv::ps::transport::ports::free_port("127.0.0.1").context("finding a free port for the scheduler")?;
    let exe = std::env::current_exe().context("locating the synkv executable")?;
    let common = |cmd: &mut Command, role: &str, task: Option<u32>| {
        cmd.env("DMLC_ROLE", role)
            .env("DMLC_PS_ROOT_URI", "127.0.0.1")
            .env("DMLC_PS_ROOT_PORT", port.to_string())
            .env("DMLC_NUM_SERVER", servers.to_string())
            .env("DMLC_NUM_WORKER", workers.to_string())
            .env("DMLC_JOB_CLUSTER", "local")
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env_remove("DMLC_TASK_ID");
        if let Some(t) = task {
            cmd.env("DMLC_TASK_ID", t.to_string());
        }
    };
    let planned = |label: String, role: Part, cmd: Command| Planned { label, role, cmd, stdin: None, place: String::new() };
    let mut cmd = Command::new(&exe);
    cmd.arg("scheduler");
    common(&mut cmd, "scheduler", None);
    let mut plan = vec![planned("scheduler".into(), Part::Scheduler, cmd)];
    for i in 0..servers {
        let mut cmd = Command::new(&exe);
        cmd.arg("server");
        common(&mut cmd, "server", Some(i));
        plan.push(planned(format!("server {i}"), Part::Server, cmd));
    }
    for i in 0..workers {
        let mut cmd = Command::new(&spec.command[0]);
        cmd.args(&spec.command[1..]);
        common(&mut cmd, "worker", Some(i));
        plan.push(planned(format!("worker {i}"), Part::Worker, cmd));
    }
    (spec.notes)(&format!("scheduler at 127.0.0.1:{port}, {servers} servers, {workers} workers"));
    Ok(plan)
}

/// The ssh launcher's processes (see [`ssh`]).
fn ssh_plan(args: &LaunchArgs, spec: &JobSpec) -> Result<Vec<Planned>> {
    let Some(path) = &args.hostfile else {
        bail!("--launcher ssh needs a hostfile: -H FILE, one [user@]host[:port] per line");
    };
    let hosts = hostfile::read(path)?;
    let env_var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let root_uri = ssh::root_uri(args.root_uri.as_deref(), env_var("DMLC_PS_ROOT_URI"), &hosts)?;
    let root_port =
        match (args.root_port, env_var("DMLC_PS_ROOT_PORT")) {
            (Some(p), _) => p,
            (None, Some(p)) => p.trim().parse::<u16>().ok().filter(|p| *p > 0).with_context(|| {
                format!("DMLC_PS_ROOT_PORT={p:?} is not a port number in 1..=65535; fix it, unset it or pass --root-port")
            })?,
            (None, None) => free_port(&root_uri)?,
        };
    let exe = std::env::current_exe().context("locating the synkv executable")?;
    let cwd = std::env::current_dir().context("reading the current directory")?;
    let utf8 = |p: &std::path::Path, what: &str| {
        p.to_str().map(str::to_owned).with_context(|| format!("{what} {} is not valid UTF-8, so it cannot be sent over ssh", p.display()))
    };
    let (mut env, secret) = ssh::forwarded_env(std::env::vars_os())?;
    for (k, v) in &spec.env {
        env.retain(|(name, _)| name != k);
        env.push((k.clone(), v.clone()));
    }
    let job = ssh::SshJob {
        hosts: &hosts,
        ssh: std::env::var_os("SYNKV_SSH").filter(|s| !s.is_empty()).unwrap_or_else(|| OsString::from("ssh")),
        local_synkv: &exe,
        remote_synkv: match &args.remote_synkv {
            Some(p) => p.clone(),
            None => utf8(&exe, "the synkv path")?,
        },
        cwd: utf8(&cwd, "the current directory")?,
        root_uri,
        root_port,
        servers: spec.servers,
        workers: spec.workers,
        command: &spec.command,
        env,
        secret,
        host_key_checking: ssh::host_key_checking(std::env::var("SYNKV_SSH_HOST_KEY_CHECKING").ok().as_deref())?,
    };
    (spec.notes)(&format!(
        "scheduler at {}:{} on this host, {} servers and {} workers over {} hosts through {:?}",
        job.root_uri,
        job.root_port,
        job.servers,
        job.workers,
        hosts.len(),
        job.ssh
    ));
    Ok(job.plan())
}

/// A free port on `host` (which must be this machine's, since the scheduler binds it).
fn free_port(host: &str) -> Result<u16> {
    let addr = if host.contains(':') { format!("[{host}]:0") } else { format!("{host}:0") };
    std::net::TcpListener::bind(&addr).with_context(|| {
        format!("binding the scheduler's address {addr}: the scheduler runs on this host, so --root-uri (or DMLC_PS_ROOT_URI) must be one of this host's addresses")
    })?;
    Ok(synkv::ps::transport::ports::free_port(host)?)
}

/// `--dry-run`: each process's command as a shell line (`env -u NAME… NAME=VALUE… CMD…`), with
/// `secret` replaced wherever it would appear.
fn print_plan(plan: &[Planned], secret: Option<&str>) {
    let mut out = std::io::stdout().lock();
    for p in plan {
        // Variables the child does not inherit first (`env -u NAME`), then those it is given.
        let removed = p.cmd.get_envs().filter(|(_, v)| v.is_none()).flat_map(|(k, _)| ["-u".to_owned(), k.to_string_lossy().into_owned()]);
        let env = p.cmd.get_envs().filter_map(|(k, v)| Some(format!("{}={}", k.to_string_lossy(), v?.to_string_lossy())));
        let argv = std::iter::once(p.cmd.get_program()).chain(p.cmd.get_args()).map(|a| a.to_string_lossy().into_owned());
        let words: Vec<String> = removed.chain(env).chain(argv).collect();
        let mut line = if p.cmd.get_envs().next().is_some() { format!("env {}", ssh::join(&words)) } else { ssh::join(&words) };
        if let Some(s) = secret {
            line = line.replace(s, "<redacted>");
        }
        let stdin = if p.stdin.is_some() { "  # SYNKV_SECRET on standard input (redacted)" } else { "" };
        let _ = writeln!(out, "[{}] {line}{stdin}", p.label);
    }
}

/// The heartbeat timeout the children use, plus 5 s.
pub(crate) fn default_grace() -> Duration {
    let ms = std::env::var("SYNKV_HEARTBEAT_TIMEOUT_MS").ok().and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(10_000);
    Duration::from_millis(ms) + Duration::from_secs(5)
}
