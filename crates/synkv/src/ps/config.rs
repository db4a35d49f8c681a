//! [`Config`]: everything the distributed layer reads from the environment, read once at
//! start-up and passed down (never a global).
//!
//! MXNet's `DMLC_*` variables keep their meaning (spec K8.4); synkv's own are `SYNKV_*`. The
//! full table, with defaults and accepted forms, is in `docs/dist-env.md`. A missing or
//! malformed variable is a [`ConfigError`] naming the variable and the accepted form; the
//! value of `SYNKV_SECRET` is never quoted.
//!
//! `DMLC_INTERFACE` is accepted only as a loopback name (`lo`, `lo0`) for now: resolving a
//! NIC's address is not implemented, so other interfaces are refused with a hint to set
//! `DMLC_NODE_HOST`. Without either, nodes advertise `127.0.0.1`.

use std::collections::HashMap;
use std::time::Duration;

use super::auth::Secret;
use super::node::{Node, NodeId, Role};
use super::orchestrator::{self, Placement};
use super::proto::Limits;
use super::trace::{self, Rounds};
use super::ConfigError;

/// Whether `host` (a name or an address) denotes only loopback addresses: a literal loopback
/// address, or a name every address of which is one (e.g. `localhost`, or a host name Debian
/// maps to 127.0.1.1). A name that does not resolve is not.
fn is_loopback(host: &str) -> bool {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return ip.is_loopback();
    }
    match std::net::ToSocketAddrs::to_socket_addrs(&(host, 0)) {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

/// Most servers or workers a cluster may have (per role).
pub const MAX_NODES_PER_ROLE: u32 = 16_384;

/// Default `SYNKV_PARTITION_BYTES` (capped at `SYNKV_MAX_FRAME_BYTES / 8`): the best size on
/// one host, where every part costs CPU and none waits for a link.
pub const DEFAULT_PARTITION_BYTES: u64 = 16 << 20;

/// Default `SYNKV_PARTITION_BYTES` of a job its launcher knows to span hosts (torchrun, Slurm
/// or MPI with more than one node, `synkv launch --hosts` with more than one host): parts this
/// small let a pushpull's answers travel while its later parts are pushed (4+4 hosts at
/// 1 Gbit/s, 16M f32: 632 ms with 1 MiB parts, 1174 ms with 16 MiB; BENCHMARKS.md).
pub const CROSS_HOST_PARTITION_BYTES: u64 = 1 << 20;

/// Connections a worker opens, unless `SYNKV_STREAMS` says, to a server on its own host that
/// it reaches over TCP: one loopback stream leaves part of the path unused while its sender and
/// receiver take turns (16M push+pull, one worker of two over TCP to the other's hosted server:
/// 36–38 ms with two streams, 41–43 with one; BENCHMARKS.md, 2026-12-07 afternoon).
pub const LOOPBACK_STREAMS: u32 = 2;

/// Settings of one distributed process.
#[derive(Clone, Debug)]
pub struct Config {
    /// `DMLC_ROLE` (unset means worker, as in MXNet).
    pub role: Role,
    /// `DMLC_PS_ROOT_URI`: the scheduler's host.
    pub root_uri: String,
    /// `DMLC_PS_ROOT_PORT`: the scheduler's port.
    pub root_port: u16,
    /// `DMLC_NUM_SERVER`.
    pub num_servers: u32,
    /// `DMLC_NUM_WORKER`.
    pub num_workers: u32,
    /// The host this node binds and advertises (`DMLC_NODE_HOST`, or from `DMLC_INTERFACE`).
    pub node_host: String,
    /// `PORT`: the port this node listens on (ps-lite's name); `None` = any free port.
    pub port: Option<u16>,
    /// `DMLC_TASK_ID`: the launcher's index for this node, used for ranks when complete.
    pub task_id: Option<u32>,
    /// `MXNET_KVSTORE_BIGARRAY_BOUND`: element count from which a key is split across servers.
    pub bigarray_bound: u64,
    /// `SYNKV_SECRET`: shared secret for authentication; `None` = no authentication (allowed
    /// only on loopback addresses, or with `SYNKV_INSECURE=1`: see [`Config::check_listen`]).
    pub secret: Option<Secret>,
    /// `SYNKV_INSECURE=1`: listen on network addresses without a secret (warned about).
    pub insecure: bool,
    /// `SYNKV_HEARTBEAT_INTERVAL_MS`.
    pub heartbeat_interval: Duration,
    /// `SYNKV_HEARTBEAT_TIMEOUT_MS`: silence after which a node is declared dead.
    pub heartbeat_timeout: Duration,
    /// `SYNKV_TIMEOUT_MS`: deadline of every other blocking wait (rendezvous, barriers…).
    pub timeout: Duration,
    /// Frame limits; `max_frame_bytes` from `SYNKV_MAX_FRAME_BYTES`.
    pub limits: Limits,
    /// `SYNKV_STRAGGLER_WARN_MS`: how long a sync round may wait for a worker before the wait
    /// is reported (and again after each further such interval). Never an error.
    pub straggler_warn: Duration,
    /// `SYNKV_PARTITION_BYTES`: the largest key part a server holds as one entry and a
    /// message carries at once (at most `SYNKV_MAX_FRAME_BYTES / 8`). Every memory budget
    /// derives from it (see [`Config::ingress_bytes`] and the others).
    pub partition_bytes: u64,
    /// Whether `partition_bytes` is the default (`SYNKV_PARTITION_BYTES` unset), which the
    /// worker checks against the job's hosts ([`Config::partition_hint`]).
    pub partition_bytes_default: bool,
    /// `SYNKV_CHECKPOINT_DIR`: where checkpoints are written and, at start, restored from.
    pub checkpoint_dir: Option<std::path::PathBuf>,
    /// `SYNKV_CHECKPOINT_INTERVAL`: take a checkpoint every so many rounds (`push` calls) or
    /// seconds; `None` = only on demand.
    pub checkpoint_interval: Option<CheckpointInterval>,
    /// `SYNKV_SERVER_REPLICAS`: backup copies of every partition on other servers (0 or 1).
    /// With 1, a dead server's partitions move to their backups and the job goes on.
    pub replicas: u32,
    /// `SYNKV_SERVER_THREADS`: threads a server's update work may use (the sums and optimizer
    /// steps of the rounds one request completes, `ps/server/partition/batch.rs`, and the
    /// kernels' split of large arrays); `None` (the default) = one per core, 1 = all on the
    /// server's core thread.
    pub server_threads: Option<u32>,
    /// `SYNKV_TCP_CONGESTION`: the TCP congestion control of this process's sockets (`cubic`,
    /// `bbr`, `reno`…); `None` = the host's default. Checked against the kernel when read.
    pub tcp_congestion: Option<String>,
    /// `SYNKV_SOCKET_BUFFER`: SO_SNDBUF and SO_RCVBUF of this process's TCP sockets, in bytes;
    /// `None` (the default) leaves them to the kernel's autotuning (`transport/tcp.rs`).
    pub socket_buffer: Option<u32>,
    /// `SYNKV_SHM` (default 1): a worker offers each server a shared-memory segment for the
    /// bulk bytes of data frames; a server on the same host maps it and offers its own.
    pub shm: bool,
    /// `SYNKV_SHM_BYTES`: each segment's size (default 16 partitions); pages are used as
    /// needed, a chunk that does not fit travels on the connection.
    pub shm_bytes: u64,
    /// `SYNKV_PULL_BACK` (default 1): in a sync store, a push of a key that this worker pulls
    /// after pushing asks for the updated value back with its acknowledgement, and the pull
    /// is answered from it without another round trip (`store::distributed::held`); 0 turns
    /// it off (a pull always asks the servers).
    pub pull_back: bool,
    /// `SYNKV_STREAMS` (1..=8): connections a worker opens to each server; its requests to
    /// that server take turns on them, so the kernel's copies of several streams run side by
    /// side (one loopback stream moved 2.5–3.0 GB/s here, two 3.2–3.3). Unset (`None`):
    /// [`LOOPBACK_STREAMS`] to a server on this host that the worker reaches over TCP (not
    /// through shared memory), one to every other server — on a network link more flows
    /// only share it less evenly (BENCHMARKS.md, 2026-12-07 afternoon).
    pub streams: Option<u32>,
    /// `SYNKV_WORKER_RESTARTS`: a dead worker may be restarted (`synkv launch
    /// --max-restarts`): its death does not end the job; rounds and barriers stop waiting for
    /// it until a new process takes its rank.
    pub worker_restarts: bool,
    /// What this process hosts besides its worker, when an orchestrator (torchrun, Slurm,
    /// MPI…) started it ([`Config::from_worker_env`]); `None` in a `DMLC_*` launch.
    pub placement: Option<Placement>,
    /// `SYNKV_TRACE_DIR`, `SYNKV_TRACE_ROUNDS`, `SYNKV_TRACE_EVENTS`,
    /// `SYNKV_FLIGHT_RECORDER`: the trace timeline and the flight recorder (`ps::trace`).
    pub trace: trace::Settings,
}

/// How often the workers take a checkpoint (`SYNKV_CHECKPOINT_INTERVAL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointInterval {
    /// Every `n` rounds: `push` calls of each worker (`N`).
    Rounds(u64),
    /// About every so many seconds (`Ns`), at a round agreed by the workers.
    Seconds(Duration),
}

/// Reads one variable: `Ok(None)` when unset, an error when it cannot be read (not UTF-8).
pub type Lookup<'a> = dyn Fn(&'static str) -> Result<Option<String>, ConfigError> + 'a;

fn env_lookup(var: &'static str) -> Result<Option<String>, ConfigError> {
    match std::env::var(var) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(err(var, "is not valid UTF-8", "a UTF-8 value")),
    }
}

fn err(var: &'static str, problem: impl Into<String>, expected: &'static str) -> ConfigError {
    ConfigError { var, problem: problem.into(), expected }
}

fn required(get: &Lookup<'_>, var: &'static str, expected: &'static str) -> Result<String, ConfigError> {
    match get(var)? {
        Some(v) if !v.trim().is_empty() => Ok(v.trim().to_owned()),
        Some(_) => Err(err(var, "is empty", expected)),
        None => Err(err(var, "is not set", expected)),
    }
}

fn number<T: std::str::FromStr + PartialOrd + Copy>(
    get: &Lookup<'_>,
    var: &'static str,
    default: Option<T>,
    range: (T, T),
    expected: &'static str,
) -> Result<Option<T>, ConfigError> {
    let Some(raw) = get(var)? else { return Ok(default) };
    match raw.trim().parse::<T>() {
        Ok(v) if v >= range.0 && v <= range.1 => Ok(Some(v)),
        _ => Err(err(var, format!("{raw:?} is not accepted"), expected)),
    }
}

fn millis(get: &Lookup<'_>, var: &'static str, default: u64, expected: &'static str) -> Result<Duration, ConfigError> {
    let ms = number(get, var, Some(default), (1, 86_400_000), expected)?.unwrap_or(default);
    Ok(Duration::from_millis(ms))
}

/// `SYNKV_TCP_CONGESTION`: a name the kernel accepts for this process's sockets (tried on a
/// fresh socket here, so a typo or a refused algorithm stops the process at start, not at its
/// first connection).
fn tcp_congestion(get: &Lookup<'_>) -> Result<Option<String>, ConfigError> {
    const VAR: &str = "SYNKV_TCP_CONGESTION";
    const EXPECTED: &str =
        "a TCP congestion control the kernel offers, e.g. cubic, reno or bbr (see /proc/sys/net/ipv4/tcp_allowed_congestion_control)";
    let Some(raw) = get(VAR)? else { return Ok(None) };
    let name = raw.trim();
    if name.is_empty() {
        return Ok(None);
    }
    // The kernel's names: at most 15 bytes (TCP_CA_NAME_MAX 16 with the NUL).
    if name.len() > 15 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(err(VAR, format!("{raw:?} is not a congestion control name"), EXPECTED));
    }
    crate::ps::transport::check_congestion(name).map_err(|problem| err(VAR, problem, EXPECTED))?;
    Ok(Some(name.to_owned()))
}

/// The trace and flight-recorder variables (`ps::trace`).
fn trace_settings(get: &Lookup<'_>) -> Result<trace::Settings, ConfigError> {
    let dir = get("SYNKV_TRACE_DIR")?.filter(|d| !d.trim().is_empty()).map(|d| std::path::PathBuf::from(d.trim()));
    let rounds_expected = "START:END (rounds START <= r < END), START: or :END, with SYNKV_TRACE_DIR set";
    let rounds = match get("SYNKV_TRACE_ROUNDS")? {
        None => Rounds::ALL,
        Some(raw) => {
            let Some(rounds) = Rounds::parse(&raw) else {
                return Err(err("SYNKV_TRACE_ROUNDS", format!("{raw:?} is not accepted"), rounds_expected));
            };
            if dir.is_none() {
                return Err(err("SYNKV_TRACE_ROUNDS", "is set but SYNKV_TRACE_DIR is not", rounds_expected));
            }
            rounds
        }
    };
    let events = number::<usize>(get, "SYNKV_TRACE_EVENTS", Some(trace::DEFAULT_TRACE_EVENTS), (1, 100_000_000), "spans in 1..=100000000")?
        .unwrap_or(trace::DEFAULT_TRACE_EVENTS);
    let flight = number::<usize>(
        get,
        "SYNKV_FLIGHT_RECORDER",
        Some(trace::DEFAULT_FLIGHT_OPS),
        (0, 1_000_000),
        "operations in 0..=1000000 (0 = off)",
    )?
    .unwrap_or(trace::DEFAULT_FLIGHT_OPS);
    Ok(trace::Settings { dir, rounds, events, flight })
}

impl Config {
    /// The most connections a worker opens to one server (`SYNKV_STREAMS`, or
    /// [`LOOPBACK_STREAMS`] when unset): what a server allows per worker.
    pub fn max_streams(&self) -> u32 {
        self.streams.unwrap_or(LOOPBACK_STREAMS).max(1)
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(&env_lookup)
    }

    /// Reads from a map of variables (for tests and launchers).
    pub fn from_map<K: AsRef<str>, V: AsRef<str>>(vars: impl IntoIterator<Item = (K, V)>) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars.into_iter().map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned())).collect();
        Config::from_lookup(&|var| Ok(map.get(var).cloned()))
    }

    fn from_lookup(get: &Lookup<'_>) -> Result<Config, ConfigError> {
        Config::from_lookup_with(get, DEFAULT_PARTITION_BYTES)
    }

    /// [`Config::from_lookup`] with `default_partition` for an unset `SYNKV_PARTITION_BYTES`.
    fn from_lookup_with(get: &Lookup<'_>, default_partition: u64) -> Result<Config, ConfigError> {
        let role = match get("DMLC_ROLE")? {
            None => Role::Worker,
            Some(r) => r.trim().parse().map_err(|_| err("DMLC_ROLE", format!("{r:?} is not a role"), "scheduler, server or worker"))?,
        };
        let root_uri = required(get, "DMLC_PS_ROOT_URI", "the scheduler's host name or IP address, e.g. 127.0.0.1")?;
        let root_port = number::<u16>(get, "DMLC_PS_ROOT_PORT", None, (1, u16::MAX), "a port number in 1..=65535")?
            .ok_or_else(|| err("DMLC_PS_ROOT_PORT", "is not set", "a port number in 1..=65535"))?;
        let count = |var| {
            number::<u32>(get, var, None, (1, MAX_NODES_PER_ROLE), "an integer in 1..=16384")?
                .ok_or_else(|| err(var, "is not set", "an integer in 1..=16384"))
        };
        let num_servers = count("DMLC_NUM_SERVER")?;
        let num_workers = count("DMLC_NUM_WORKER")?;
        let node_host = match (get("DMLC_NODE_HOST")?, get("DMLC_INTERFACE")?) {
            (Some(h), _) if h.trim().is_empty() || h.trim().contains(char::is_whitespace) => {
                return Err(err("DMLC_NODE_HOST", format!("{h:?} is not a host"), "a host name or IP address without spaces"))
            }
            (Some(h), _) => h.trim().to_owned(),
            (None, Some(i)) if matches!(i.trim(), "lo" | "lo0") => "127.0.0.1".to_owned(),
            (None, Some(i)) => {
                return Err(err(
                    "DMLC_INTERFACE",
                    format!("interface {i:?} cannot be resolved yet"),
                    "lo (or lo0), or unset it and set DMLC_NODE_HOST to the address to advertise",
                ))
            }
            (None, None) => "127.0.0.1".to_owned(),
        };
        let port = number::<u16>(get, "PORT", None, (1, u16::MAX), "a port number in 1..=65535")?;
        let task_id = number::<u32>(get, "DMLC_TASK_ID", None, (0, u32::MAX - 1), "a non-negative integer")?;
        let bigarray_bound =
            number::<u64>(get, "MXNET_KVSTORE_BIGARRAY_BOUND", Some(1_000_000), (1, u64::MAX), "a positive element count")?
                .unwrap_or(1_000_000);
        let secret = match get("SYNKV_SECRET")? {
            None => None,
            // Never quote the value.
            Some(s) => {
                Some(Secret::new(s).ok_or_else(|| err("SYNKV_SECRET", "is set but empty", "a non-empty shared secret (or unset it)"))?)
            }
        };
        let insecure = number::<u32>(get, "SYNKV_INSECURE", Some(0), (0, 1), "0 or 1")?.unwrap_or(0) == 1;
        let heartbeat_interval = millis(get, "SYNKV_HEARTBEAT_INTERVAL_MS", 1_000, "milliseconds in 1..=86400000")?;
        let heartbeat_timeout = millis(get, "SYNKV_HEARTBEAT_TIMEOUT_MS", 10_000, "milliseconds in 1..=86400000")?;
        if heartbeat_timeout <= heartbeat_interval {
            return Err(err(
                "SYNKV_HEARTBEAT_TIMEOUT_MS",
                format!("{} ms is not above the heartbeat interval ({} ms)", heartbeat_timeout.as_millis(), heartbeat_interval.as_millis()),
                "milliseconds greater than SYNKV_HEARTBEAT_INTERVAL_MS",
            ));
        }
        let timeout = millis(get, "SYNKV_TIMEOUT_MS", 120_000, "milliseconds in 1..=86400000")?;
        let defaults = Limits::default();
        let max_frame_bytes = number::<u64>(
            get,
            "SYNKV_MAX_FRAME_BYTES",
            Some(defaults.max_frame_bytes),
            (64 << 10, 64 << 30),
            "bytes in 65536..=68719476736",
        )?
        .unwrap_or(defaults.max_frame_bytes);
        let straggler_warn = millis(get, "SYNKV_STRAGGLER_WARN_MS", 60_000, "milliseconds in 1..=86400000")?;
        let partition_cap = max_frame_bytes / 8;
        let partition_bytes =
            match number::<u64>(get, "SYNKV_PARTITION_BYTES", None, (4 << 10, 1 << 40), "bytes in 4096..=SYNKV_MAX_FRAME_BYTES/8")? {
                None => default_partition.min(partition_cap),
                Some(p) if p <= partition_cap => p,
                Some(p) => {
                    return Err(err(
                        "SYNKV_PARTITION_BYTES",
                        format!(
                            "{p} is above SYNKV_MAX_FRAME_BYTES / 8 = {partition_cap} (an optimizer state of a part must fit in a frame)"
                        ),
                        "bytes in 4096..=SYNKV_MAX_FRAME_BYTES/8",
                    ))
                }
            };
        let partition_bytes_default = get("SYNKV_PARTITION_BYTES")?.is_none();
        let partition_bytes = partition_bytes.max(4 << 10) & !7;
        let checkpoint_dir = get("SYNKV_CHECKPOINT_DIR")?.filter(|d| !d.trim().is_empty()).map(|d| std::path::PathBuf::from(d.trim()));
        let interval_expected = "a positive number of rounds (e.g. 500) or seconds (e.g. 600s), with SYNKV_CHECKPOINT_DIR set";
        let checkpoint_interval = match get("SYNKV_CHECKPOINT_INTERVAL")? {
            None => None,
            Some(raw) => {
                let v = raw.trim();
                let parsed = match v.strip_suffix('s') {
                    Some(secs) => {
                        secs.trim().parse::<u64>().ok().filter(|s| *s > 0).map(|s| CheckpointInterval::Seconds(Duration::from_secs(s)))
                    }
                    None => v.parse::<u64>().ok().filter(|n| *n > 0).map(CheckpointInterval::Rounds),
                };
                let Some(parsed) = parsed else {
                    return Err(err("SYNKV_CHECKPOINT_INTERVAL", format!("{raw:?} is not accepted"), interval_expected));
                };
                if checkpoint_dir.is_none() {
                    return Err(err("SYNKV_CHECKPOINT_INTERVAL", "is set but SYNKV_CHECKPOINT_DIR is not", interval_expected));
                }
                Some(parsed)
            }
        };
        let replicas = number::<u32>(get, "SYNKV_SERVER_REPLICAS", Some(0), (0, 1), "0 or 1")?.unwrap_or(0);
        if replicas > 0 && num_servers < 2 {
            return Err(err(
                "SYNKV_SERVER_REPLICAS",
                format!("{replicas} needs another server to keep the copy, but DMLC_NUM_SERVER is {num_servers}"),
                "0, or at least 2 servers",
            ));
        }
        let server_threads = number::<u32>(get, "SYNKV_SERVER_THREADS", None, (1, 1024), "threads in 1..=1024")?;
        let tcp_congestion = tcp_congestion(get)?;
        let socket_buffer = number::<u32>(get, "SYNKV_SOCKET_BUFFER", None, (4096, 1 << 30), "bytes in 4096..=1073741824")?;
        let shm = number::<u32>(get, "SYNKV_SHM", Some(1), (0, 1), "0 or 1")?.unwrap_or(1) == 1;
        let shm_bytes = number::<u64>(get, "SYNKV_SHM_BYTES", None, (1 << 20, 1 << 40), "bytes in 1048576..=1099511627776")?
            .unwrap_or_else(|| (16 * partition_bytes).clamp(64 << 20, 4 << 30));
        let pull_back = number::<u32>(get, "SYNKV_PULL_BACK", Some(1), (0, 1), "0 or 1")?.unwrap_or(1) == 1;
        let streams = number::<u32>(get, "SYNKV_STREAMS", None, (1, 8), "connections in 1..=8")?;
        let worker_restarts = number::<u32>(get, "SYNKV_WORKER_RESTARTS", Some(0), (0, 1), "0 or 1")?.unwrap_or(0) == 1;
        let trace = trace_settings(get)?;
        Ok(Config {
            role,
            root_uri,
            root_port,
            num_servers,
            num_workers,
            node_host,
            port,
            task_id,
            bigarray_bound,
            secret,
            insecure,
            heartbeat_interval,
            heartbeat_timeout,
            timeout,
            limits: Limits { max_frame_bytes, ..defaults },
            straggler_warn,
            partition_bytes,
            partition_bytes_default,
            checkpoint_dir,
            checkpoint_interval,
            replicas,
            server_threads,
            tcp_congestion,
            socket_buffer,
            shm,
            shm_bytes,
            pull_back,
            streams,
            worker_restarts,
            placement: None,
            trace,
        })
    }

    /// Reads a worker process's environment: exactly [`Config::from_env`] when
    /// `DMLC_PS_ROOT_URI` is set; otherwise, if an orchestrator started the process (torchrun,
    /// Slurm, MPI, `SYNKV_RANK`…), its variables decide the cluster and what this process
    /// hosts ([`orchestrator`], [`Config::placement`]) and the rest is read as usual.
    pub fn from_worker_env() -> Result<Config, ConfigError> {
        Config::from_worker_lookup(&env_lookup, &orchestrator::hostname)
    }

    /// [`Config::from_worker_env`] over a map of variables and a fixed host name (tests).
    pub fn from_worker_map<K: AsRef<str>, V: AsRef<str>>(
        vars: impl IntoIterator<Item = (K, V)>,
        hostname: Option<&str>,
    ) -> Result<Config, ConfigError> {
        let map: HashMap<String, String> = vars.into_iter().map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned())).collect();
        let host = hostname.map(str::to_owned);
        Config::from_worker_lookup(&|var| Ok(map.get(var).cloned()), &|| host.clone())
    }

    fn from_worker_lookup(get: &Lookup<'_>, hostname: &dyn Fn() -> Option<String>) -> Result<Config, ConfigError> {
        let Some(launch) = orchestrator::detect(get, hostname)? else {
            if get("DMLC_PS_ROOT_URI")?.is_none() {
                return Err(err(
                    "DMLC_PS_ROOT_URI",
                    "is not set, and no launcher's variables were found (SYNKV_RANK, torchrun's RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID)",
                    "the scheduler's host with the other DMLC_* variables (synkv launch sets them), or a start by torchrun, srun or mpirun, or SYNKV_RANK and SYNKV_WORLD_SIZE",
                ));
            }
            return Config::from_lookup(get);
        };
        let overlay = launch.dmlc_vars();
        // Every process of the launch sees the same node count, so all pick the same parts.
        let parts = if launch.num_nodes() > 1 { CROSS_HOST_PARTITION_BYTES } else { DEFAULT_PARTITION_BYTES };
        let config = Config::from_lookup_with(
            &|var| match overlay.iter().find(|(k, _)| *k == var) {
                Some((_, v)) => Ok(Some(v.clone())),
                // `PORT` is a common variable on container platforms; hosted servers take any free port.
                None if var == "PORT" => Ok(None),
                None => get(var),
            },
            parts,
        )?;
        Ok(Config { placement: Some(launch.placement()), ..config })
    }

    /// A warning for a job started by hand (`DMLC_*`, no launcher that knows the hosts) whose
    /// servers are on other hosts than this worker (`my_host`) while the part size is the
    /// one-host default: such parts do not pipeline across a network.
    pub fn partition_hint<'a>(&self, my_host: &str, server_hosts: impl IntoIterator<Item = &'a str>) -> Option<String> {
        if !(self.partition_bytes_default && self.placement.is_none() && self.partition_bytes == DEFAULT_PARTITION_BYTES) {
            return None;
        }
        let elsewhere = server_hosts.into_iter().find(|h| *h != my_host && !(is_loopback(h) && is_loopback(my_host)))?;
        Some(format!(
            "this worker ({my_host}) and a server ({elsewhere}) are on different hosts, and SYNKV_PARTITION_BYTES is unset: \
                 keys travel in parts of 16 MiB, the size for one host, which do not pipeline across a network (4+4 hosts at \
                 1 Gbit/s, 16M f32: 1174 ms against 632 ms with 1 MiB parts); set SYNKV_PARTITION_BYTES=1048576 on every \
                 process (launchers that know the hosts do: synkv launch --hosts, torchrun, Slurm, MPI)"
        ))
    }

    /// A server's budget of received, unprocessed frame bytes, shared by all its connections
    /// (4 partitions): past it, its connections stop reading and TCP pushes back.
    pub fn ingress_bytes(&self) -> u64 {
        4 * self.partition_bytes
    }

    /// A server's budget of pushes held unsummed across every key (4 partitions); past it,
    /// pushes are folded into each key's accumulator on arrival.
    pub fn held_bytes(&self) -> u64 {
        4 * self.partition_bytes
    }

    /// A worker's bound on the bytes of its requests and their expected replies in flight to
    /// one server (4 partitions; a single larger request goes alone).
    pub fn window_bytes(&self) -> u64 {
        4 * self.partition_bytes
    }

    /// The soft bound on one connection's unread replies on a server (8 partitions): past it,
    /// the server reads no more of that worker's requests until it has read its answers.
    pub fn outbox_bytes(&self) -> u64 {
        8 * self.partition_bytes
    }

    /// Whether this node may listen on `host`: without a secret only on a loopback address,
    /// unless `SYNKV_INSECURE=1` (then with a warning). Warns about a secret short enough to
    /// be guessed offline from a recorded handshake.
    pub fn check_listen(&self, host: &str) -> std::result::Result<(), ConfigError> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let loopback = is_loopback(host);
        match (&self.secret, loopback, self.insecure) {
            (Some(secret), _, _) => {
                if secret.is_weak() {
                    tracing::warn!(
                        "SYNKV_SECRET is shorter than {} characters: anyone who records a handshake can try to guess it offline; use a random one (synkv launch generates 64 hex digits)",
                        super::auth::WEAK_SECRET_LEN
                    );
                }
                Ok(())
            }
            (None, true, _) => Ok(()),
            (None, false, true) => {
                tracing::warn!(
                    "SYNKV_INSECURE=1: the {} listens on {host} without authentication; anyone who can reach it can read and overwrite every value",
                    self.role
                );
                Ok(())
            }
            (None, false, false) => Err(err(
                "SYNKV_SECRET",
                format!("is not set, and this {} would listen on {host}, which other machines can reach", self.role),
                "the same secret on every node of the job (synkv launch generates one), or SYNKV_INSECURE=1 to run without authentication on a trusted network",
            )),
        }
    }

    /// The scheduler's `host:port`.
    pub fn root_addr(&self) -> String {
        if self.root_uri.contains(':') {
            format!("[{}]:{}", self.root_uri, self.root_port)
        } else {
            format!("{}:{}", self.root_uri, self.root_port)
        }
    }

    /// The scheduler as a node (id 1, rank 0, at `DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT`).
    pub fn scheduler_node(&self) -> Node {
        Node {
            role: Role::Scheduler,
            id: NodeId::SCHEDULER,
            rank: Some(0),
            host: self.root_uri.clone(),
            port: self.root_port,
            task_id: None,
        }
    }

    /// Servers plus workers (the nodes that register with the scheduler).
    pub fn num_nodes(&self) -> u32 {
        self.num_servers + self.num_workers
    }

    /// The same settings for another role and task id (launchers, tests).
    #[must_use]
    pub fn for_node(&self, role: Role, task_id: Option<u32>) -> Config {
        Config { role, task_id, ..self.clone() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Vec<(&'static str, &'static str)> {
        vec![("DMLC_PS_ROOT_URI", "127.0.0.1"), ("DMLC_PS_ROOT_PORT", "9091"), ("DMLC_NUM_SERVER", "2"), ("DMLC_NUM_WORKER", "3")]
    }

    fn with(extra: &[(&'static str, &'static str)]) -> Result<Config, ConfigError> {
        let mut vars = base();
        vars.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
        vars.extend(extra.iter().filter(|(_, v)| *v != "<unset>"));
        Config::from_map(vars)
    }

    #[test]
    fn defaults() {
        let c = with(&[]).unwrap();
        assert_eq!(c.role, Role::Worker);
        assert_eq!(c.root_addr(), "127.0.0.1:9091");
        assert_eq!((c.num_servers, c.num_workers, c.num_nodes()), (2, 3, 5));
        assert_eq!(c.node_host, "127.0.0.1");
        assert_eq!(c.bigarray_bound, 1_000_000);
        assert_eq!(c.heartbeat_interval, Duration::from_secs(1));
        assert_eq!(c.heartbeat_timeout, Duration::from_secs(10));
        assert_eq!(c.timeout, Duration::from_secs(120));
        assert_eq!(c.limits.max_frame_bytes, 1 << 30);
        assert_eq!(c.straggler_warn, Duration::from_secs(60));
        assert_eq!(c.partition_bytes, 16 << 20);
        assert!(c.secret.is_none() && c.task_id.is_none() && c.port.is_none());
        assert_eq!(c.trace, trace::Settings::default());
        assert_eq!((c.trace.dir, c.trace.flight), (None, 256));
    }

    #[test]
    fn trace_variables_are_read() {
        let c = with(&[
            ("SYNKV_TRACE_DIR", "/tmp/t"),
            ("SYNKV_TRACE_ROUNDS", "10:20"),
            ("SYNKV_TRACE_EVENTS", "1000"),
            ("SYNKV_FLIGHT_RECORDER", "0"),
        ])
        .unwrap();
        let want = trace::Settings { dir: Some("/tmp/t".into()), rounds: Rounds { start: 10, end: Some(20) }, events: 1000, flight: 0 };
        assert_eq!(c.trace, want);
        let e = with(&[("SYNKV_TRACE_ROUNDS", "10:20")]).unwrap_err();
        assert!(e.to_string().contains("SYNKV_TRACE_DIR is not"), "{e}");
    }

    #[test]
    fn every_variable_is_read() {
        let c = with(&[
            ("DMLC_ROLE", "server"),
            ("DMLC_NODE_HOST", "node7"),
            ("DMLC_TASK_ID", "4"),
            ("PORT", "5000"),
            ("MXNET_KVSTORE_BIGARRAY_BOUND", "10"),
            ("SYNKV_SECRET", "s3cret"),
            ("SYNKV_HEARTBEAT_INTERVAL_MS", "50"),
            ("SYNKV_HEARTBEAT_TIMEOUT_MS", "200"),
            ("SYNKV_TIMEOUT_MS", "3000"),
            ("SYNKV_MAX_FRAME_BYTES", "1048576"),
            ("SYNKV_STRAGGLER_WARN_MS", "2500"),
            ("SYNKV_PARTITION_BYTES", "65536"),
            ("SYNKV_SERVER_THREADS", "3"),
            ("SYNKV_TCP_CONGESTION", " reno "),
            ("SYNKV_SOCKET_BUFFER", "1048576"),
            ("SYNKV_STREAMS", "3"),
        ])
        .unwrap();
        assert_eq!((c.socket_buffer, c.streams, c.max_streams()), (Some(1 << 20), Some(3), 3));
        assert_eq!((c.straggler_warn.as_millis(), c.partition_bytes), (2500, 65536));
        assert_eq!(c.server_threads, Some(3));
        assert_eq!(c.tcp_congestion.as_deref(), Some("reno"));
        assert_eq!(c.role, Role::Server);
        assert_eq!(c.node_host, "node7");
        assert_eq!((c.task_id, c.port, c.bigarray_bound), (Some(4), Some(5000), 10));
        assert_eq!(c.secret, Secret::new("s3cret"));
        assert_eq!((c.heartbeat_interval.as_millis(), c.heartbeat_timeout.as_millis(), c.timeout.as_millis()), (50, 200, 3000));
        assert_eq!(c.limits.max_frame_bytes, 1 << 20);
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn the_partition_bound_follows_a_small_frame_limit() {
        let c = with(&[("SYNKV_MAX_FRAME_BYTES", "65536")]).unwrap();
        assert_eq!(c.partition_bytes, 8192);
        assert_eq!((c.ingress_bytes(), c.held_bytes(), c.window_bytes(), c.outbox_bytes()), (32768, 32768, 32768, 65536));
    }

    #[test]
    fn interface_lo_means_loopback_and_others_are_refused() {
        assert_eq!(with(&[("DMLC_INTERFACE", "lo")]).unwrap().node_host, "127.0.0.1");
        let e = with(&[("DMLC_INTERFACE", "eth0")]).unwrap_err();
        assert_eq!(e.var, "DMLC_INTERFACE");
        assert!(e.to_string().contains("DMLC_NODE_HOST"));
        assert_eq!(with(&[("DMLC_INTERFACE", "eth0"), ("DMLC_NODE_HOST", "10.0.0.1")]).unwrap().node_host, "10.0.0.1");
    }

    #[test]
    fn each_bad_variable_is_named() {
        let cases: &[(&'static str, &'static str)] = &[
            ("DMLC_ROLE", "boss"),
            ("DMLC_PS_ROOT_URI", "<unset>"),
            ("DMLC_PS_ROOT_URI", " "),
            ("DMLC_PS_ROOT_PORT", "<unset>"),
            ("DMLC_PS_ROOT_PORT", "0"),
            ("DMLC_PS_ROOT_PORT", "70000"),
            ("DMLC_NUM_SERVER", "<unset>"),
            ("DMLC_NUM_SERVER", "0"),
            ("DMLC_NUM_WORKER", "-1"),
            ("DMLC_NUM_WORKER", "many"),
            ("DMLC_NODE_HOST", "a b"),
            ("DMLC_TASK_ID", "-3"),
            ("PORT", "x"),
            ("MXNET_KVSTORE_BIGARRAY_BOUND", "0"),
            ("SYNKV_SECRET", ""),
            ("SYNKV_HEARTBEAT_INTERVAL_MS", "0"),
            ("SYNKV_HEARTBEAT_TIMEOUT_MS", "1000"),
            ("SYNKV_TIMEOUT_MS", "soon"),
            ("SYNKV_MAX_FRAME_BYTES", "10"),
            ("SYNKV_STRAGGLER_WARN_MS", "0"),
            ("SYNKV_PARTITION_BYTES", "100"),
            ("SYNKV_PARTITION_BYTES", "268435456"),
            ("SYNKV_SERVER_THREADS", "0"),
            ("SYNKV_SERVER_THREADS", "all"),
            ("SYNKV_TCP_CONGESTION", "no_such_cc"),
            ("SYNKV_TCP_CONGESTION", "cubic;reboot"),
            ("SYNKV_TCP_CONGESTION", "a_name_longer_than_15"),
            ("SYNKV_SOCKET_BUFFER", "1024"),
            ("SYNKV_SOCKET_BUFFER", "4M"),
            ("SYNKV_STREAMS", "0"),
            ("SYNKV_STREAMS", "9"),
            ("SYNKV_TRACE_ROUNDS", "5:2"),
            ("SYNKV_TRACE_EVENTS", "0"),
            ("SYNKV_FLIGHT_RECORDER", "many"),
        ];
        for (var, value) in cases {
            let e = with(&[(var, value)]).unwrap_err();
            assert_eq!(&e.var, var, "{var}={value}: {e}");
            assert!(e.to_string().starts_with(var) && e.to_string().contains("expected"), "{e}");
        }
    }

    #[test]
    fn socket_buffers_and_streams_are_left_to_the_kernel_and_the_place_by_default() {
        let default = with(&[]).unwrap();
        assert_eq!((default.socket_buffer, default.streams, default.max_streams()), (None, None, 2), "autotuned; streams by place");
    }

    #[test]
    fn a_hand_started_job_across_hosts_with_the_default_parts_is_warned_about() {
        let default = with(&[]).unwrap();
        let hint = default.partition_hint("10.0.0.1", ["10.0.0.1", "10.0.0.2"]).unwrap();
        assert!(hint.contains("10.0.0.2") && hint.contains("SYNKV_PARTITION_BYTES=1048576"), "{hint}");
        assert_eq!(default.partition_hint("10.0.0.1", ["10.0.0.1"]), None, "one host");
        assert_eq!(default.partition_hint("127.0.0.1", ["localhost", "127.0.0.1"]), None, "loopback, named two ways");
        let set = with(&[("SYNKV_PARTITION_BYTES", "16777216")]).unwrap();
        assert_eq!(set.partition_hint("10.0.0.1", ["10.0.0.2"]), None, "the size was chosen");
        let launched =
            Config::from_worker_map([("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2"), ("LOCAL_RANK", "0")], None).unwrap();
        assert_eq!(launched.partition_hint("10.0.0.1", ["10.0.0.2"]), None, "a launcher chose it");
    }
}
