//! Jobs started the way torchrun, Slurm's `srun` and Open MPI's `mpirun` start them: every
//! process runs the same worker program (`synkv selftest dist t24`) with only the
//! orchestrator's variables, and no scheduler or server process exists — rank 0 hosts the
//! scheduler, `SYNKV_NUM_SERVERS` processes (default: one per node) host a server
//! (`ps::orchestrator`). The worker program checks every pulled value exactly (T24's numbers,
//! with the 1200×1200 keys split over the servers and, at 1 MiB partitions, into parts); each
//! process must report its rank and the server count and exit 0 within `util::JOB_BOUND`.
//! Children start from a clean environment (`util::synkv_command`), so the tests pass under
//! any launcher.

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::{free_port, synkv_command, Proc, FAST, JOB_BOUND};

/// `synkv selftest dist <case…>` with exactly `vars` (plus `FAST` and 1 MiB partitions) on top
/// of an environment cleared of launchers' variables.
fn worker(case: &[&str], vars: &[(String, String)]) -> Command {
    let mut cmd = synkv_command();
    cmd.args(["selftest", "dist"]).args(case);
    cmd.envs(FAST).env("SYNKV_LOG", "warn").env("SYNKV_PARTITION_BYTES", "1048576");
    cmd.envs(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    cmd
}

fn owned(vars: &[(&str, String)]) -> Vec<(String, String)> {
    vars.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
}

/// Starts one worker per entry of `envs` (rank = index) and checks that each exits 0 and
/// reports its rank, `envs.len()` workers and `servers` servers.
fn run_job(envs: Vec<Vec<(String, String)>>, servers: u32) {
    let n = envs.len();
    let mut procs: Vec<Proc> = envs.iter().enumerate().map(|(r, vars)| Proc::start(&format!("rank {r}"), worker(&["t24"], vars))).collect();
    let deadline = Instant::now() + JOB_BOUND;
    let mut failures = Vec::new();
    for (r, p) in procs.iter_mut().enumerate() {
        let status = p.wait_until(deadline);
        let out = p.output();
        let line = format!("selftest t24 ok (rank {r} of {n} workers, {servers} servers)");
        match status {
            Some(s) if s.success() && out.contains(&line) => {}
            Some(s) => failures.push(format!("{} exited with {s}, expected {line:?}:\n{out}", p.label)),
            None => failures.push(format!("{} still running after {JOB_BOUND:?}:\n{out}", p.label)),
        }
    }
    // Dropping the procs kills any still running.
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `port - 1`, for launchers whose scheduler takes `MASTER_PORT + 1`: that port was free.
fn master_port_before_a_free_one() -> String {
    loop {
        let p = free_port();
        if p > 1 {
            return (p - 1).to_string();
        }
    }
}

/// torchrun's variables for `n` processes on this node.
fn torchrun(n: u32, servers: u32) -> Vec<Vec<(String, String)>> {
    let master_port = master_port_before_a_free_one();
    (0..n)
        .map(|r| {
            owned(&[
                ("RANK", r.to_string()),
                ("WORLD_SIZE", n.to_string()),
                ("LOCAL_RANK", r.to_string()),
                ("LOCAL_WORLD_SIZE", n.to_string()),
                ("MASTER_ADDR", "127.0.0.1".to_owned()),
                ("MASTER_PORT", master_port.clone()),
                ("SYNKV_NUM_SERVERS", servers.to_string()),
            ])
        })
        .collect()
}

/// torchrun's variables for `nodes` nodes of `per_node` processes each (`GROUP_RANK` = node),
/// all on this machine: each node advertises 127.0.0.1 (`SYNKV_NODE_HOST`; a real node's host
/// name otherwise), and `SYNKV_NUM_SERVERS` is left to its default, one server per node.
fn torchrun_nodes(nodes: u32, per_node: u32) -> Vec<Vec<(String, String)>> {
    let master_port = master_port_before_a_free_one();
    (0..nodes * per_node)
        .map(|r| {
            owned(&[
                ("RANK", r.to_string()),
                ("WORLD_SIZE", (nodes * per_node).to_string()),
                ("LOCAL_RANK", (r % per_node).to_string()),
                ("LOCAL_WORLD_SIZE", per_node.to_string()),
                ("GROUP_RANK", (r / per_node).to_string()),
                ("GROUP_WORLD_SIZE", nodes.to_string()),
                ("MASTER_ADDR", "127.0.0.1".to_owned()),
                ("MASTER_PORT", master_port.clone()),
                ("SYNKV_NODE_HOST", "127.0.0.1".to_owned()),
            ])
        })
        .collect()
}

/// Two torchrun nodes of two processes: local rank 0 of each node hosts a server, rank 0 the
/// scheduler, and the four workers form one job.
#[test]
fn torchrun_two_nodes_host_a_server_each() {
    run_job(torchrun_nodes(2, 2), 2);
}

#[test]
fn torchrun_two_processes_host_two_servers() {
    run_job(torchrun(2, 2), 2);
}

#[test]
fn torchrun_three_processes_host_two_servers() {
    run_job(torchrun(3, 2), 2);
}

/// Slurm: the scheduler's port is `20000 + SLURM_JOB_ID mod 20000`, so pick a job id whose
/// port is free; the node list's first host (`localhost`) is the scheduler's host; one server
/// (one node).
#[test]
fn slurm_tasks_host_the_scheduler_and_one_server() {
    let port = (0..2000u32)
        .map(|i| 20000 + (std::process::id().wrapping_mul(7919).wrapping_add(i * 613)) % 20000)
        .find(|p| u16::try_from(*p).is_ok_and(|p| TcpListener::bind(("127.0.0.1", p)).is_ok()))
        .expect("a free port in 20000..40000");
    let job_id = (1_000_000 + port - 20000).to_string();
    let envs = (0..2u32)
        .map(|r| {
            owned(&[
                ("SLURM_PROCID", r.to_string()),
                ("SLURM_NTASKS", "2".to_owned()),
                ("SLURM_LOCALID", r.to_string()),
                ("SLURM_TASKS_PER_NODE", "2".to_owned()),
                ("SLURM_JOB_NODELIST", "localhost".to_owned()),
                ("SLURM_JOB_ID", job_id.clone()),
            ])
        })
        .collect();
    run_job(envs, 1);
}

#[test]
fn open_mpi_processes_host_two_servers() {
    let port = free_port().to_string();
    let envs = (0..2u32)
        .map(|r| {
            owned(&[
                ("OMPI_COMM_WORLD_RANK", r.to_string()),
                ("OMPI_COMM_WORLD_SIZE", "2".to_owned()),
                ("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string()),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "2".to_owned()),
                ("SYNKV_ROOT_PORT", port.clone()),
                ("SYNKV_NUM_SERVERS", "2".to_owned()),
            ])
        })
        .collect();
    run_job(envs, 2);
}

/// A busy scheduler port fails the store's creation with an error that says where and what to
/// set, at once (no rendezvous timeout).
#[test]
fn a_busy_scheduler_port_fails_the_creation() {
    let busy = TcpListener::bind("127.0.0.1:0").expect("a listener");
    let port = busy.local_addr().expect("its address").port();
    let vars = owned(&[
        ("RANK", "0".to_owned()),
        ("WORLD_SIZE", "1".to_owned()),
        ("MASTER_ADDR", "127.0.0.1".to_owned()),
        ("MASTER_PORT", (port - 1).to_string()),
    ]);
    let mut p = Proc::start("rank 0", worker(&["t24"], &vars));
    let status = p.wait_until(Instant::now() + JOB_BOUND);
    let out = p.output();
    let status = status.unwrap_or_else(|| panic!("still running after {JOB_BOUND:?}:\n{out}"));
    assert!(!status.success(), "exited 0 although the port was busy:\n{out}");
    let want = format!("could not listen on 127.0.0.1:{port}");
    assert!(out.contains(&want) && out.contains("SYNKV_ROOT_PORT"), "expected {want:?} and a hint:\n{out}");
    drop(busy);
}

/// Kills one process of a running 3-process torchrun job (ranks 0 and 1 host the servers, rank
/// 0 the scheduler); every other process must fail within the heartbeat timeout plus slack,
/// naming a lost node: a process's close waits for its hosted roles, which end by failure
/// detection, never hang.
fn kill_rank_and_check_survivors(victim: usize, expect: &str) {
    let envs = torchrun(3, 2);
    let case = ["until-failure", "--max-secs", "80"];
    let mut procs: Vec<Proc> = envs.iter().enumerate().map(|(r, vars)| Proc::start(&format!("rank {r}"), worker(&case, vars))).collect();
    let ready = Instant::now() + Duration::from_secs(40);
    for p in &procs {
        assert!(p.wait_for_output("selftest until-failure: running", ready), "{} never started:\n{}", p.label, p.output());
    }
    procs[victim].kill();
    let deadline = Instant::now() + Duration::from_secs(20);
    for (r, p) in procs.iter_mut().enumerate().filter(|(r, _)| *r != victim) {
        let status = p.wait_until(deadline);
        let out = p.output();
        let status = status.unwrap_or_else(|| panic!("rank {r} still running 20 s after rank {victim} was killed:\n{out}"));
        assert!(!status.success(), "rank {r} exited 0 after rank {victim} was killed:\n{out}");
        assert!(out.contains(expect), "rank {r} does not name a lost node ({expect:?}):\n{out}");
    }
}

#[test]
fn killing_the_rank_that_hosts_the_scheduler_ends_the_others() {
    kill_rank_and_check_survivors(0, "lost ");
}

#[test]
fn killing_a_plain_worker_ends_the_processes_that_host_roles() {
    kill_rank_and_check_survivors(2, "lost worker rank 2");
}

/// The shared-memory segments (`memfd:synkv-shm`) process `pid` has mapped.
fn segments(pid: u32) -> usize {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines().filter(|l| l.contains("memfd:synkv-shm")).count()
}

/// Two torchrun processes hosting a server each, with `SYNKV_SHM=0`: a process's worker
/// reaches the server of its own process through memory (no socket is needed inside a
/// process) and the other process's server over TCP. Each process maps the segments of its own
/// worker↔server pair only — the worker's, the server's for it and the server's broadcast
/// segment, each mapped by both sides: 6 — where shared memory between processes (the
/// default) maps those of the other pair too; every value stays exact (T24 with SYNKV_SHM=0).
#[test]
fn a_process_reaches_its_own_server_through_memory_even_with_shm_off() {
    let mut envs = torchrun(2, 2);
    for vars in &mut envs {
        vars.push(("SYNKV_SHM".to_owned(), "0".to_owned()));
    }
    run_job(envs.clone(), 2);

    let dir = tempfile::tempdir().expect("a temporary directory");
    let stop = dir.path().join("stop");
    let case = ["rounds-until", "--until-file", stop.to_str().expect("a UTF-8 path"), "--max-secs", "120"];
    let counts = |envs: &[Vec<(String, String)>]| {
        let mut procs: Vec<Proc> =
            envs.iter().enumerate().map(|(r, vars)| Proc::start(&format!("rank {r}"), worker(&case, vars))).collect();
        let deadline = Instant::now() + JOB_BOUND;
        for p in &procs {
            assert!(p.wait_for_output("selftest rounds-until: running", deadline), "{} never started:\n{}", p.label, p.output());
        }
        let counts: Vec<usize> = procs.iter().map(|p| segments(p.pid())).collect();
        std::fs::write(&stop, b"").expect("the stop file");
        for p in &mut procs {
            assert!(p.wait_until(deadline).is_some_and(|s| s.success()), "{}:\n{}", p.label, p.output());
            assert!(p.output().contains("every value exact"), "{}:\n{}", p.label, p.output());
        }
        std::fs::remove_file(&stop).expect("remove the stop file");
        counts
    };
    assert_eq!(counts(&envs), [6, 6], "SYNKV_SHM=0: each process maps its own pair's segments only");
    let shared = torchrun(2, 2);
    let all = counts(&shared);
    assert!(all.iter().all(|&n| n > 6), "shared memory between processes maps the other pair's segments too: {all:?}");
}
