//! `synkv chaos`: the chaos and conservation harness. It runs a dist job on this host —
//! scheduler, servers and workers as separate processes — whose final values are known
//! exactly (`selftest/chaos.rs`), kills a random process with SIGKILL at a random moment,
//! checks that every survivor ends by failure detection (a survivor still running long after
//! the kill is a hang, and fails the run), restarts the whole job from its checkpoint directory,
//! and repeats until `--kills` kills are done and a run finishes. Every worker of the last run
//! checks every key exactly: an update lost or counted twice across the kills and restarts
//! fails the harness.
//!
//! The job checkpoints every `--checkpoint-every` rounds (`SYNKV_CHECKPOINT_INTERVAL`), so a
//! kill can land anywhere: between rounds, in the middle of one, while shards or the manifest
//! are being written, during start-up or shutdown.
//!
//! On a terminal (and without `--verbose`, which prints the processes' output) a progress bar
//! counts the kills done of `--kills`, with the run and the checkpoint round it resumed from
//! (`--no-progress` turns it off).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::rng::SplitMix64;

/// Arguments of `synkv chaos`.
#[derive(Debug, Args)]
pub(crate) struct ChaosArgs {
    /// Workers of the job.
    #[arg(short = 'n', long, default_value_t = 2)]
    workers: u32,
    /// Servers of the job.
    #[arg(short = 's', long, default_value_t = 2)]
    servers: u32,
    /// Small keys (`--key-elems` floats each); one more key is split over the servers.
    #[arg(long, default_value_t = 20)]
    keys: usize,
    /// Floats of each small key; from 4096 (16 KiB) the rounds one push completes update
    /// side by side on the servers (with --replicas, their changes replicate in batches).
    #[arg(long, default_value_t = 4)]
    key_elems: usize,
    /// Floats of the split key.
    #[arg(long, default_value_t = 5000)]
    split_elems: usize,
    /// Rounds of the job (one push and one pull of every key each).
    #[arg(long, default_value_t = 100)]
    rounds: u64,
    /// Processes to kill, one per run of the job.
    #[arg(long, default_value_t = 3)]
    kills: u32,
    /// A checkpoint every this many rounds.
    #[arg(long, default_value_t = 5)]
    checkpoint_every: u64,
    /// Longest random pause of a worker before a round, in milliseconds.
    #[arg(long, default_value_t = 20)]
    max_delay_ms: u64,
    /// A kill comes at a uniform moment in [0.1 s, this] after a run starts (default: the
    /// run's expected length, from the rounds left after its checkpoint).
    #[arg(long)]
    kill_window_secs: Option<f64>,
    /// `dist_sync` or `dist_async`.
    #[arg(long, default_value = "dist_sync")]
    store: String,
    /// Hot replication (`SYNKV_SERVER_REPLICAS=1`, needs 2+ servers): every kill is of a
    /// server, and the job must survive it without a restart (the backups take over) and
    /// finish with every key exact.
    #[arg(long)]
    replicas: bool,
    /// Random seed (default: from the clock; printed, so a run can be repeated).
    #[arg(long)]
    seed: Option<u64>,
    /// The checkpoint directory (default: a new temporary one, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Give up after this many seconds in all.
    #[arg(long, default_value_t = 1200.0)]
    max_secs: f64,
    /// Print every process's output as it comes.
    #[arg(long)]
    verbose: bool,
    /// No progress bar (it is drawn only when stderr is a terminal anyway).
    #[arg(long)]
    no_progress: bool,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
}

/// Failure detection settings of the job (short, so a kill costs seconds).
const HEARTBEAT_INTERVAL_MS: u64 = 200;
const HEARTBEAT_TIMEOUT_MS: u64 = 2000;

/// `SYNKV_TIMEOUT_MS` of the job: what bounds the rendezvous, so a node that never reached a
/// scheduler killed during start-up gives up after it.
const TIMEOUT_MS: u64 = 8000;

/// How long survivors may take to exit after a kill: failure detection (the heartbeat timeout,
/// or the rendezvous timeout when the kill comes during start-up) plus margin for a loaded
/// machine. Longer is a hang.
fn exit_bound() -> Duration {
    Duration::from_millis(TIMEOUT_MS + 3 * HEARTBEAT_TIMEOUT_MS) + Duration::from_secs(20)
}

/// One process of a run, its output collected by two reader threads.
struct Proc {
    label: String,
    child: Child,
    output: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

impl Proc {
    fn start(label: String, mut cmd: Command, verbose: bool) -> Result<Proc> {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().with_context(|| format!("starting {label}"))?;
        let output = Arc::new(Mutex::new(String::new()));
        let pipes: [Option<Box<dyn Read + Send>>; 2] =
            [child.stdout.take().map(|p| Box::new(p) as _), child.stderr.take().map(|p| Box::new(p) as _)];
        let mut readers = Vec::new();
        for pipe in pipes.into_iter().flatten() {
            let (out, label) = (output.clone(), label.clone());
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(std::io::Result::ok) {
                    if verbose {
                        eprintln!("[{label}] {line}");
                    }
                    let mut o = out.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    o.push_str(&line);
                    o.push('\n');
                }
            }));
        }
        Ok(Proc { label, child, output, readers, status: None })
    }

    /// The exit status once the process has exited and its output has been read to the end
    /// (the readers may still hold its last lines, the worker's check line among them, when
    /// `try_wait` first reports the exit; waited for up to 5 s, in case a child of the
    /// process keeps a pipe open).
    fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
            if self.status.is_some() {
                let until = Instant::now() + Duration::from_secs(5);
                while !self.readers.iter().all(JoinHandle::is_finished) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        self.status
    }

    fn output(&self) -> String {
        self.output.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.poll().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What happened in one run of the job.
#[derive(Debug, serde::Serialize)]
struct RunReport {
    /// The round the run resumed from (the checkpoint's), 0 for a fresh start.
    resumed_from: u64,
    /// Rounds rank 0 pushed in this run.
    rounds_pushed: u64,
    /// The process killed, if the kill came before the run ended.
    killed: Option<String>,
    /// Seconds from the start of the run to the kill.
    killed_at_secs: Option<f64>,
    /// Seconds the survivors took to exit after the kill.
    survivors_exited_secs: Option<f64>,
    /// Whether every worker finished with success.
    finished: bool,
}

/// The summary of a harness run.
#[derive(Debug, serde::Serialize)]
struct Summary {
    seed: u64,
    store: String,
    workers: u32,
    servers: u32,
    keys: usize,
    rounds: u64,
    checkpoint_every: u64,
    kills: u32,
    kills_by_role: std::collections::BTreeMap<String, u32>,
    runs: Vec<RunReport>,
    rounds_pushed: u64,
    rounds_redone: u64,
    keys_lost: u64,
    keys_doubled: u64,
    secs: f64,
}

pub(crate) fn run(args: &ChaosArgs) -> Result<()> {
    if args.workers == 0 || args.servers == 0 || args.rounds == 0 || args.checkpoint_every == 0 {
        bail!("-n, -s, --rounds and --checkpoint-every must be at least 1");
    }
    if args.replicas && args.servers < 2 {
        bail!("--replicas needs at least 2 servers (-s 2): the backup copy lives on another server");
    }
    if args.store != "dist_sync" && args.store != "dist_async" {
        bail!("--store {} is not dist_sync or dist_async", args.store);
    }
    let seed =
        args.seed.unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64));
    let temp;
    let dir: &Path = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            d
        }
        None => {
            temp = TempDir::new()?;
            &temp.0
        }
    };
    eprintln!(
        "chaos: seed {seed}, {} workers × {} servers, {} keys + 1 split key × {} rounds, {}{}, checkpoint every {} rounds, {} kills, in {}",
        args.workers,
        args.servers,
        args.keys,
        args.rounds,
        args.store,
        if args.replicas { " with replicas (server kills, no restarts)" } else { "" },
        args.checkpoint_every,
        args.kills,
        dir.display()
    );
    if args.no_progress || args.verbose {
        crate::progress::disable(); // --verbose prints the processes' lines, which would tear it
    }
    let bar = crate::progress::bar(u64::from(args.kills.max(1)), "chaos");
    let started = Instant::now();
    let deadline = started + Duration::try_from_secs_f64(args.max_secs).unwrap_or(Duration::from_secs(1200));
    let mut rng = SplitMix64(seed);
    let mut summary = Summary {
        seed,
        store: args.store.clone(),
        workers: args.workers,
        servers: args.servers,
        keys: args.keys + 1,
        rounds: args.rounds,
        checkpoint_every: args.checkpoint_every,
        kills: 0,
        kills_by_role: Default::default(),
        runs: Vec::new(),
        rounds_pushed: 0,
        rounds_redone: 0,
        keys_lost: 0,
        keys_doubled: 0,
        secs: 0.0,
    };
    loop {
        if Instant::now() > deadline {
            bail!("gave up after --max-secs {} with {} runs", args.max_secs, summary.runs.len());
        }
        // The kill comes within the run's expected length: start-up, then the rounds left after
        // the checkpoint it resumes from.
        let done = synkv::ps::checkpoint::read_manifest(dir).ok().flatten().map_or(0, |m| m.round);
        let left = args.rounds.saturating_sub(done) as f64;
        let window = args.kill_window_secs.unwrap_or(0.8 + left * (args.max_delay_ms as f64 / 2.0 + 4.0) / 1000.0);
        let kill_at = (summary.kills < args.kills).then(|| Duration::from_secs_f64(0.1 + rng.uniform() * (window - 0.1).max(0.0)));
        let pick = rng.next_u64();
        bar.set_message(format!("chaos run {}, from round {done}; kills", summary.runs.len() + 1));
        let (report, procs) = one_run(&bar, args, dir, seed ^ summary.runs.len() as u64, kill_at, pick, deadline)?;
        if let Some(victim) = &report.killed {
            summary.kills += 1;
            let role = victim.split(' ').next().unwrap_or(victim).to_owned();
            *summary.kills_by_role.entry(role).or_default() += 1;
        }
        bar.set_position(u64::from(summary.kills));
        bar.suspend(|| {
            eprintln!(
                "chaos: run {}: resumed after round {}, pushed {} rounds, {}",
                summary.runs.len() + 1,
                report.resumed_from,
                report.rounds_pushed,
                match (&report.killed, report.killed_at_secs, report.survivors_exited_secs) {
                    (Some(v), Some(at), Some(exit)) => format!("killed {v} at {at:.2} s; the others exited {exit:.2} s later"),
                    _ if report.finished => "finished".to_owned(),
                    _ => "failed".to_owned(),
                }
            )
        });
        summary.rounds_pushed += report.rounds_pushed;
        let finished = report.finished;
        let killed = report.killed.is_some();
        summary.runs.push(report);
        // Every check a worker made counts, also in a run a kill ended after it.
        let (lost, doubled) = checked(&procs, args, finished)?;
        summary.keys_lost += lost;
        summary.keys_doubled += doubled;
        if lost + doubled > 0 {
            bar.suspend(|| dump(&procs));
            break;
        }
        if finished {
            if summary.kills >= args.kills {
                break;
            }
            // Finished before the kill came: another run from scratch, with a fresh directory.
            clear(dir)?;
        } else if killed && args.replicas {
            bar.suspend(|| dump(&procs));
            bail!(
                "run {} did not finish after a server was killed, although replicas should have kept it going (output above)",
                summary.runs.len()
            );
        } else if !killed {
            bar.suspend(|| dump(&procs));
            bail!("run {} failed without a kill (output above)", summary.runs.len());
        }
    }
    bar.finish_and_clear();
    summary.rounds_redone = summary.rounds_pushed.saturating_sub(summary.runs.iter().filter(|r| r.finished).count() as u64 * args.rounds);
    summary.secs = started.elapsed().as_secs_f64();
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        let roles: Vec<String> = summary.kills_by_role.iter().map(|(r, n)| format!("{r} {n}")).collect();
        println!(
            "chaos: {} runs, {} kills ({}), {} rounds pushed for {} ({} redone after restarts), no hang, keys with lost updates {}, with doubled updates {}, {:.1} s (seed {seed})",
            summary.runs.len(),
            summary.kills,
            roles.join(", "),
            summary.rounds_pushed,
            args.rounds,
            summary.rounds_redone,
            summary.keys_lost,
            summary.keys_doubled,
            summary.secs
        );
    }
    if summary.keys_lost + summary.keys_doubled > 0 {
        bail!("updates were lost or doubled (seed {seed})");
    }
    Ok(())
}

/// Starts the job, kills one process at `kill_at` (the `pick`-th of those still running),
/// waits for every process to end, and reports. With replicas, `kill_at` counts from when
/// every worker started (the scheduler starts them once every partition has a backup: a
/// server dying before that ends the job, as it should, but it is no failover case). Output
/// it prints hides `bar` meanwhile.
fn one_run(
    bar: &indicatif::ProgressBar,
    args: &ChaosArgs,
    dir: &Path,
    seed: u64,
    kill_at: Option<Duration>,
    pick: u64,
    deadline: Instant,
) -> Result<(RunReport, Vec<Proc>)> {
    let mut procs = start(args, dir, seed)?;
    let started = Instant::now();
    let mut report =
        RunReport { resumed_from: 0, rounds_pushed: 0, killed: None, killed_at_secs: None, survivors_exited_secs: None, finished: false };
    let all_done = |procs: &mut Vec<Proc>| procs.iter_mut().all(|p| p.poll().is_some());
    let mut killed_at = None;
    let mut clock = (!args.replicas).then_some(started);
    while !all_done(&mut procs) {
        if Instant::now() > deadline {
            bar.suspend(|| dump(&procs));
            bail!("the job did not finish within --max-secs {} (output above)", args.max_secs);
        }
        if killed_at.is_none() || args.replicas {
            let killed = report.killed.clone();
            let failed = procs
                .iter_mut()
                .find_map(|p| (Some(&p.label) != killed.as_ref() && p.poll().is_some_and(|s| !s.success())).then(|| p.label.clone()));
            if let Some(label) = failed {
                if killed_at.is_some() {
                    std::thread::sleep(Duration::from_millis(500));
                    bar.suspend(|| dump(&procs));
                    bail!(
                        "{label} failed after {} was killed, although replicas should have kept the job going (output above)",
                        killed.as_deref().unwrap_or("?")
                    );
                }
                // Let the others report what they saw, then stop them.
                std::thread::sleep(Duration::from_millis(500));
                bar.suspend(|| dump(&procs));
                bail!("{label} failed before any kill (output above)");
            }
        }
        if args.replicas && clock.is_none() {
            let workers_started = procs.iter().filter(|p| p.label.starts_with("worker")).all(|p| p.output().contains("starts after round"));
            clock = workers_started.then(Instant::now);
        }
        if let (Some(at), None, Some(clock)) = (kill_at, killed_at, clock) {
            if clock.elapsed() >= at {
                let mut running: Vec<&mut Proc> =
                    procs.iter_mut().filter(|p| p.status.is_none() && (!args.replicas || p.label.starts_with("server"))).collect();
                if !running.is_empty() {
                    let n = running.len() as u64;
                    let victim = &mut running[(pick % n) as usize];
                    let _ = victim.child.kill();
                    report.killed = Some(victim.label.clone());
                    report.killed_at_secs = Some(started.elapsed().as_secs_f64());
                    killed_at = Some(Instant::now());
                }
            }
        }
        if let Some(k) = killed_at.filter(|_| !args.replicas) {
            if k.elapsed() > exit_bound() {
                let hung: Vec<String> = procs.iter_mut().filter_map(|p| p.poll().is_none().then(|| p.label.clone())).collect();
                bar.suspend(|| dump(&procs));
                bail!(
                    "hang: {} still running {:?} after {} was killed (output above)",
                    hung.join(", "),
                    exit_bound(),
                    report.killed.as_deref().unwrap_or("?")
                );
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some(k) = killed_at {
        report.survivors_exited_secs = Some(k.elapsed().as_secs_f64());
    }
    let workers: Vec<&Proc> = procs.iter().filter(|p| p.label.starts_with("worker")).collect();
    report.finished = workers.iter().all(|p| p.status.is_some_and(|s| s.success()));
    if let Some(w0) = workers.first() {
        let out = w0.output();
        report.rounds_pushed = out.lines().filter(|l| l.starts_with("chaos: round ")).count() as u64;
        report.resumed_from =
            out.lines().find_map(|l| l.split("starts after round ").nth(1)).and_then(|r| r.trim().parse().ok()).unwrap_or(0);
    }
    Ok((report, procs))
}

/// Starts a scheduler, the servers and the workers on a free port.
fn start(args: &ChaosArgs, dir: &Path, seed: u64) -> Result<Vec<Proc>> {
    let exe = std::env::current_exe().context("locating the synkv executable")?;
    let port = synkv::ps::transport::ports::free_port("127.0.0.1").context("finding a free port for the scheduler")?;
    // Chaos runs are authenticated and sealed like every launched job.
    let secret = synkv::ps::Secret::generate().context("generating the job's secret")?;
    let base = |role: &str, task: Option<u32>| {
        let mut cmd = Command::new(&exe);
        cmd.env("DMLC_ROLE", role)
            .env("DMLC_PS_ROOT_URI", "127.0.0.1")
            .env("DMLC_PS_ROOT_PORT", port.to_string())
            .env("DMLC_NUM_SERVER", args.servers.to_string())
            .env("DMLC_NUM_WORKER", args.workers.to_string())
            .env("SYNKV_HEARTBEAT_INTERVAL_MS", HEARTBEAT_INTERVAL_MS.to_string())
            .env("SYNKV_HEARTBEAT_TIMEOUT_MS", HEARTBEAT_TIMEOUT_MS.to_string())
            .env("SYNKV_TIMEOUT_MS", TIMEOUT_MS.to_string())
            .env("MXNET_KVSTORE_BIGARRAY_BOUND", "1000")
            .env("SYNKV_CHECKPOINT_DIR", dir)
            .env("SYNKV_CHECKPOINT_INTERVAL", args.checkpoint_every.to_string())
            .env("SYNKV_SERVER_REPLICAS", if args.replicas { "1" } else { "0" })
            .env("SYNKV_SECRET", &secret)
            .env_remove("DMLC_TASK_ID");
        if std::env::var_os("SYNKV_LOG").is_none() {
            cmd.env("SYNKV_LOG", "warn");
        }
        if let Some(t) = task {
            cmd.env("DMLC_TASK_ID", t.to_string());
        }
        cmd
    };
    let mut procs = Vec::new();
    let mut cmd = base("scheduler", None);
    cmd.arg("scheduler");
    procs.push(Proc::start("scheduler".into(), cmd, args.verbose)?);
    for i in 0..args.servers {
        let mut cmd = base("server", Some(i));
        cmd.arg("server");
        procs.push(Proc::start(format!("server {i}"), cmd, args.verbose)?);
    }
    for i in 0..args.workers {
        let mut cmd = base("worker", Some(i));
        cmd.args(["selftest", "dist", "chaos", "--store", &args.store]);
        cmd.args(["--keys", &args.keys.to_string(), "--key-elems", &args.key_elems.to_string(), "--size", &args.split_elems.to_string()]);
        cmd.args(["--repeat", &args.rounds.to_string(), "--max-delay-ms", &args.max_delay_ms.to_string()]);
        cmd.args(["--seed", &seed.to_string()]);
        procs.push(Proc::start(format!("worker {i}"), cmd, args.verbose)?);
    }
    Ok(procs)
}

/// The workers' exact checks in a run: keys with lost and with doubled updates (the most any
/// worker saw). A finished run must have every worker's check.
fn checked(procs: &[Proc], args: &ChaosArgs, finished: bool) -> Result<(u64, u64)> {
    let (mut lost, mut doubled) = (0u64, 0u64);
    for p in procs.iter().filter(|p| p.label.starts_with("worker")) {
        let out = p.output();
        let Some(line) = out.lines().find(|l| l.starts_with("chaos: rank ") && l.contains(" checked ")) else {
            if !finished {
                continue;
            }
            dump(procs);
            bail!("{} finished without its check line (output above)", p.label);
        };
        let num = |word: &str| {
            line.split(word).nth(1).and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next()).and_then(|n| n.parse::<u64>().ok())
        };
        let (Some(l), Some(d)) = (num("lost "), num("doubled ")) else { bail!("{}: cannot read {line:?}", p.label) };
        if !line.contains(&format!("after {} rounds", args.rounds)) {
            bail!("{}: {line:?} is not about {} rounds", p.label, args.rounds);
        }
        lost = lost.max(l);
        doubled = doubled.max(d);
    }
    Ok((lost, doubled))
}

/// Prints every process's output (on a failure).
fn dump(procs: &[Proc]) {
    for p in procs {
        for line in p.output().lines() {
            eprintln!("[{}] {line}", p.label);
        }
        eprintln!("[{}] exit: {:?}", p.label, p.status);
    }
}

/// Empties the checkpoint directory.
fn clear(dir: &Path) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = e?.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!("synkv-chaos-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
