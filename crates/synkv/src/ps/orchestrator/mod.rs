//! A worker process's place in the cluster, derived from the orchestrator that started it:
//! torchrun (and Kubeflow's PyTorchJob), Open MPI's `mpirun`, a PMI launcher (MPICH's or Intel
//! MPI's `mpiexec`), Slurm's `srun`, or synkv's own `SYNKV_RANK`/`SYNKV_WORLD_SIZE`.
//!
//! Under those launchers every process runs the same training script: all of them are workers,
//! and nobody starts `synkv scheduler` or `synkv server`. So the worker processes host those
//! roles themselves. [`detect`] is consulted only when `DMLC_PS_ROOT_URI` is **not** set — a
//! job started with MXNet's variables (`synkv launch`, hand-made scripts) is read exactly as
//! before — and returns a [`Launch`]: where this process stands and the equivalent `DMLC_*`
//! variables, which [`Config::from_worker_env`](super::Config::from_worker_env) lays over the
//! real environment before parsing it as usual.
//!
//! ## Sources, first present wins
//! 1. `SYNKV_RANK`, `SYNKV_WORLD_SIZE` (+ `SYNKV_LOCAL_RANK`, `SYNKV_LOCAL_WORLD_SIZE`);
//! 2. torchrun / Kubeflow: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//!    `MASTER_ADDR`, `MASTER_PORT`; without `RANK`, Kubeflow's `PET_NODE_RANK`, `PET_NNODES`,
//!    `PET_NPROC_PER_NODE` (must be 1: more processes per pod are torchrun's), `PET_MASTER_ADDR`,
//!    `PET_MASTER_PORT`;
//! 3. Open MPI: `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`, `_LOCAL_SIZE`;
//! 4. PMI: `PMI_RANK`, `PMI_SIZE` (+ `MPI_LOCALRANKID`, `MPI_LOCALNRANKS`);
//! 5. Slurm: `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`/`SLURM_NTASKS`, `SLURM_LOCALID`, the tasks
//!    per node (`slurm.rs`), the first host of the node list, `SLURM_JOB_ID`.
//!
//! The MPI launchers come before Slurm on purpose: `mpirun` or `mpiexec` inside a Slurm
//! allocation starts its per-node daemons with `srun`, so the MPI processes inherit the
//! daemon's `SLURM_PROCID` (a node index), while the MPI variables are their own.
//! A source without local rank and size counts every process as its own node. Empty values
//! count as unset.
//!
//! ## The role rule
//! Every process is a worker whose rank is its global rank (`DMLC_TASK_ID = rank`, a complete
//! set, so the scheduler keeps it). Rank 0 also hosts the scheduler. `SYNKV_NUM_SERVERS`
//! (default: the number of nodes, `world / local size`) processes host one server each: order
//! the processes by (local rank, node), with node = rank / local size, and take the first
//! ones — by default local rank 0 of every node. Ranks must be laid out in blocks per node
//! (torchrun, `srun`'s block distribution and `mpirun`'s by-slot mapping do this); that is
//! checked (rank mod local size = local rank) and every node must run as many processes.
//!
//! ## Addresses
//! - Scheduler host: `SYNKV_ROOT_ADDR`, else `MASTER_ADDR` (`PET_MASTER_ADDR`), else the first
//!   host of Slurm's node list, else `127.0.0.1` when every process runs on one node, else an
//!   error asking for `SYNKV_ROOT_ADDR`. It must be the host of rank 0.
//! - Scheduler port: `SYNKV_ROOT_PORT`, else `MASTER_PORT + 1` (`MASTER_PORT` is torch's own
//!   store, which the script may also start), else `20000 + SLURM_JOB_ID mod 20000` (two jobs on
//!   a node differ), else [`DEFAULT_ROOT_PORT`].
//! - This process's advertised host: `SYNKV_NODE_HOST`, else `DMLC_NODE_HOST`, else
//!   `127.0.0.1` on one node, else this machine's host name ([`hostname`]).
//!
//! What this module does not do: resolve names, bind sockets, or start anything — the store
//! (`store::distributed`) hosts the roles [`Placement`] names.

mod slurm;
#[cfg(test)]
mod tests;

use std::fmt;

use super::config::{Lookup, MAX_NODES_PER_ROLE};
use super::ConfigError;

/// The scheduler's port when no variable decides it (`SYNKV_ROOT_PORT` overrides it).
pub const DEFAULT_ROOT_PORT: u16 = 29600;

/// Under Slurm the scheduler's port is `SLURM_PORT_BASE + SLURM_JOB_ID % SLURM_PORT_SPAN`.
pub const SLURM_PORT_BASE: u16 = 20000;

/// See [`SLURM_PORT_BASE`].
pub const SLURM_PORT_SPAN: u16 = 20000;

/// Which orchestrator's variables described this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// `SYNKV_RANK`, `SYNKV_WORLD_SIZE`.
    Synkv,
    /// torchrun, or Kubeflow without torchrun: `RANK`, `WORLD_SIZE`.
    Torchrun,
    /// Kubeflow's `PET_*` variables (one process per pod).
    Kubeflow,
    /// Open MPI: `OMPI_COMM_WORLD_*`.
    OpenMpi,
    /// A PMI launcher: `PMI_RANK`, `PMI_SIZE`.
    Pmi,
    /// Slurm's `srun`: `SLURM_PROCID`.
    Slurm,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Synkv => "SYNKV_RANK/SYNKV_WORLD_SIZE",
            Source::Torchrun => "torchrun (RANK/WORLD_SIZE)",
            Source::Kubeflow => "Kubeflow (PET_NODE_RANK/PET_NNODES)",
            Source::OpenMpi => "Open MPI (OMPI_COMM_WORLD_RANK/SIZE)",
            Source::Pmi => "PMI (PMI_RANK/PMI_SIZE)",
            Source::Slurm => "Slurm (SLURM_PROCID)",
        })
    }
}

/// What a process started by an orchestrator is and hosts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Whose variables said so.
    pub source: Source,
    /// Global rank: the worker rank.
    pub rank: u32,
    /// Number of processes: the number of workers.
    pub world_size: u32,
    /// Rank among the processes of this node.
    pub local_rank: u32,
    /// Processes per node (the same on every node).
    pub local_size: u32,
    /// The scheduler's host (`DMLC_PS_ROOT_URI`).
    pub root_addr: String,
    /// The scheduler's port (`DMLC_PS_ROOT_PORT`).
    pub root_port: u16,
    /// Servers, each hosted by one process (`DMLC_NUM_SERVER`).
    pub num_servers: u32,
    /// The address this process advertises (`DMLC_NODE_HOST`).
    pub node_host: String,
}

/// What a worker process hosts besides its worker (in [`Config::placement`](super::Config)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Whose variables decided it.
    pub source: Source,
    /// This process hosts the scheduler (rank 0).
    pub scheduler: bool,
    /// This process hosts one of the servers.
    pub server: bool,
}

impl Launch {
    /// Nodes of the job (`world_size / local_size`).
    pub fn num_nodes(&self) -> u32 {
        self.world_size / self.local_size
    }

    /// This process's node index (ranks are laid out in blocks per node).
    pub fn node(&self) -> u32 {
        self.rank / self.local_size
    }

    /// This process's position when the processes are ordered by (local rank, node): the
    /// first `num_servers` host a server.
    pub fn server_slot(&self) -> u32 {
        self.local_rank * self.num_nodes() + self.node()
    }

    /// What this process hosts.
    pub fn placement(&self) -> Placement {
        Placement { source: self.source, scheduler: self.rank == 0, server: self.server_slot() < self.num_servers }
    }

    /// The `DMLC_*` variables of an equivalent MXNet-style launch of this worker.
    pub fn dmlc_vars(&self) -> [(&'static str, String); 7] {
        [
            ("DMLC_ROLE", "worker".to_owned()),
            ("DMLC_PS_ROOT_URI", self.root_addr.clone()),
            ("DMLC_PS_ROOT_PORT", self.root_port.to_string()),
            ("DMLC_NUM_SERVER", self.num_servers.to_string()),
            ("DMLC_NUM_WORKER", self.world_size.to_string()),
            ("DMLC_TASK_ID", self.rank.to_string()),
            ("DMLC_NODE_HOST", self.node_host.clone()),
        ]
    }
}

/// This machine's host name: `/proc/sys/kernel/hostname`, else `$HOSTNAME`.
pub fn hostname() -> Option<String> {
    let clean = |s: String| Some(s.trim().to_owned()).filter(|h| !h.is_empty() && !h.contains(char::is_whitespace));
    std::fs::read_to_string("/proc/sys/kernel/hostname").ok().and_then(clean).or_else(|| std::env::var("HOSTNAME").ok().and_then(clean))
}

/// Reads the orchestrator's variables through `get` (module docs): `Ok(None)` when
/// `DMLC_PS_ROOT_URI` is set (even empty) or no source is present. `hostname` is asked only
/// when a multi-node process has no `SYNKV_NODE_HOST`/`DMLC_NODE_HOST`.
pub fn detect(get: &Lookup<'_>, hostname: &dyn Fn() -> Option<String>) -> Result<Option<Launch>, ConfigError> {
    if get("DMLC_PS_ROOT_URI")?.is_some() {
        return Ok(None);
    }
    let Some(found) = identify(get)? else { return Ok(None) };
    refuse_partial_dmlc(get, found.source)?;
    let Found { source, rank, world, local, addr, port } = found;
    let (local_rank, local_size) = local.unwrap_or((Num { var: rank.var, value: 0 }, Num { var: world.var, value: 1 }));
    check_layout(rank, world, local_rank, local_size)?;
    let one_node = local_size.value == world.value;
    let nodes = world.value / local_size.value;

    let root_addr = match (host(get, "SYNKV_ROOT_ADDR")?, addr) {
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) if one_node => "127.0.0.1".to_owned(),
        (None, None) => {
            return Err(err(
                "SYNKV_ROOT_ADDR",
                format!("is not set, and {source} names no host for rank 0 while the {} processes run on {nodes} nodes", world.value),
                "the host name or IP address of the node that runs rank 0 (or SYNKV_LOCAL_RANK and SYNKV_LOCAL_WORLD_SIZE if every process runs on this node)",
            ))
        }
    };
    let root_port = match get_value(get, "SYNKV_ROOT_PORT")? {
        Some(raw) => parse_port("SYNKV_ROOT_PORT", &raw)?,
        None => match port {
            PortRule::Default => DEFAULT_ROOT_PORT,
            PortRule::After { var, port } => port.checked_add(1).ok_or_else(|| {
                err(var, format!("{port} leaves no next port for synkv's scheduler"), "a port below 65535, or set SYNKV_ROOT_PORT")
            })?,
            // The remainder is below SLURM_PORT_SPAN, so it fits.
            PortRule::SlurmJob(id) => SLURM_PORT_BASE + u16::try_from(id % u64::from(SLURM_PORT_SPAN)).unwrap_or(0),
        },
    };
    let num_servers = match get_value(get, "SYNKV_NUM_SERVERS")? {
        None => nodes,
        Some(raw) => match raw.parse::<u32>() {
            Ok(s) if s >= 1 && s <= world.value => s,
            _ => {
                return Err(err(
                    "SYNKV_NUM_SERVERS",
                    format!("{raw:?} is not accepted: the job has {} processes, and each hosts at most one server", world.value),
                    "an integer from 1 to the number of processes",
                ))
            }
        },
    };
    let node_host = match (host(get, "SYNKV_NODE_HOST")?, host(get, "DMLC_NODE_HOST")?) {
        (Some(h), _) | (None, Some(h)) => h,
        (None, None) if one_node => "127.0.0.1".to_owned(),
        (None, None) => hostname().ok_or_else(|| {
            err(
                "SYNKV_NODE_HOST",
                "is not set, and this machine's host name could not be read",
                "the host name or IP address at which the other nodes reach this process",
            )
        })?,
    };
    Ok(Some(Launch {
        source,
        rank: rank.value,
        world_size: world.value,
        local_rank: local_rank.value,
        local_size: local_size.value,
        root_addr,
        root_port,
        num_servers,
        node_host,
    }))
}

/// A number read from a variable, with the variable's name for errors.
#[derive(Clone, Copy, Debug)]
struct Num {
    var: &'static str,
    value: u32,
}

/// How the scheduler's port follows from the source, without `SYNKV_ROOT_PORT`.
#[derive(Clone, Copy, Debug)]
enum PortRule {
    Default,
    /// The orchestrator's own port (`var`) plus one.
    After {
        var: &'static str,
        port: u16,
    },
    /// From the Slurm job id.
    SlurmJob(u64),
}

/// What one source said, before the shared rules.
#[derive(Debug)]
struct Found {
    source: Source,
    rank: Num,
    world: Num,
    /// (local rank, local size); `None`: each process is its own node.
    local: Option<(Num, Num)>,
    /// The scheduler's host, if the source names one.
    addr: Option<String>,
    port: PortRule,
}

fn err(var: &'static str, problem: impl Into<String>, expected: &'static str) -> ConfigError {
    ConfigError { var, problem: problem.into(), expected }
}

/// A variable's trimmed value; empty counts as unset.
fn get_value(get: &Lookup<'_>, var: &'static str) -> Result<Option<String>, ConfigError> {
    Ok(get(var)?.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()))
}

fn number(get: &Lookup<'_>, var: &'static str) -> Result<Option<Num>, ConfigError> {
    let Some(raw) = get_value(get, var)? else { return Ok(None) };
    raw.parse::<u32>()
        .map(|value| Some(Num { var, value }))
        .map_err(|_| err(var, format!("{raw:?} is not a number"), "a non-negative integer"))
}

/// The first of `vars` that is set.
fn first_number(get: &Lookup<'_>, vars: &[&'static str]) -> Result<Option<Num>, ConfigError> {
    for var in vars {
        if let Some(n) = number(get, var)? {
            return Ok(Some(n));
        }
    }
    Ok(None)
}

/// Two variables that come together: both, or neither.
fn pair(get: &Lookup<'_>, a: &'static str, b: &'static str) -> Result<Option<(Num, Num)>, ConfigError> {
    match (number(get, a)?, number(get, b)?) {
        (Some(x), Some(y)) => Ok(Some((x, y))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(err(b, format!("is not set, but {a} is"), "both variables of the pair, or neither")),
        (None, Some(_)) => Err(err(a, format!("is not set, but {b} is"), "both variables of the pair, or neither")),
    }
}

/// A host name or address: no spaces.
fn host(get: &Lookup<'_>, var: &'static str) -> Result<Option<String>, ConfigError> {
    match get_value(get, var)? {
        Some(h) if h.contains(char::is_whitespace) => {
            Err(err(var, format!("{h:?} is not a host"), "a host name or IP address without spaces"))
        }
        other => Ok(other),
    }
}

fn parse_port(var: &'static str, raw: &str) -> Result<u16, ConfigError> {
    match raw.parse::<u16>() {
        Ok(p) if p >= 1 => Ok(p),
        _ => Err(err(var, format!("{raw:?} is not a port"), "a port number in 1..=65535")),
    }
}

/// The first of `vars` that is set, as the orchestrator's port (the scheduler takes the next).
fn port_after(get: &Lookup<'_>, vars: &[&'static str]) -> Result<PortRule, ConfigError> {
    for var in vars {
        if let Some(raw) = get_value(get, var)? {
            return Ok(PortRule::After { var, port: parse_port(var, &raw)? });
        }
    }
    Ok(PortRule::Default)
}

fn first_host(get: &Lookup<'_>, vars: &[&'static str]) -> Result<Option<String>, ConfigError> {
    for var in vars {
        if let Some(h) = host(get, var)? {
            return Ok(Some(h));
        }
    }
    Ok(None)
}

/// The first source present (module docs), unchecked.
fn identify(get: &Lookup<'_>) -> Result<Option<Found>, ConfigError> {
    if let Some((rank, world)) = pair(get, "SYNKV_RANK", "SYNKV_WORLD_SIZE")? {
        let local = pair(get, "SYNKV_LOCAL_RANK", "SYNKV_LOCAL_WORLD_SIZE")?;
        return Ok(Some(Found { source: Source::Synkv, rank, world, local, addr: None, port: PortRule::Default }));
    }
    if let Some((rank, world)) = pair(get, "RANK", "WORLD_SIZE")? {
        // Kubeflow pods that run the script themselves have neither LOCAL_* variable.
        let local = match (number(get, "LOCAL_RANK")?, number(get, "LOCAL_WORLD_SIZE")?) {
            (Some(r), Some(s)) => Some((r, s)),
            (None, None) => None,
            (Some(r), None) => match number(get, "PET_NPROC_PER_NODE")? {
                Some(s) => Some((r, s)),
                None => return Err(err("LOCAL_WORLD_SIZE", "is not set, but LOCAL_RANK is", "the processes per node (torchrun sets it)")),
            },
            (None, Some(_)) => return Err(err("LOCAL_RANK", "is not set, but LOCAL_WORLD_SIZE is", "the rank within the node")),
        };
        let addr = first_host(get, &["MASTER_ADDR", "PET_MASTER_ADDR"])?;
        let port = port_after(get, &["MASTER_PORT", "PET_MASTER_PORT"])?;
        return Ok(Some(Found { source: Source::Torchrun, rank, world, local, addr, port }));
    }
    if get_value(get, "PET_NODE_RANK")?.is_some() || get_value(get, "PET_NNODES")?.is_some() {
        return kubeflow(get).map(Some);
    }
    if let Some((rank, world)) = pair(get, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")? {
        let local = pair(get, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")?;
        return Ok(Some(Found { source: Source::OpenMpi, rank, world, local, addr: None, port: PortRule::Default }));
    }
    if let Some((rank, world)) = pair(get, "PMI_RANK", "PMI_SIZE")? {
        let local = pair(get, "MPI_LOCALRANKID", "MPI_LOCALNRANKS")?;
        return Ok(Some(Found { source: Source::Pmi, rank, world, local, addr: None, port: PortRule::Default }));
    }
    if let Some(rank) = number(get, "SLURM_PROCID")? {
        return slurm::found(get, rank).map(Some);
    }
    Ok(None)
}

/// Kubeflow's `PET_*` variables without `RANK`: one process per pod, each pod a node.
fn kubeflow(get: &Lookup<'_>) -> Result<Found, ConfigError> {
    let elastic = "a fixed node count; an elastic range (min:max) needs torchrun, which sets RANK and WORLD_SIZE";
    let world = match get_value(get, "PET_NNODES")? {
        None => return Err(err("PET_NNODES", "is not set, but PET_NODE_RANK is", elastic)),
        Some(raw) => raw
            .parse::<u32>()
            .map(|value| Num { var: "PET_NNODES", value })
            .map_err(|_| err("PET_NNODES", format!("{raw:?} is not accepted"), elastic))?,
    };
    let rank = number(get, "PET_NODE_RANK")?.ok_or_else(|| err("PET_NODE_RANK", "is not set, but PET_NNODES is", "the pod's index"))?;
    if let Some(raw) = get_value(get, "PET_NPROC_PER_NODE")? {
        if raw != "1" {
            return Err(err(
                "PET_NPROC_PER_NODE",
                format!("is {raw:?} but this process has no RANK: that many processes per pod are torchrun's to start"),
                "1, or start the script with torchrun (which sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE)",
            ));
        }
    }
    let addr = first_host(get, &["PET_MASTER_ADDR", "MASTER_ADDR"])?;
    let port = port_after(get, &["PET_MASTER_PORT", "MASTER_PORT"])?;
    Ok(Found { source: Source::Kubeflow, rank, world, local: None, addr, port })
}

/// Without `DMLC_PS_ROOT_URI`, a stray `DMLC_*` cluster variable would be silently replaced:
/// refuse it instead (a `DMLC_ROLE` of `worker` agrees, so it is allowed).
fn refuse_partial_dmlc(get: &Lookup<'_>, source: Source) -> Result<(), ConfigError> {
    let expected = "no DMLC_* cluster variables under an orchestrator (synkv derives them; SYNKV_NUM_SERVERS sets the server count), or all of them with DMLC_PS_ROOT_URI";
    for var in ["DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER", "DMLC_TASK_ID"] {
        if get(var)?.is_some() {
            return Err(err(var, format!("is set but DMLC_PS_ROOT_URI is not, and {source} started this process"), expected));
        }
    }
    match get("DMLC_ROLE")? {
        Some(role) if role.trim() != "worker" => Err(err(
            "DMLC_ROLE",
            format!("is {role:?} but DMLC_PS_ROOT_URI is not set, and {source} started this process as a worker"),
            expected,
        )),
        _ => Ok(()),
    }
}

/// The rules every source must meet (module docs).
fn check_layout(rank: Num, world: Num, local_rank: Num, local_size: Num) -> Result<(), ConfigError> {
    if world.value == 0 || world.value > MAX_NODES_PER_ROLE {
        return Err(err(world.var, format!("{} is not accepted", world.value), "a process count in 1..=16384"));
    }
    if rank.value >= world.value {
        return Err(err(
            rank.var,
            format!("{} is not below {} = {}", rank.value, world.var, world.value),
            "a rank below the process count",
        ));
    }
    if local_size.value == 0 || !world.value.is_multiple_of(local_size.value) {
        return Err(err(
            local_size.var,
            format!("{} does not divide {} = {}", local_size.value, world.var, world.value),
            "the processes per node, the same on every node",
        ));
    }
    if local_rank.value >= local_size.value {
        return Err(err(
            local_rank.var,
            format!("{} is not below {} = {}", local_rank.value, local_size.var, local_size.value),
            "a rank within the node, below the processes per node",
        ));
    }
    if rank.value % local_size.value != local_rank.value {
        return Err(err(
            local_rank.var,
            format!(
                "{} does not match {} = {} with {} processes per node: ranks are not laid out in blocks per node",
                local_rank.value, rank.var, rank.value, local_size.value
            ),
            "ranks contiguous per node (torchrun; srun --distribution=block; mpirun --map-by slot), or set SYNKV_RANK and the other SYNKV_* variables",
        ));
    }
    Ok(())
}
