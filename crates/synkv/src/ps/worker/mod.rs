//! [`Worker`]: a worker process's membership of the cluster and its server connections.
//!
//! [`Worker::connect`] joins the cluster through [`Cluster`] (workers listen on no port; they
//! advertise port 0), then connects to every server ([`Client`]). A background task watches
//! the cluster and fails every pending and later request as soon as a node is reported dead.
//!
//! The worker knows nothing of keys or arrays: the store (`store::distributed`) slices its values
//! into messages ([`slicer`](crate::ps::slicer), [`codec`](crate::ps::codec)) and sends
//! them through the [`Client`]. Shutdown: [`Worker::finish`] stops the connections, tells the
//! scheduler this worker is done and waits (bounded) until every worker is.

mod client;

use tokio_util::sync::CancellationToken;

pub use self::client::{wait_each, Client, Waiter};
use super::node::{Group, Rank, Role};
use super::transport::Transport;
use super::{Cluster, Config, Result};

/// A worker's handle on the cluster.
#[derive(Debug)]
pub struct Worker {
    cluster: Cluster,
    client: Client,
    /// How long closing the server connections may take.
    close_within: std::time::Duration,
}

impl Worker {
    /// Joins the cluster as a worker and connects to every server.
    pub async fn connect<T: Transport>(transport: &T, config: &Config, shutdown: CancellationToken) -> Result<Worker> {
        crate::ps::metrics::start(Role::Worker);
        let cluster = Cluster::join(transport, config, 0, shutdown).await?;
        super::trace::start(Role::Worker, cluster.rank(), &config.trace);
        let servers = cluster.nodes_of(Role::Server).into_iter().cloned().collect();
        let client = Client::connect(transport, config, cluster.me().id, servers).await?;
        let watched = client.clone();
        let failed = cluster.failure_signal();
        tokio::spawn(async move {
            let e = failed.await;
            watched.fail_all(&e);
        });
        if config.replicas > 0 {
            // Failovers: requests waiting on a dead server go to the new holders.
            let (routed, mut dead) = (client.clone(), cluster.dead_servers());
            tokio::spawn(async move {
                let mut seen = 0;
                loop {
                    let now: Vec<u32> = dead.borrow_and_update().clone();
                    for rank in now.iter().skip(seen) {
                        routed.failover(*rank);
                    }
                    seen = now.len();
                    if dead.changed().await.is_err() {
                        return;
                    }
                }
            });
        }
        tracing::info!("{} connected to {} servers", cluster.me(), client.num_servers());
        Ok(Worker { cluster, client, close_within: config.timeout.min(std::time::Duration::from_secs(10)) })
    }

    /// A handle for sending requests to servers.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The cluster membership (node list, ranks).
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Whether this worker took the rank of one that died (`SYNKV_WORKER_RESTARTS=1`).
    pub fn rejoined(&self) -> bool {
        self.cluster.rejoined()
    }

    /// This worker's rank.
    pub fn rank(&self) -> Rank {
        self.cluster.rank()
    }

    /// `DMLC_NUM_WORKER`.
    pub fn num_workers(&self) -> u32 {
        self.cluster.num_workers()
    }

    /// `DMLC_NUM_SERVER`.
    pub fn num_servers(&self) -> u32 {
        self.cluster.num_servers()
    }

    /// Blocks until every worker reached this barrier (MXNet's `_barrier`; finished workers
    /// count as arrived), as long as every node is alive; fails if a node dies meanwhile.
    pub async fn barrier(&self) -> Result<()> {
        let rec = super::trace::recorder(Role::Worker);
        let started = rec.enabled().then(std::time::Instant::now);
        let result = self.cluster.barrier(Group::WORKERS).await;
        if let Some(t) = started {
            rec.record(super::trace::Span::new(super::trace::Op::Barrier, t, std::time::Instant::now()).ok(result.is_ok()));
        }
        result
    }

    /// Stops the server connections, tells the scheduler this worker is done and waits until
    /// every worker is (the scheduler then stops the servers). No deadline: the other workers
    /// may train for hours more; it ends by the shutdown order or by failure detection.
    pub async fn finish(self) -> Result<()> {
        self.client.close(self.close_within).await;
        self.cluster.finish().await
    }
}
