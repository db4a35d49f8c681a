//! [`Server`]: holds key shards, merges workers' pushes, runs the optimizer, answers pulls.
//!
//! A server binds its data listener (`DMLC_NODE_HOST:PORT`, any free port by default), joins
//! the cluster through [`Cluster`] advertising that port, then accepts worker connections. Each
//! connection authenticates exactly as with the scheduler (`SYNKV_SECRET`), then sends data
//! requests (`Push`, `Pull`, `PushPull`) and [`ServerCmd`]s. All key state lives in one core
//! thread (`core.rs`; the key table in `keys.rs`), fed by connection tasks (`conn.rs`) — the
//! shape of mini-redis's server, with the shared state behind a channel instead of a lock.
//!
//! [`Server::run`] returns `Ok` when the scheduler orders shutdown (every worker finished) or
//! `shutdown` is cancelled, and [`Error::LostPeer`] when a node dies (naming it). Before
//! returning it stops accepting, closes every connection, stops the core and leaves the
//! cluster; every step is bounded.
//!
//! Compressed pushes (flag `COMPRESSED`, spec K7.10) carry packed words and their
//! configuration; the server dequantizes each into the round's sum (or, for an assign,
//! straight into the value), so a round may even mix compressed and plain pushes.
//!
//! What a server deliberately does not do: checkpoint keys or recover a dead worker's
//! contribution to a round.

mod conn;
mod core;
mod keys;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::conn::{tell_all, ConnTask, Outboxes};
use self::core::Core;
use super::proto::Message;
use super::transport::{Listener, Transport};
use super::{Cluster, Config, Error, Result};

/// Connections allowed at once beyond one per worker.
const CONNECTION_SLACK: u32 = 64;
/// Time the farewell `NodeDead` gets to reach the workers before connections close.
const FAREWELL: Duration = Duration::from_millis(200);

/// The control commands a worker sends to every server (`ServerCommand`, `head` = id, body in
/// chunk 0). Ids follow MXNet's where one exists (spec K8.13); all are idempotent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerCmd {
    /// 0 (MXNet's `kController`): install the optimizer whose JSON
    /// ([`Optimizer::to_json`](crate::optimizer::Optimizer::to_json)) is the body. The same
    /// optimizer again keeps the optimizer states; a different one replaces them.
    SetOptimizer,
    /// 3 (`kSyncMode`): body `sync` or `async`.
    SyncMode,
    /// 6: reply with the optimizer states of this server's keys (chunk 0, the
    /// `optimizer::format` bytes).
    GetOptimizerStates,
    /// 7: load optimizer states (body: `optimizer::format` bytes for this server's keys).
    SetOptimizerStates,
}

impl ServerCmd {
    /// The wire id.
    pub const fn id(self) -> i32 {
        match self {
            ServerCmd::SetOptimizer => 0,
            ServerCmd::SyncMode => 3,
            ServerCmd::GetOptimizerStates => 6,
            ServerCmd::SetOptimizerStates => 7,
        }
    }

    /// The command with wire id `id`.
    pub const fn from_id(id: i32) -> Option<ServerCmd> {
        match id {
            0 => Some(ServerCmd::SetOptimizer),
            3 => Some(ServerCmd::SyncMode),
            6 => Some(ServerCmd::GetOptimizerStates),
            7 => Some(ServerCmd::SetOptimizerStates),
            _ => None,
        }
    }
}

/// A parameter server process's main object.
#[derive(Debug)]
pub struct Server {
    config: Config,
}

impl Server {
    /// A server of the cluster described by `config`.
    pub fn new(config: Config) -> Server {
        Server { config }
    }

    /// Binds `DMLC_NODE_HOST:PORT` (port 0 without `PORT`) on `transport`, then runs.
    pub async fn serve<T: Transport>(self, transport: &T, shutdown: CancellationToken) -> Result<()> {
        let host = &self.config.node_host;
        let port = self.config.port.unwrap_or(0);
        let addr = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        let listener = transport.bind(&addr).await?;
        self.run(transport, listener, shutdown).await
    }

    /// Joins the cluster advertising `listener`'s port and serves workers until shutdown.
    pub async fn run<T: Transport, L: Listener>(self, transport: &T, mut listener: L, shutdown: CancellationToken) -> Result<()> {
        let config = self.config;
        let addr = listener.local_addr()?;
        let port: u16 = addr
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .ok_or_else(|| Error::InvalidArgument(format!("listener address {addr} has no port")))?;
        let cluster = Cluster::join(transport, &config, port, shutdown.child_token()).await?;
        tracing::info!("{} serving on {addr}", cluster.me());

        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let core = Core::new(cluster.me().id, config.num_workers);
        let core_thread = std::thread::Builder::new().name("synkv-server".into()).spawn(move || core.run(events_rx))?;

        let accept_stop = CancellationToken::new();
        let conns = CancellationToken::new();
        let _guards = (accept_stop.clone().drop_guard(), conns.clone().drop_guard());
        let tracker = TaskTracker::new();
        let outboxes = Outboxes::default();
        let accept_outboxes = Arc::clone(&outboxes);
        let permits = Arc::new(Semaphore::new(usize::try_from(config.num_workers + CONNECTION_SLACK).unwrap_or(usize::MAX)));
        let (accept_token, conn_token, accept_tracker, accept_config) =
            (accept_stop.clone(), conns.clone(), tracker.clone(), config.clone());
        tracker.spawn(async move {
            let mut next_id = 0u64;
            loop {
                let permit = tokio::select! {
                    p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
                    () = accept_token.cancelled() => return,
                };
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    () = accept_token.cancelled() => return,
                };
                match accepted {
                    Ok((conn, peer)) => {
                        next_id += 1;
                        tracing::debug!("data connection {next_id} from {peer}");
                        let task = ConnTask {
                            id: next_id,
                            conn,
                            config: accept_config.clone(),
                            events: events_tx.clone(),
                            token: conn_token.child_token(),
                            tracker: accept_tracker.clone(),
                            outboxes: Arc::clone(&accept_outboxes),
                        };
                        accept_tracker.spawn(async move {
                            task.run().await;
                            drop(permit);
                        });
                    }
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        drop(permit);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        });

        let outcome = tokio::select! {
            r = cluster.wait_shutdown() => r,
            () = shutdown.cancelled() => Ok(()),
        };
        match &outcome {
            Ok(()) => tracing::info!("{} shutting down", cluster.me()),
            Err(e) => {
                tracing::error!("{} stopping: {e}", cluster.me());
                // Tell the workers why, so they report the dead node rather than this server.
                if let Error::LostPeer { node, reason } = e {
                    tell_all(&outboxes, &Message::node_dead(node.clone(), reason).with_sender(cluster.me().id));
                    tokio::time::sleep(FAREWELL).await;
                }
            }
        }

        // Stop accepting, close every connection, let the core drain, leave the cluster.
        accept_stop.cancel();
        conns.cancel();
        tracker.close();
        if tokio::time::timeout(config.heartbeat_timeout, tracker.wait()).await.is_err() {
            tracing::warn!("connections did not close within {:?}", config.heartbeat_timeout);
        }
        let joined = tokio::task::spawn_blocking(move || core_thread.join());
        if tokio::time::timeout(config.heartbeat_timeout, joined).await.is_err() {
            tracing::warn!("the server core did not stop within {:?}", config.heartbeat_timeout);
        }
        cluster.close().await;
        outcome
    }
}
