//! `synkv launch --launcher hosted`: every process on this host is a worker that hosts its
//! roles, started as torchrun starts them.
//!
//! No `synkv scheduler` or `synkv server` process: `W` copies of the command, each with
//! `SYNKV_RANK` = its index, `SYNKV_WORLD_SIZE` = `W`, `SYNKV_LOCAL_RANK`,
//! `SYNKV_LOCAL_WORLD_SIZE` (one node), `SYNKV_NUM_SERVERS` = `-s` (default `W`: every process
//! holds a server, BytePS's colocated servers), `SYNKV_ROOT_ADDR=127.0.0.1` and a free
//! `SYNKV_ROOT_PORT`. Rank 0 hosts the scheduler and the first `-s` processes a server each
//! (`ps::orchestrator`); a worker reaches its own process's server through memory even with
//! `SYNKV_SHM=0` (docs/dist.md, "A process's own server"). The `DMLC_*` variables are removed
//! from the children's environment (`DMLC_PS_ROOT_URI` would turn the orchestrator detection
//! off); other launchers' rank variables stay, below `SYNKV_RANK`. Supervision is the local
//! launcher's ([`super::supervise`]): every process is a worker, so the job is over when every
//! one has exited, and the first failure stops the others after the grace period.

use std::process::Command;

use anyhow::{bail, Context, Result};

use super::supervise::{Part, Planned};
use super::JobSpec;

/// The processes of `spec`: `spec.workers` copies of the command, the first `spec.servers`
/// hosting a server each and rank 0 the scheduler.
pub(super) fn plan(spec: &JobSpec) -> Result<Vec<Planned>> {
    let (workers, servers) = (spec.workers, spec.servers);
    if servers > workers {
        bail!("-s {servers}: with --launcher hosted the servers are hosted by the worker processes, so -s must be in 1..={workers}");
    }
    let port = synkv::ps::transport::ports::free_port("127.0.0.1").context("finding a free port for the scheduler")?;
    // MXNet's layout: `DMLC_PS_ROOT_URI` would turn the orchestrator detection off, and a
    // stray `DMLC_*` is an error under an orchestrator. Other launchers' rank variables need no
    // removal: `SYNKV_RANK` is the first source the detection reads.
    let mxnet: Vec<_> = std::env::vars_os().map(|(name, _)| name).filter(|n| n.to_str().is_some_and(|n| n.starts_with("DMLC_"))).collect();
    let mut plan = Vec::with_capacity(workers as usize);
    for i in 0..workers {
        let mut cmd = Command::new(&spec.command[0]);
        cmd.args(&spec.command[1..]);
        for name in &mxnet {
            cmd.env_remove(name);
        }
        cmd.env("SYNKV_RANK", i.to_string())
            .env("SYNKV_WORLD_SIZE", workers.to_string())
            .env("SYNKV_LOCAL_RANK", i.to_string())
            .env("SYNKV_LOCAL_WORLD_SIZE", workers.to_string())
            .env("SYNKV_NUM_SERVERS", servers.to_string())
            .env("SYNKV_ROOT_ADDR", "127.0.0.1")
            .env("SYNKV_ROOT_PORT", port.to_string())
            .envs(spec.env.iter().map(|(k, v)| (k, v)));
        let roles = match (i == 0, i < servers) {
            (true, true) => " (hosts the scheduler and a server)",
            (true, false) => " (hosts the scheduler)",
            (false, true) => " (hosts a server)",
            (false, false) => "",
        };
        plan.push(Planned { label: format!("worker {i}"), role: Part::Worker, cmd, stdin: None, place: roles.to_owned() });
    }
    (spec.notes)(&format!(
        "{workers} workers hosting the scheduler (rank 0, 127.0.0.1:{port}) and {servers} servers (ranks 0..{servers}) themselves"
    ));
    Ok(plan)
}
