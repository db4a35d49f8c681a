//! Unit tests of the orchestrator detection: each source, precedence, the shared rules, the
//! errors (each names its variable), Slurm's lists, and where servers go.

use std::collections::HashMap;

use super::slurm::{first_of_hostlist, parse_tasks_per_node};
use super::*;
use crate::ps::{Config, Role};

fn detect_in(vars: &[(&str, &str)], hostname: Option<&str>) -> Result<Option<Launch>, ConfigError> {
    let map: HashMap<&str, &str> = vars.iter().copied().collect();
    let host = hostname.map(str::to_owned);
    detect(&|var| Ok(map.get(var).map(|v| (*v).to_owned())), &|| host.clone())
}

fn launch(vars: &[(&str, &str)]) -> Launch {
    match detect_in(vars, Some("box7")) {
        Ok(Some(l)) => l,
        other => panic!("{vars:?}: expected a launch, got {other:?}"),
    }
}

fn refused(vars: &[(&str, &str)]) -> ConfigError {
    match detect_in(vars, Some("box7")) {
        Err(e) => e,
        other => panic!("{vars:?}: expected an error, got {other:?}"),
    }
}

/// torchrun's variables for `rank` of `nodes` × `per_node`.
fn torch(rank: u32, nodes: u32, per_node: u32) -> Vec<(&'static str, String)> {
    vec![
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", (nodes * per_node).to_string()),
        ("LOCAL_RANK", (rank % per_node).to_string()),
        ("LOCAL_WORLD_SIZE", per_node.to_string()),
        ("MASTER_ADDR", "node0".to_owned()),
        ("MASTER_PORT", "29500".to_owned()),
    ]
}

/// (scheduler, server) of every rank of `nodes` × `per_node`, with `extra` variables.
fn placements(nodes: u32, per_node: u32, extra: &[(&'static str, &'static str)]) -> Vec<(bool, bool)> {
    (0..nodes * per_node)
        .map(|r| {
            let mut vars = torch(r, nodes, per_node);
            vars.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
            let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let p = launch(&vars).placement();
            (p.scheduler, p.server)
        })
        .collect()
}

#[test]
fn nothing_or_dmlc_means_no_launch() {
    assert_eq!(detect_in(&[], None), Ok(None));
    assert_eq!(detect_in(&[("HOME", "/root")], None), Ok(None));
    // The DMLC path stays exactly as it was, whatever else is set (even an empty root).
    for root in ["10.0.0.1", ""] {
        assert_eq!(detect_in(&[("DMLC_PS_ROOT_URI", root), ("RANK", "1"), ("WORLD_SIZE", "2")], None), Ok(None));
    }
}

#[test]
fn torchrun_on_one_node() {
    let l = launch(&[
        ("RANK", "2"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "2"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ]);
    assert_eq!(
        l,
        Launch {
            source: Source::Torchrun,
            rank: 2,
            world_size: 4,
            local_rank: 2,
            local_size: 4,
            root_addr: "127.0.0.1".into(),
            root_port: 29501,
            num_servers: 1,
            node_host: "127.0.0.1".into(),
        }
    );
    let vars = l.dmlc_vars();
    let want = [
        ("DMLC_ROLE", "worker"),
        ("DMLC_PS_ROOT_URI", "127.0.0.1"),
        ("DMLC_PS_ROOT_PORT", "29501"),
        ("DMLC_NUM_SERVER", "1"),
        ("DMLC_NUM_WORKER", "4"),
        ("DMLC_TASK_ID", "2"),
        ("DMLC_NODE_HOST", "127.0.0.1"),
    ];
    assert_eq!(vars.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>(), want);
}

#[test]
fn torchrun_on_two_nodes_advertises_the_host_name() {
    let vars = torch(3, 2, 2);
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let l = launch(&vars);
    assert_eq!((l.root_addr.as_str(), l.root_port, l.node_host.as_str()), ("node0", 29501, "box7"));
    assert_eq!((l.num_nodes(), l.node(), l.num_servers), (2, 1, 2));
    // No host name to be had: say what to set.
    let e = detect_in(&vars, None).unwrap_err();
    assert_eq!(e.var, "SYNKV_NODE_HOST");
    let mut with_host = vars.clone();
    with_host.push(("SYNKV_NODE_HOST", "10.1.2.3"));
    assert_eq!(detect_in(&with_host, None).unwrap().unwrap().node_host, "10.1.2.3");
    with_host.pop();
    with_host.push(("DMLC_NODE_HOST", "10.1.2.4"));
    assert_eq!(detect_in(&with_host, None).unwrap().unwrap().node_host, "10.1.2.4");
}

#[test]
fn kubeflow_without_torchrun() {
    // A PyTorchJob pod running the script itself: RANK and WORLD_SIZE count pods, one process each.
    let l = launch(&[("RANK", "1"), ("WORLD_SIZE", "3"), ("MASTER_ADDR", "job-master-0"), ("MASTER_PORT", "23456")]);
    assert_eq!((l.source, l.local_rank, l.local_size, l.num_servers), (Source::Torchrun, 0, 1, 3));
    assert_eq!((l.root_addr.as_str(), l.root_port, l.node_host.as_str()), ("job-master-0", 23457, "box7"));
    // Only the PET_* variables torchrun would read.
    let pet =
        [("PET_NNODES", "2"), ("PET_NODE_RANK", "1"), ("PET_NPROC_PER_NODE", "1"), ("PET_MASTER_ADDR", "m0"), ("PET_MASTER_PORT", "23456")];
    let l = launch(&pet);
    assert_eq!((l.source, l.rank, l.world_size, l.root_addr.as_str(), l.root_port), (Source::Kubeflow, 1, 2, "m0", 23457));
    assert_eq!(l.placement(), Placement { source: Source::Kubeflow, scheduler: false, server: true });
    // LOCAL_RANK with the pod's process count from PET_NPROC_PER_NODE.
    let l = launch(&[("RANK", "5"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1"), ("PET_NPROC_PER_NODE", "4"), ("PET_MASTER_ADDR", "m0")]);
    assert_eq!((l.local_size, l.node(), l.root_addr.as_str(), l.root_port), (4, 1, "m0", DEFAULT_ROOT_PORT));
}

#[test]
fn kubeflow_refusals() {
    assert_eq!(refused(&[("PET_NNODES", "1:4"), ("PET_NODE_RANK", "0")]).var, "PET_NNODES");
    assert_eq!(refused(&[("PET_NODE_RANK", "0")]).var, "PET_NNODES");
    assert_eq!(refused(&[("PET_NNODES", "2")]).var, "PET_NODE_RANK");
    let e = refused(&[("PET_NNODES", "2"), ("PET_NODE_RANK", "0"), ("PET_NPROC_PER_NODE", "4"), ("PET_MASTER_ADDR", "m0")]);
    assert_eq!(e.var, "PET_NPROC_PER_NODE");
    assert!(e.to_string().contains("torchrun"), "{e}");
}

#[test]
fn open_mpi_pmi_and_synkv() {
    let ompi = [
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
    ];
    let l = launch(&ompi);
    assert_eq!(
        (l.source, l.rank, l.root_addr.as_str(), l.root_port, l.node_host.as_str()),
        (Source::OpenMpi, 1, "127.0.0.1", 29600, "127.0.0.1")
    );
    let pmi = [("PMI_RANK", "3"), ("PMI_SIZE", "4"), ("MPI_LOCALRANKID", "1"), ("MPI_LOCALNRANKS", "2"), ("SYNKV_ROOT_ADDR", "head")];
    let l = launch(&pmi);
    assert_eq!((l.source, l.rank, l.node(), l.root_addr.as_str(), l.node_host.as_str()), (Source::Pmi, 3, 1, "head", "box7"));
    let l = launch(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")]);
    assert_eq!((l.local_size, l.root_addr.as_str(), l.placement().scheduler, l.placement().server), (1, "127.0.0.1", true, true));
    let own = [
        ("SYNKV_RANK", "0"),
        ("SYNKV_WORLD_SIZE", "2"),
        ("SYNKV_LOCAL_RANK", "0"),
        ("SYNKV_LOCAL_WORLD_SIZE", "2"),
        ("SYNKV_ROOT_PORT", "7000"),
    ];
    let l = launch(&own);
    assert_eq!((l.source, l.root_addr.as_str(), l.root_port, l.num_servers), (Source::Synkv, "127.0.0.1", 7000, 1));
    // Without local sizes each process is its own node: the root's host must be given.
    let e = refused(&[("SYNKV_RANK", "0"), ("SYNKV_WORLD_SIZE", "2")]);
    assert_eq!(e.var, "SYNKV_ROOT_ADDR");
    assert!(e.to_string().contains("SYNKV_LOCAL_WORLD_SIZE"), "{e}");
}

#[test]
fn slurm() {
    let base = [
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "6"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_TASKS_PER_NODE", "2(x3)"),
        ("SLURM_JOB_NODELIST", "node[01-04,07],gpu3"),
        ("SLURM_JOB_ID", "123456"),
    ];
    let l = launch(&base);
    assert_eq!((l.source, l.rank, l.world_size, l.local_rank, l.local_size, l.node()), (Source::Slurm, 5, 6, 1, 2, 2));
    assert_eq!((l.root_addr.as_str(), l.root_port, l.node_host.as_str(), l.num_servers), ("node01", 20000 + 3456, "box7", 3));
    // The step's own variables win over the job's.
    let mut step = base.to_vec();
    step.extend([
        ("SLURM_STEP_NUM_TASKS", "4"),
        ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
        ("SLURM_STEP_NODELIST", "gpu[7-8]"),
        ("SLURM_PROCID", "3"),
    ]);
    let l = launch(&step);
    assert_eq!((l.world_size, l.local_size, l.root_addr.as_str()), (4, 2, "gpu7"));
    // Only SLURM_NTASKS_PER_NODE; no job id: the default port.
    let l = launch(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "1"), ("SLURM_NTASKS_PER_NODE", "2")]);
    assert_eq!((l.local_size, l.root_addr.as_str(), l.root_port, l.node_host.as_str()), (2, "127.0.0.1", DEFAULT_ROOT_PORT, "127.0.0.1"));
    // The node list's first host beats the one-node rule; SYNKV_ROOT_ADDR and _PORT beat both.
    let one = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_TASKS_PER_NODE", "2"),
        ("SLURM_NODELIST", "a-b[3]"),
        ("SLURM_JOBID", "19999"),
    ];
    let l = launch(&one);
    assert_eq!((l.root_addr.as_str(), l.root_port, l.node_host.as_str()), ("a-b3", 39999, "127.0.0.1"));
    let mut over = one.to_vec();
    over.extend([("SYNKV_ROOT_ADDR", "10.0.0.9"), ("SYNKV_ROOT_PORT", "4242")]);
    let l = launch(&over);
    assert_eq!((l.root_addr.as_str(), l.root_port), ("10.0.0.9", 4242));
}

#[test]
fn slurm_refusals() {
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut v = vec![("SLURM_PROCID", "0"), ("SLURM_NTASKS", "3"), ("SLURM_LOCALID", "0"), ("SLURM_JOB_NODELIST", "n[1-2]")];
        v.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
        v.extend(extra.iter().filter(|(_, val)| *val != "<unset>"));
        refused(&v)
    };
    assert_eq!(with(&[("SLURM_TASKS_PER_NODE", "2,1")]).var, "SLURM_TASKS_PER_NODE"); // uneven
    assert_eq!(with(&[("SLURM_TASKS_PER_NODE", "2(x2)")]).var, "SLURM_TASKS_PER_NODE"); // 4 ≠ 3
    assert_eq!(with(&[("SLURM_TASKS_PER_NODE", "2(x")]).var, "SLURM_TASKS_PER_NODE");
    assert_eq!(with(&[]).var, "SLURM_TASKS_PER_NODE"); // SLURM_LOCALID without a size
    assert_eq!(with(&[("SLURM_NTASKS", "<unset>")]).var, "SLURM_NTASKS");
    assert_eq!(with(&[("SLURM_TASKS_PER_NODE", "3"), ("SLURM_JOB_NODELIST", "n[1-2")]).var, "SLURM_JOB_NODELIST");
    assert_eq!(with(&[("SLURM_TASKS_PER_NODE", "3"), ("SLURM_JOB_ID", "x")]).var, "SLURM_JOB_ID");
}

#[test]
fn hostlists() {
    let cases = [
        ("node[01-04,07],gpu3", Some("node01")),
        ("a-b[3]", Some("a-b3")),
        ("gpu3", Some("gpu3")),
        ("gpu3,node[1-2]", Some("gpu3")),
        ("rack[2-3]-n[007-009]", Some("rack2-n007")),
        ("n[10,2-4]-ib", Some("n10-ib")),
        ("localhost", Some("localhost")),
        ("", None),
        ("n[", None),
        ("n[]", None),
        ("n[a-b]", None),
        ("n]1", None),
        ("[1-2]", Some("1")),
    ];
    for (list, want) in cases {
        assert_eq!(first_of_hostlist(list).as_deref(), want, "{list:?}");
    }
    assert_eq!(parse_tasks_per_node("2(x3),1"), Some(vec![2, 2, 2, 1]));
    assert_eq!(parse_tasks_per_node("4"), Some(vec![4]));
    for bad in ["", "2(x0)", "x", "2(x3", "2(3)", "2(x99999)"] {
        assert_eq!(parse_tasks_per_node(bad), None, "{bad:?}");
    }
}

#[test]
fn precedence() {
    // SYNKV_* over torchrun over Open MPI over PMI over Slurm.
    let all = [
        ("SYNKV_RANK", "0"),
        ("SYNKV_WORLD_SIZE", "1"),
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_RANK", "2"),
        ("OMPI_COMM_WORLD_SIZE", "3"),
        ("PMI_RANK", "3"),
        ("PMI_SIZE", "4"),
        ("SLURM_PROCID", "4"),
        ("SLURM_NTASKS", "5"),
        ("SYNKV_ROOT_ADDR", "head"),
    ];
    // (where the source's variables start in `all`, the source); rank i comes from source i.
    let order = [(0, Source::Synkv), (2, Source::Torchrun), (6, Source::OpenMpi), (8, Source::Pmi), (10, Source::Slurm)];
    for (i, (start, want)) in order.into_iter().enumerate() {
        let l = launch(&all[start..]);
        assert_eq!((l.source, l.rank), (want, u32::try_from(i).unwrap()), "from {:?}", all[start]);
    }
    // Kubeflow's PET_* only without RANK (torchrun's children have both).
    let l = launch(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("PET_NNODES", "2"), ("PET_NODE_RANK", "1"), ("PET_NPROC_PER_NODE", "4")]);
    assert_eq!((l.source, l.world_size), (Source::Torchrun, 1));
    // mpirun inside a Slurm allocation: the MPI variables are the process's own.
    let l = launch(&[
        ("OMPI_COMM_WORLD_RANK", "5"),
        ("OMPI_COMM_WORLD_SIZE", "8"),
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SYNKV_ROOT_ADDR", "head"),
    ]);
    assert_eq!((l.source, l.rank), (Source::OpenMpi, 5));
}

#[test]
fn each_bad_variable_is_named() {
    let one_node = |extra: &[(&'static str, &'static str)]| {
        let mut v = vec![("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "4"), ("MASTER_PORT", "29500")];
        v.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
        v.extend(extra.iter().filter(|(_, val)| *val != "<unset>"));
        v
    };
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("RANK", "x")], "RANK"),
        (&[("RANK", "-1")], "RANK"),
        (&[("RANK", "4")], "RANK"),
        (&[("WORLD_SIZE", "<unset>")], "WORLD_SIZE"),
        (&[("WORLD_SIZE", "0"), ("RANK", "0")], "WORLD_SIZE"),
        (&[("WORLD_SIZE", "20000"), ("LOCAL_WORLD_SIZE", "1"), ("LOCAL_RANK", "0")], "WORLD_SIZE"),
        (&[("LOCAL_WORLD_SIZE", "<unset>")], "LOCAL_WORLD_SIZE"),
        (&[("LOCAL_RANK", "<unset>")], "LOCAL_RANK"),
        (&[("LOCAL_WORLD_SIZE", "3")], "LOCAL_WORLD_SIZE"),
        (&[("LOCAL_WORLD_SIZE", "0")], "LOCAL_WORLD_SIZE"),
        (&[("LOCAL_RANK", "4")], "LOCAL_RANK"),
        (&[("LOCAL_RANK", "0")], "LOCAL_RANK"), // rank 1 of 4 on one node must be local rank 1
        (&[("MASTER_PORT", "65535")], "MASTER_PORT"),
        (&[("MASTER_PORT", "0")], "MASTER_PORT"),
        (&[("MASTER_ADDR", "a b")], "MASTER_ADDR"),
        (&[("SYNKV_ROOT_PORT", "70000")], "SYNKV_ROOT_PORT"),
        (&[("SYNKV_ROOT_ADDR", "a b")], "SYNKV_ROOT_ADDR"),
        (&[("SYNKV_NODE_HOST", "a b")], "SYNKV_NODE_HOST"),
        (&[("SYNKV_NUM_SERVERS", "0")], "SYNKV_NUM_SERVERS"),
        (&[("SYNKV_NUM_SERVERS", "5")], "SYNKV_NUM_SERVERS"),
        (&[("SYNKV_NUM_SERVERS", "two")], "SYNKV_NUM_SERVERS"),
        (&[("DMLC_NUM_SERVER", "2")], "DMLC_NUM_SERVER"),
        (&[("DMLC_PS_ROOT_PORT", "9000")], "DMLC_PS_ROOT_PORT"),
        (&[("DMLC_TASK_ID", "1")], "DMLC_TASK_ID"),
        (&[("DMLC_ROLE", "server")], "DMLC_ROLE"),
        (&[("SYNKV_RANK", "0")], "SYNKV_WORLD_SIZE"),
    ];
    for (extra, var) in cases {
        let vars = one_node(extra);
        let e = refused(&vars);
        assert_eq!(&e.var, var, "{extra:?}: {e}");
        assert!(e.to_string().starts_with(var) && e.to_string().contains("expected"), "{e}");
    }
    assert_eq!(refused(&[("OMPI_COMM_WORLD_SIZE", "2")]).var, "OMPI_COMM_WORLD_RANK");
    assert_eq!(refused(&[("PMI_RANK", "0")]).var, "PMI_SIZE");
    // DMLC_ROLE=worker agrees with the rule.
    assert!(detect_in(&one_node(&[("DMLC_ROLE", "worker")]), None).unwrap().is_some());
    // Empty values count as unset.
    assert_eq!(launch(&one_node(&[("SYNKV_ROOT_ADDR", ""), ("SYNKV_NUM_SERVERS", " ")])).num_servers, 1);
}

#[test]
fn servers_one_node_of_four() {
    // Rank 0 hosts the scheduler and the one server.
    assert_eq!(placements(1, 4, &[]), vec![(true, true), (false, false), (false, false), (false, false)]);
    assert_eq!(placements(1, 4, &[("SYNKV_NUM_SERVERS", "4")]), vec![(true, true), (false, true), (false, true), (false, true)]);
    assert_eq!(placements(1, 4, &[("SYNKV_NUM_SERVERS", "2")]), vec![(true, true), (false, true), (false, false), (false, false)]);
}

#[test]
fn servers_two_nodes_of_two() {
    // Default: one per node, on local rank 0 (ranks 0 and 2).
    assert_eq!(placements(2, 2, &[]), vec![(true, true), (false, false), (false, true), (false, false)]);
    // A third goes to local rank 1 of node 0 (order by local rank, then node).
    assert_eq!(placements(2, 2, &[("SYNKV_NUM_SERVERS", "3")]), vec![(true, true), (false, true), (false, true), (false, false)]);
    assert_eq!(placements(2, 2, &[("SYNKV_NUM_SERVERS", "1")]), vec![(true, true), (false, false), (false, false), (false, false)]);
}

#[test]
fn exactly_the_requested_servers_are_hosted() {
    for (nodes, per_node) in [(1, 1), (1, 3), (3, 1), (2, 4), (4, 2), (3, 3)] {
        for s in 1..=nodes * per_node {
            let hosted = (0..nodes * per_node)
                .filter(|r| {
                    let mut vars = torch(*r, nodes, per_node);
                    vars.push(("SYNKV_NUM_SERVERS", s.to_string()));
                    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    launch(&vars).placement().server
                })
                .count();
            assert_eq!(hosted, s as usize, "{nodes} nodes × {per_node}, {s} servers");
        }
    }
}

#[test]
fn the_worker_config_lays_the_launch_over_the_environment() {
    let vars = [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("SYNKV_NUM_SERVERS", "2"),
        ("SYNKV_TIMEOUT_MS", "3000"),
        ("PORT", "8080"),
    ];
    let c = Config::from_worker_map(vars, None).unwrap();
    assert_eq!((c.role, c.task_id, c.num_workers, c.num_servers), (Role::Worker, Some(1), 2, 2));
    assert_eq!((c.root_addr(), c.node_host.as_str(), c.port), ("127.0.0.1:29501".to_owned(), "127.0.0.1", None));
    assert_eq!(c.timeout.as_millis(), 3000);
    assert_eq!(c.placement, Some(Placement { source: Source::Torchrun, scheduler: false, server: true }));
    // The DMLC path is unchanged: no placement, DMLC_* read as is.
    let dmlc = [
        ("DMLC_PS_ROOT_URI", "10.0.0.1"),
        ("DMLC_PS_ROOT_PORT", "9000"),
        ("DMLC_NUM_SERVER", "1"),
        ("DMLC_NUM_WORKER", "3"),
        ("RANK", "7"),
    ];
    let c = Config::from_worker_map(dmlc, None).unwrap();
    assert_eq!((c.root_addr(), c.num_workers, c.task_id, c.placement), ("10.0.0.1:9000".to_owned(), 3, None, None));
    // Neither: the error names DMLC_PS_ROOT_URI and the alternatives.
    let e = Config::from_worker_map([("HOME", "/")], None).unwrap_err();
    assert_eq!(e.var, "DMLC_PS_ROOT_URI");
    assert!(e.to_string().contains("torchrun"), "{e}");
    // The rest of the configuration is checked as usual (SYNKV_SERVER_REPLICAS needs 2 servers).
    let e = Config::from_worker_map([("RANK", "0"), ("WORLD_SIZE", "1"), ("SYNKV_SERVER_REPLICAS", "1")], None).unwrap_err();
    assert_eq!(e.var, "SYNKV_SERVER_REPLICAS");
}

/// All processes of a launch over several nodes default to parts that pipeline over a
/// network; on one node, or with the size set, the usual rule holds.
#[test]
fn a_launch_over_several_nodes_defaults_to_network_sized_parts() {
    use crate::ps::config::{CROSS_HOST_PARTITION_BYTES, DEFAULT_PARTITION_BYTES};
    let parts = |vars: Vec<(&'static str, String)>| Config::from_worker_map(vars, Some("node1")).unwrap().partition_bytes;
    for rank in 0..8 {
        assert_eq!(parts(torch(rank, 2, 4)), CROSS_HOST_PARTITION_BYTES, "rank {rank} of 2 nodes");
        assert_eq!(parts(torch(rank, 1, 8)), DEFAULT_PARTITION_BYTES, "rank {rank} of 1 node");
    }
    let mut set = torch(5, 2, 4);
    set.push(("SYNKV_PARTITION_BYTES", "4194304".to_owned()));
    assert_eq!(parts(set), 4 << 20);
    let mut capped = torch(5, 2, 4);
    capped.push(("SYNKV_MAX_FRAME_BYTES", "2097152".to_owned()));
    assert_eq!(parts(capped), 256 << 10, "capped at SYNKV_MAX_FRAME_BYTES / 8");
}
