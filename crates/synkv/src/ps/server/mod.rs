//! [`Server`]: holds key shards, merges workers' pushes, runs the optimizer, answers pulls.
//!
//! A server binds its data listener (`DMLC_NODE_HOST:PORT`, any free port by default), joins
//! the cluster through [`Cluster`] advertising that port, then accepts worker connections. Each
//! connection authenticates exactly as with the scheduler (`SYNKV_SECRET`), then sends data
//! requests (`Push`, `Pull`, `PushPull`) and [`ServerCmd`]s. All key state lives in one core
//! thread (`core.rs`), fed by connection tasks (`conn.rs`) through a bounded queue — the shape
//! of mini-redis's server, with the shared state behind a channel instead of a lock.
//!
//! ## Organization
//! - `core.rs` — routing events to the partitions this server holds or keeps copies of;
//!   where update work runs (`SYNKV_SERVER_THREADS`).
//! - `partition/` — one partition's state machine: requests, rounds, commands, straggler
//!   reports; `replica.rs` its replication to (or as) a backup copy; `batch.rs` the rounds one
//!   request completes, updated side by side.
//! - `link.rs` — a primary's connection to its backup.
//! - `entry.rs` — one key part (its `EntryKey`: ps key and offset): value, accumulator, updates.
//! - `round.rs` — a sync round and the round-id rules (duplicates refused).
//! - `value.rs` — data messages as per-key items; `states.rs` — optimizer states in pages,
//!   statistics; `error.rs` — typed refusals; `conn.rs` — one worker connection.
//!
//! ## Memory
//! Bounded whatever the number of workers, by budgets derived from `SYNKV_PARTITION_BYTES`
//! ([`Config::ingress_bytes`], [`Config::held_bytes`], [`Config::outbox_bytes`]): received
//! frames wait for room in a shared ingress budget before their bodies are read (TCP pushes
//! back on the senders), a sync round folds pushes into the key's accumulator once the held
//! budget is spent, and a connection whose worker does not read its replies is closed.
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
//! Checkpoints (`Checkpoint` command, restore at start) write and read each partition's shard;
//! with `SYNKV_SERVER_REPLICAS=1` every partition has a backup copy on another server
//! (`partition/replica.rs`, `link.rs`, [`Links`]) and a dead server's partitions fail over.
//! What a server does not do: recover a dead worker's contribution to a round.

mod conn;
mod core;
mod entry;
mod error;
#[cfg(any(fuzzing, test))]
pub mod fuzz;
mod link;
mod partition;
mod round;
mod states;
#[cfg(test)]
mod tests;
mod value;

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::conn::ConnTask;
use self::core::{Core, Event, Settings, UpdateThreads};
use super::checkpoint;
use super::node::Role;
use super::proto::Message;
use super::topology::Topology;
use super::transport::{accept_loop, Gate, Ingress, Listener, Transport, HANDSHAKE_DEADLINE};
use super::{Cluster, Config, Error, Result};

/// Connections allowed at once beyond [`Config::max_streams`] per worker.
const CONNECTION_SLACK: u32 = 64;
/// Time the farewell `NodeDead` gets to reach the workers before connections close.
const FAREWELL: Duration = Duration::from_millis(200);
/// Events queued for the core at most (their frames are bounded by the ingress budget).
const EVENTS: usize = 1024;

/// Restores server `rank`'s shard of the checkpoint in `dir`, if `dir` has one (`started`:
/// when the server started, for the log).
fn restore(core: &mut Core, dir: &std::path::Path, rank: u32, config: &Config, started: std::time::Instant) -> Result<()> {
    let fail = |e: String| Error::InvalidArgument(format!("SYNKV_CHECKPOINT_DIR={}: {e}", dir.display()));
    let Some(manifest) = checkpoint::read_manifest(dir).map_err(|e| fail(e.to_string()))? else {
        tracing::info!("no checkpoint in {} yet: starting empty", dir.display());
        return Ok(());
    };
    if manifest.num_servers != config.num_servers {
        return Err(fail(format!(
            "checkpoint {} was taken with {} servers; restart with DMLC_NUM_SERVER={} (or another directory)",
            manifest.id, manifest.num_servers, manifest.num_servers
        )));
    }
    let path = manifest.shard_path(dir, rank).ok_or_else(|| fail(format!("checkpoint {} has no shard for server {rank}", manifest.id)))?;
    let reading = std::time::Instant::now();
    let shard = checkpoint::read_shard(&path).map_err(|e| fail(e.to_string()))?;
    let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
    let parts = core.restore(shard).map_err(|e| fail(e.to_string()))?;
    tracing::warn!(
        "restored checkpoint {} (round {}) from {}: {parts} key parts, {bytes} bytes read and checked in {:.2} s; serving {:.2} s after the server started",
        manifest.id,
        manifest.round,
        path.display(),
        reading.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

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
    /// 6: reply with a page of the optimizer states of this server's keys (chunk 0, the
    /// `optimizer::format` bytes; the cursor protocol is in `states.rs`).
    GetOptimizerStates,
    /// 7: load optimizer states (body: `optimizer::format` bytes for this server's keys).
    SetOptimizerStates,
    /// 8: reply with the server's statistics as JSON (resident memory now and at its peak,
    /// key parts, held bytes, waiting requests).
    Stats,
    /// 9: write this server's shard of a checkpoint (body: JSON `{"dir": path, "id": n}`;
    /// reply: the shard file's description as JSON, `ps::checkpoint::ShardFile`).
    Checkpoint,
}

impl ServerCmd {
    /// The wire id.
    pub const fn id(self) -> i32 {
        match self {
            ServerCmd::SetOptimizer => 0,
            ServerCmd::SyncMode => 3,
            ServerCmd::GetOptimizerStates => 6,
            ServerCmd::SetOptimizerStates => 7,
            ServerCmd::Stats => 8,
            ServerCmd::Checkpoint => 9,
        }
    }

    /// The command with wire id `id`.
    pub const fn from_id(id: i32) -> Option<ServerCmd> {
        match id {
            0 => Some(ServerCmd::SetOptimizer),
            3 => Some(ServerCmd::SyncMode),
            6 => Some(ServerCmd::GetOptimizerStates),
            7 => Some(ServerCmd::SetOptimizerStates),
            8 => Some(ServerCmd::Stats),
            9 => Some(ServerCmd::Checkpoint),
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
        self.config.check_listen(host)?;
        let listener = transport.bind(&addr).await?;
        self.run(transport, listener, shutdown).await
    }

    /// Joins the cluster advertising `listener`'s port and serves workers until shutdown.
    pub async fn run<T: Transport, L: Listener>(self, transport: &T, listener: L, shutdown: CancellationToken) -> Result<()> {
        let started = std::time::Instant::now();
        crate::ps::metrics::start(crate::ps::Role::Server);
        let config = self.config;
        let addr = listener.local_addr()?;
        let port: u16 = addr
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .ok_or_else(|| Error::InvalidArgument(format!("listener address {addr} has no port")))?;
        let cluster = Cluster::join(transport, &config, port, shutdown.child_token()).await?;
        super::trace::start(Role::Server, cluster.rank(), &config.trace);
        tracing::info!("{} serving on {addr}", cluster.me());

        let (events_tx, events_rx) = mpsc::channel(EVENTS);
        let broadcast = std::sync::Arc::new(crate::ps::transport::share::BroadcastHub::default());
        let settings = Settings {
            rank: cluster.rank(),
            num_servers: config.num_servers,
            num_workers: config.num_workers,
            held_budget: usize::try_from(config.held_bytes()).unwrap_or(usize::MAX),
            straggler_warn: config.straggler_warn,
            page_bytes: usize::try_from(config.partition_bytes).unwrap_or(usize::MAX),
            replicas: config.replicas > 0,
            shared: Some(std::sync::Arc::clone(&broadcast)),
            threads: UpdateThreads::new(config.server_threads),
        };
        let mut core = Core::new(cluster.me().id, settings);
        let (ready_tx, ready_rx) = mpsc::unbounded_channel();
        if config.replicas > 0 {
            core.report_ready(ready_tx);
        }
        if let Some(dir) = config.checkpoint_dir.clone() {
            // Reading a large shard blocks: off the runtime, so heartbeats go on meanwhile.
            let (rank, restore_config) = (cluster.rank(), config.clone());
            core = tokio::task::spawn_blocking(move || restore(&mut core, &dir, rank, &restore_config, started).map(|()| core))
                .await
                .map_err(|e| Error::Io(std::io::Error::other(format!("restoring the checkpoint stopped: {e}"))))??;
        }
        let core_thread = std::thread::Builder::new().name("synkv-server".into()).spawn(move || core.run(events_rx))?;

        let accept_stop = CancellationToken::new();
        let conns = CancellationToken::new();
        let _guards = (accept_stop.clone().drop_guard(), conns.clone().drop_guard());
        let tracker = TaskTracker::new();
        let workers = config.num_workers.saturating_mul(config.max_streams());
        let established = usize::try_from(workers.saturating_add(config.num_servers + CONNECTION_SLACK)).unwrap_or(usize::MAX);
        let gate = Gate::new(established, HANDSHAKE_DEADLINE.min(config.heartbeat_timeout));
        // Pushes held unsummed keep their frames' allocations past their admission.
        let ingress = Ingress::new(config.ingress_bytes()).pooling(config.ingress_bytes() + config.held_bytes());
        let (conn_token, conn_tracker, conn_config, conn_events) = (conns.clone(), tracker.clone(), config.clone(), events_tx.clone());
        let me = cluster.me().id;
        tracker.spawn(accept_loop(listener, gate, accept_stop.clone(), move |id, conn, _peer, pending| {
            let task = ConnTask {
                id,
                me,
                conn,
                config: conn_config.clone(),
                events: conn_events.clone(),
                token: conn_token.child_token(),
                tracker: conn_tracker.clone(),
                ingress: ingress.clone(),
                broadcast: std::sync::Arc::clone(&broadcast),
            };
            conn_tracker.spawn(task.run(pending));
        }));
        // The clock of straggler reports, and the workers that finished.
        let tick = (config.straggler_warn / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let (ticks, stop_ticks) = (events_tx.clone(), accept_stop.clone());
        tracker.spawn(async move {
            let mut every = tokio::time::interval(tick);
            loop {
                tokio::select! {
                    _ = every.tick() => { let _ = ticks.try_send(Event::Tick); }
                    () = stop_ticks.cancelled() => return,
                }
            }
        });
        let (mut done, done_events, stop_done) = (cluster.done_workers(), events_tx.clone(), accept_stop.clone());
        tracker.spawn(async move {
            loop {
                tokio::select! {
                    changed = done.changed() => if changed.is_err() { return },
                    () = stop_done.cancelled() => return,
                }
                let set = done.borrow_and_update().clone();
                if done_events.send(Event::WorkersDone(set)).await.is_err() {
                    return;
                }
            }
        });

        let replication = async {
            if config.replicas > 0 {
                let (lost_tx, lost_rx) = mpsc::unbounded_channel();
                let links = Links {
                    transport,
                    config: &config,
                    cluster: &cluster,
                    events: events_tx.clone(),
                    lost: lost_tx,
                    stop: conns.clone(),
                    tracker: &tracker,
                };
                links.supervise(ready_rx, lost_rx).await?;
            }
            std::future::pending::<Result<()>>().await
        };
        let outcome = tokio::select! {
            r = cluster.wait_shutdown() => r,
            () = shutdown.cancelled() => Ok(()),
            r = replication => r,
        };
        match &outcome {
            Ok(()) => tracing::info!("{} shutting down", cluster.me()),
            Err(e) => {
                tracing::error!("{} stopping: {e}", cluster.me());
                super::trace::dump_error(Role::Server, e);
                // Tell the workers why, so they report the dead node rather than this server.
                if let Error::LostPeer { node, reason } = e {
                    let farewell = Message::node_dead(node.clone(), reason).with_sender(cluster.me().id);
                    let _ = events_tx.send(Event::Broadcast(farewell)).await;
                    tokio::time::sleep(FAREWELL).await;
                }
            }
        }

        // Stop accepting, close every connection, let the core drain, leave the cluster.
        accept_stop.cancel();
        conns.cancel();
        drop(events_tx);
        tracker.close();
        if tokio::time::timeout(config.heartbeat_timeout, tracker.wait()).await.is_err() {
            tracing::warn!("connections did not close within {:?}", config.heartbeat_timeout);
        }
        let joined = tokio::task::spawn_blocking(move || core_thread.join());
        if tokio::time::timeout(config.heartbeat_timeout, joined).await.is_err() {
            tracing::warn!("the server core did not stop within {:?}", config.heartbeat_timeout);
        }
        cluster.close().await;
        super::trace::finish(Role::Server);
        outcome
    }
}

/// The replication links of the partitions a server holds (`SYNKV_SERVER_REPLICAS=1`), kept
/// in step with the cluster's failovers.
struct Links<'a, T> {
    transport: &'a T,
    config: &'a Config,
    cluster: &'a Cluster,
    events: mpsc::Sender<Event>,
    lost: mpsc::UnboundedSender<link::Lost>,
    stop: CancellationToken,
    tracker: &'a TaskTracker,
}

impl<T: Transport> Links<'_, T> {
    /// Links each partition this server holds to its backup, and again after each failover
    /// (promoting the copies of the partitions it takes over); reports completed copies to
    /// the scheduler. Returns when the cluster closes, or an error when a link to a live
    /// backup broke (this server cannot replicate any more: it stops, and fails over).
    async fn supervise(&self, mut ready: mpsc::UnboundedReceiver<u32>, mut lost: mpsc::UnboundedReceiver<link::Lost>) -> Result<()> {
        let me = self.cluster.rank();
        let mut topology = Topology::new(self.config.num_servers);
        let mut linked: BTreeMap<u32, Option<u32>> = BTreeMap::new();
        let mut dead = self.cluster.dead_servers();
        let done = self.cluster.done_workers();
        let mut seen = 0;
        // Links that ended, waiting for their backup's death to be announced.
        let mut broken: Vec<(link::Lost, tokio::time::Instant)> = Vec::new();
        let verdict = self.config.heartbeat_timeout * 2 + Duration::from_secs(1);
        self.relink(&topology, &mut linked, me).await;
        loop {
            let next_deadline = broken.iter().map(|(_, d)| *d).min();
            let expired = async {
                match next_deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some(p) = ready.recv() => {
                    if let Err(e) = self.cluster.replica_ready(p).await {
                        tracing::warn!("could not report the backup copy of partition {p}: {e}");
                    }
                }
                Some(gone) = lost.recv() => {
                    let current = linked.get(&gone.partition).copied().flatten() == Some(gone.backup);
                    if current && topology.alive(gone.backup) {
                        broken.push((gone, tokio::time::Instant::now() + verdict));
                    }
                }
                () = expired => {
                    let now = tokio::time::Instant::now();
                    broken.retain(|(l, _)| topology.alive(l.backup));
                    if done.borrow().ranks.len() >= usize::try_from(self.config.num_workers).unwrap_or(usize::MAX) {
                        // The job is over: backups leave as they please.
                        broken.clear();
                    }
                    if let Some((l, _)) = broken.iter().find(|(_, d)| *d <= now) {
                        return Err(Error::Io(std::io::Error::other(format!(
                            "the replication link of partition {} to server rank {} broke, and that server is alive: this server cannot keep its backup up to date, so it stops and its partitions fail over",
                            l.partition, l.backup
                        ))));
                    }
                }
                changed = dead.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    let now: Vec<u32> = dead.borrow_and_update().clone();
                    for rank in now.iter().skip(seen) {
                        let before = topology.held_by(me);
                        topology.kill(*rank);
                        let promoted: Vec<u32> = topology.held_by(me).into_iter().filter(|p| !before.contains(p)).collect();
                        if !promoted.is_empty() && self.events.send(Event::Promote(promoted)).await.is_err() {
                            return Ok(());
                        }
                    }
                    seen = now.len();
                    broken.retain(|(l, _)| topology.alive(l.backup));
                    self.relink(&topology, &mut linked, me).await;
                }
            }
        }
    }

    /// Gives every partition this server holds a link to its current backup (or none).
    async fn relink(&self, topology: &Topology, linked: &mut BTreeMap<u32, Option<u32>>, me: u32) {
        for p in topology.held_by(me) {
            let want = topology.backup(p);
            if linked.get(&p) == Some(&want) {
                continue;
            }
            linked.insert(p, want);
            let node = want.and_then(|b| self.cluster.nodes_of(Role::Server).into_iter().find(|n| n.rank == Some(b)).cloned());
            let link = match node {
                Some(node) => {
                    let reports = link::Reports { events: self.events.clone(), lost: self.lost.clone() };
                    let ends = (self.cluster.me().id, &node);
                    match link::connect(self.transport, self.config, ends, p, reports, self.stop.child_token(), self.tracker).await {
                        Ok(outbox) => Some(outbox),
                        Err(e) => {
                            tracing::error!("partition {p} has no backup: linking to {node} failed: {e}");
                            None
                        }
                    }
                }
                None => {
                    tracing::warn!("partition {p} has no backup: no other server is alive");
                    None
                }
            };
            if self.events.send(Event::Backup { partition: p, link }).await.is_err() {
                return;
            }
        }
    }
}
