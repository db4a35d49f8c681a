//! Helpers for tests that drive the real `synkv` binary (ripgrep's `tests/util.rs` style):
//! run `synkv launch …` with a deadline, or start the roles of a job one by one so a test can
//! kill one of them; collect every process's output; never wait without a bound. Every
//! process starts from a clean environment ([`command`], [`synkv_command`]): nothing a job
//! reads is inherited from the caller's shell.
#![allow(dead_code)]

mod clean_env;

pub use clean_env::{assert_clean, command, is_job_variable};

use std::io::Read;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use synkv::ps::proto::{check, parse, Limits, Message};

/// Short heartbeats and deadlines so failure tests finish quickly.
pub const FAST: [(&str, &str); 3] =
    [("SYNKV_HEARTBEAT_INTERVAL_MS", "200"), ("SYNKV_HEARTBEAT_TIMEOUT_MS", "2000"), ("SYNKV_TIMEOUT_MS", "30000")];

/// The bound on any one job in these tests.
pub const JOB_BOUND: Duration = Duration::from_secs(90);

/// The built binary.
pub fn synkv() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_synkv"))
}

/// A command running the built binary, from a clean environment ([`command`]).
pub fn synkv_command() -> Command {
    command(synkv())
}

/// A free port on 127.0.0.1 for a process to listen on, outside the ephemeral range (where a
/// released `:0` port can be taken by any outgoing connection before the process binds it) and
/// never the same twice in this test binary (`synkv::ps::transport::ports`).
pub fn free_port() -> u16 {
    synkv::ps::transport::ports::free_port("127.0.0.1").expect("a free port")
}

/// A running process whose stdout and stderr are collected.
pub struct Proc {
    pub label: String,
    child: Child,
    out: Arc<Mutex<Vec<u8>>>,
    pumps: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

fn collect(src: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut src = src;
        let mut buf = [0u8; 8192];
        loop {
            match src.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => into.lock().unwrap().extend_from_slice(&buf[..n]),
            }
        }
    })
}

impl Proc {
    /// Starts `cmd` (built with [`command`]) with piped output.
    pub fn start(label: &str, mut cmd: Command) -> Proc {
        assert_clean(&cmd);
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("starting {label}: {e}"));
        let out = Arc::new(Mutex::new(Vec::new()));
        let pumps = vec![
            collect(child.stdout.take().expect("stdout"), Arc::clone(&out)),
            collect(child.stderr.take().expect("stderr"), Arc::clone(&out)),
        ];
        Proc { label: label.to_owned(), child, out, pumps, status: None }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything printed so far (stdout and stderr interleaved).
    pub fn output(&self) -> String {
        String::from_utf8_lossy(&self.out.lock().unwrap()).into_owned()
    }

    /// Kills it with SIGKILL.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        self.status = self.child.wait().ok();
    }

    /// Waits until `deadline`; `None` if it is still running then.
    pub fn wait_until(&mut self, deadline: Instant) -> Option<ExitStatus> {
        loop {
            if let Some(s) = self.status {
                return Some(s);
            }
            if let Ok(Some(s)) = self.child.try_wait() {
                self.status = Some(s);
                for p in self.pumps.drain(..) {
                    let _ = p.join();
                }
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for a line containing `needle` in the output, until `deadline`.
    pub fn wait_for_output(&self, needle: &str, deadline: Instant) -> bool {
        while Instant::now() < deadline {
            if self.output().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The result of a finished job.
pub struct Finished {
    pub status: ExitStatus,
    pub output: String,
}

/// Runs `synkv launch -n workers -s servers [extra…] -- synkv selftest dist <case> [args…]`
/// with `env` set, bounded by [`JOB_BOUND`].
pub fn launch(workers: u32, servers: u32, extra: &[&str], case_args: &[&str], env: &[(&str, &str)]) -> Finished {
    let exe = synkv();
    let mut cmd = command(&exe);
    cmd.arg("launch").args(["-n", &workers.to_string(), "-s", &servers.to_string()]).args(extra).arg("--");
    cmd.arg(&exe).args(["selftest", "dist"]).args(case_args);
    run_bounded("launch", cmd, env)
}

/// Runs `cmd` (built with [`command`]) with `FAST` and `env` set, bounded by [`JOB_BOUND`].
pub fn run_bounded(label: &str, mut cmd: Command, env: &[(&str, &str)]) -> Finished {
    cmd.envs(FAST).envs(env.iter().copied()).env("SYNKV_LOG", "warn");
    let mut p = Proc::start(label, cmd);
    match p.wait_until(Instant::now() + JOB_BOUND) {
        Some(status) => Finished { status, output: p.output() },
        None => {
            p.kill();
            panic!("{label} did not finish within {JOB_BOUND:?}; output so far:\n{}", p.output());
        }
    }
}

/// A job started role by role (no launcher), so a test can kill any process.
pub struct Job {
    pub scheduler: Proc,
    pub servers: Vec<Proc>,
    pub workers: Vec<Proc>,
}

/// The `DMLC_*` variables of a job whose scheduler listens on `port`.
pub fn job_env(port: u16, servers: u32, workers: u32) -> Vec<(String, String)> {
    vec![
        ("DMLC_PS_ROOT_URI".into(), "127.0.0.1".into()),
        ("DMLC_PS_ROOT_PORT".into(), port.to_string()),
        ("DMLC_NUM_SERVER".into(), servers.to_string()),
        ("DMLC_NUM_WORKER".into(), workers.to_string()),
    ]
}

impl Job {
    /// Starts a scheduler, `servers` servers and `workers` × `synkv selftest dist <case_args>`.
    pub fn start(servers: u32, workers: u32, case_args: &[&str], env: &[(&str, &str)]) -> Job {
        let port = free_port();
        let base = job_env(port, servers, workers);
        let role = |role: &str, task: Option<u32>, args: &[&str]| {
            let mut cmd = synkv_command();
            cmd.args(args).envs(FAST).envs(env.iter().copied()).envs(base.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            cmd.env("DMLC_ROLE", role).env("SYNKV_LOG", "warn");
            if let Some(t) = task {
                cmd.env("DMLC_TASK_ID", t.to_string());
            }
            cmd
        };
        let scheduler = Proc::start("scheduler", role("scheduler", None, &["scheduler"]));
        let servers = (0..servers).map(|i| Proc::start(&format!("server {i}"), role("server", Some(i), &["server"]))).collect();
        let mut args = vec!["selftest", "dist"];
        args.extend_from_slice(case_args);
        let workers = (0..workers).map(|i| Proc::start(&format!("worker {i}"), role("worker", Some(i), &args))).collect();
        Job { scheduler, servers, workers }
    }

    /// Every process, scheduler first.
    pub fn all_mut(&mut self) -> impl Iterator<Item = &mut Proc> {
        std::iter::once(&mut self.scheduler).chain(self.servers.iter_mut()).chain(self.workers.iter_mut())
    }
}

/// A raw connection to a server (tests that speak the protocol by hand).
pub struct Raw {
    pub s: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    /// Connects to 127.0.0.1:`port`, with a 10 s read timeout.
    pub fn connect(port: u16) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the server");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Raw { s, buf: Vec::new() }
    }

    /// Connects and greets as a worker without a secret (a job without one), expecting `AuthOk`.
    pub fn open(port: u16) -> Raw {
        let mut raw = Raw::connect(port);
        let hello = Message::hello(synkv::ps::Role::Worker, &[]).encode_to_bytes(&Limits::default()).expect("a Hello");
        std::io::Write::write_all(&mut raw.s, &hello).expect("send the Hello");
        assert_eq!(raw.next().map(|m| m.command), Some(synkv::ps::proto::Command::AuthOk));
        raw
    }

    /// The next frame, or `None` once the server closed the connection.
    pub fn next(&mut self) -> Option<Message> {
        loop {
            if let Ok(Some(n)) = check(&self.buf, &Limits::default()) {
                let frame: Vec<u8> = self.buf.drain(..n).collect();
                return Some(parse(bytes::Bytes::from(frame), &Limits::default()).expect("a valid frame"));
            }
            let mut chunk = [0u8; 4096];
            match self.s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Every frame until the server closes the connection (bounded by the read timeout).
    pub fn until_close(&mut self) -> Vec<Message> {
        std::iter::from_fn(|| self.next()).collect()
    }
}

/// The `final …` line of every worker of a `synkv launch` output (the weights, printed exactly), sorted by rank.
pub fn finals(output: &str, workers: u32) -> Vec<String> {
    (0..workers)
        .map(|w| {
            let prefix = format!("[worker {w}] selftest ");
            let line = output.lines().find(|l| l.starts_with(&prefix) && l.contains(" final "));
            let line = line.unwrap_or_else(|| panic!("worker {w} printed no final weights:\n{output}"));
            line.split(" final ").nth(1).unwrap_or_default().to_owned()
        })
        .collect()
}
