//! Helpers shared by the `dist_*` integration tests: configs on 127.0.0.1, a scheduler task,
//! concurrent joins, and a bound on every test.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::Duration;

use synkv::ps::{Cluster, Config, Listener, Role, Scheduler, Transport};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Every test body runs under this bound.
pub const TEST_BOUND: Duration = Duration::from_secs(60);

/// Runs `body`, failing the test if it takes longer than [`TEST_BOUND`].
pub async fn bounded<F: Future>(body: F) -> F::Output {
    tokio::time::timeout(TEST_BOUND, body).await.expect("test exceeded its time bound")
}

/// A config for a cluster whose scheduler listens on 127.0.0.1:`port`, with short timeouts.
pub fn config(port: u16, servers: u32, workers: u32, extra: &[(&str, &str)]) -> Config {
    let port = port.to_string();
    let (s, w) = (servers.to_string(), workers.to_string());
    let mut vars: Vec<(&str, &str)> = vec![
        ("DMLC_ROLE", "scheduler"),
        ("DMLC_PS_ROOT_URI", "127.0.0.1"),
        ("DMLC_PS_ROOT_PORT", &port),
        ("DMLC_NUM_SERVER", &s),
        ("DMLC_NUM_WORKER", &w),
        ("SYNKV_HEARTBEAT_INTERVAL_MS", "100"),
        ("SYNKV_HEARTBEAT_TIMEOUT_MS", "1000"),
        ("SYNKV_TIMEOUT_MS", "20000"),
    ];
    vars.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
    vars.extend_from_slice(extra);
    Config::from_map(vars).expect("test config")
}

/// A running scheduler task.
pub struct Running {
    pub config: Config,
    pub handle: JoinHandle<synkv::ps::Result<()>>,
    pub stop: CancellationToken,
}

/// Binds 127.0.0.1:0 on `transport` and runs a scheduler there.
pub async fn start_scheduler<T: Transport>(transport: &T, servers: u32, workers: u32, extra: &[(&str, &str)]) -> Running {
    let listener = transport.bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let port: u16 = addr.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).expect("port");
    let config = config(port, servers, workers, extra);
    let stop = CancellationToken::new();
    let handle = tokio::spawn(Scheduler::new(config.clone()).run(listener, stop.clone()));
    Running { config, handle, stop }
}

/// Joins one node per entry concurrently (advertising distinct ports 40000 + i) and returns
/// the handles in entry order.
pub async fn join_all<T: Transport>(transport: &T, base: &Config, nodes: &[(Role, Option<u32>)]) -> Vec<Cluster> {
    let joins = nodes.iter().enumerate().map(|(i, (role, task))| {
        let cfg = base.for_node(*role, *task);
        let t = transport.clone();
        let port = 40000 + u16::try_from(i).expect("few nodes");
        tokio::spawn(async move { Cluster::join(&t, &cfg, port, CancellationToken::new()).await })
    });
    let handles: Vec<_> = joins.collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("join task").expect("join"));
    }
    out
}
