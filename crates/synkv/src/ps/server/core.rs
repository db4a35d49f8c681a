//! The server's core, run on one dedicated thread (MXNet's server main thread): every
//! partition this server hosts (`partition/`), the worker connections' outboxes, and the
//! routing of events between them.
//!
//! Connection tasks hand it [`Event`]s; it answers through each connection's bounded outbox
//! and never waits: a connection whose outbox is full (its worker does not read the replies
//! it asked for) is closed. Because one thread owns everything, updates of an entry never run
//! concurrently (spec K8.12) and need no locks. The update work of rounds completed together
//! runs on [`UpdateThreads`] (`partition/batch.rs`); the kernels split large arrays.
//!
//! **Partitions.** A server holds its own partition (the key parts the slicer places on its
//! rank). With `SYNKV_SERVER_REPLICAS=1` it also keeps backup copies of other partitions,
//! changed only by their primaries' `Replicate` messages; when a primary dies, the scheduler's
//! failover promotes the copy and this server serves it too. A request names its partition
//! (header); one for a copy not promoted yet, or for a partition still waiting for its first
//! backup link, is *parked* and handled when that changes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rustc_hash::FxHashMap as HashMap;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::error::ServerError;
use super::partition::{Partition, Role};
use crate::ps::checkpoint::Shard;
use crate::ps::cluster::Absent;
use crate::ps::node::{NodeId, Rank};
use crate::ps::proto::{ErrorCode, Message};
use crate::ps::transport::share::BroadcastHub;
use crate::ps::transport::{Admission, Outbox};

/// What connection tasks, links and timers tell the core.
pub(super) enum Event {
    /// A worker's connection is authenticated: where its replies go, and how to close it.
    Opened { conn: u64, outbox: Outbox, close: CancellationToken },
    /// A data request or command from worker `worker`; `admission` returns the frame's
    /// ingress bytes once the core has handled it.
    Request { conn: u64, worker: Rank, msg: Message, admission: Admission },
    /// A `Replicate` message from the primary of a partition this server keeps a copy of.
    Replicate { msg: Message, admission: Admission },
    /// The backup of `partition` acknowledged its replication messages up to `seq`.
    ReplicaAck { partition: u32, seq: u64 },
    /// The backup link of a partition this server holds (`None`: it has no backup).
    Backup { partition: u32, link: Option<Outbox> },
    /// These partitions' primaries died: this server's copies serve them from now on.
    Promote(Vec<u32>),
    /// The connection ended; its waiting requests are forgotten.
    Closed { conn: u64 },
    /// The workers that finished so far (they push no more).
    WorkersDone(Absent),
    /// A clock tick (straggler reports).
    Tick,
    /// A message for every connection (a server's last word before it stops).
    Broadcast(Message),
}

/// Settings of the core (and of each partition, with its own rank).
#[derive(Clone, Debug)]
pub(super) struct Settings {
    /// This server's rank (its own partition) and the number of servers (named in
    /// checkpoints).
    pub(super) rank: u32,
    pub(super) num_servers: u32,
    pub(super) num_workers: u32,
    /// Bytes of pushes held (not folded) across all entries of a partition before folding
    /// starts.
    pub(super) held_budget: usize,
    /// How long a round may wait before it is reported.
    pub(super) straggler_warn: Duration,
    /// Largest optimizer-state page and replication batch (bytes).
    pub(super) page_bytes: usize,
    /// Whether partitions have backup copies (`SYNKV_SERVER_REPLICAS=1`): the own partition
    /// then waits for its backup link before serving.
    pub(super) replicas: bool,
    /// The server's broadcast segment, once a local worker connected: large values live in
    /// it (`entry.rs`), so answers to local workers name them instead of copying.
    pub(super) shared: Option<Arc<BroadcastHub>>,
    /// Where the update work of rounds completed together runs (`SYNKV_SERVER_THREADS`).
    pub(super) threads: UpdateThreads,
}

/// Where a server's update work runs (`SYNKV_SERVER_THREADS`, `partition/batch.rs`).
#[derive(Clone, Debug, Default)]
pub(super) enum UpdateThreads {
    /// On rayon's global pool, one thread per core (the default).
    #[default]
    Cores,
    /// On the core thread only (`SYNKV_SERVER_THREADS=1`).
    One,
    /// On a pool of its own (`SYNKV_SERVER_THREADS=n`, n > 1).
    Pool(Arc<rayon::ThreadPool>),
}

impl UpdateThreads {
    /// The threads for `SYNKV_SERVER_THREADS` (`None`: unset).
    pub(super) fn new(threads: Option<u32>) -> UpdateThreads {
        match threads {
            None => UpdateThreads::Cores,
            Some(1) => UpdateThreads::One,
            Some(n) => {
                let built = rayon::ThreadPoolBuilder::new()
                    .num_threads(usize::try_from(n).unwrap_or(1))
                    .thread_name(|i| format!("synkv-update-{i}"))
                    .build();
                match built {
                    Ok(pool) => UpdateThreads::Pool(Arc::new(pool)),
                    Err(e) => {
                        tracing::warn!("SYNKV_SERVER_THREADS={n}: cannot start the threads ({e}); using one per core");
                        UpdateThreads::Cores
                    }
                }
            }
        }
    }

    /// Threads the update work may use.
    pub(super) fn count(&self) -> usize {
        match self {
            UpdateThreads::Cores => rayon::current_num_threads(),
            UpdateThreads::One => 1,
            UpdateThreads::Pool(pool) => pool.current_num_threads(),
        }
    }

    /// Runs `f` where the update work runs (a pool's kernels split large arrays on it too).
    pub(super) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match self {
            UpdateThreads::Pool(pool) => pool.install(f),
            UpdateThreads::Cores | UpdateThreads::One => f(),
        }
    }
}

/// All of a server's state.
pub(super) struct Core {
    me: NodeId,
    settings: Settings,
    conns: HashMap<u64, (Outbox, CancellationToken)>,
    parts: BTreeMap<u32, Partition>,
    done: Absent,
    /// Partitions waiting for their first backup link.
    awaiting_backup: BTreeSet<u32>,
    /// Requests for a partition that cannot serve yet (see the module docs).
    parked: Vec<(u64, Rank, Message, Admission)>,
    /// Where completed backup copies are reported (the server tells the scheduler).
    ready: Option<mpsc::UnboundedSender<u32>>,
}

impl Core {
    /// A core holding this server's own partition (rank `settings.rank`).
    pub(super) fn new(me: NodeId, settings: Settings) -> Core {
        let mut parts = BTreeMap::new();
        parts.insert(settings.rank, Partition::new(settings.clone(), Role::Primary));
        let awaiting_backup = if settings.replicas { BTreeSet::from([settings.rank]) } else { BTreeSet::new() };
        Core { me, settings, conns: HashMap::default(), parts, done: Absent::default(), awaiting_backup, parked: Vec::new(), ready: None }
    }

    /// Reports completed backup copies on `ready`.
    pub(super) fn report_ready(&mut self, ready: mpsc::UnboundedSender<u32>) {
        self.ready = Some(ready);
    }

    /// Handles events until every sender is gone.
    pub(super) fn run(mut self, mut events: mpsc::Receiver<Event>) {
        // What this server added to the process-wide gauges (several servers may share them).
        let m = &crate::ps::metrics::METRICS.server;
        let (mut keys, mut queued) = (0i64, 0i64);
        while let Some(ev) = events.blocking_recv() {
            self.on_event(ev);
            let now_keys = i64::try_from(self.parts.values().map(Partition::num_keys).sum::<usize>()).unwrap_or(i64::MAX);
            let now_queued = i64::try_from(events.len()).unwrap_or(i64::MAX);
            m.keys.add(now_keys - keys);
            m.queue_depth.add(now_queued - queued);
            (keys, queued) = (now_keys, now_queued);
        }
        m.keys.add(-keys);
        m.queue_depth.add(-queued);
    }

    /// Bytes held by unfolded pushes (for tests).
    #[cfg(test)]
    pub(super) fn held_bytes(&self) -> usize {
        self.parts.values().map(Partition::held_bytes).sum()
    }

    pub(super) fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Opened { conn, outbox, close } => {
                self.conns.insert(conn, (outbox, close));
            }
            Event::Closed { conn } => {
                self.conns.remove(&conn);
                for p in self.parts.values_mut() {
                    p.closed(conn);
                }
                self.parked.retain(|(c, ..)| *c != conn);
            }
            Event::WorkersDone(done) => {
                self.done = done;
                for p in self.parts.values_mut() {
                    p.workers_done(&self.done);
                }
            }
            Event::Tick => {
                for p in self.parts.values_mut() {
                    p.report_stragglers(Instant::now());
                }
            }
            Event::Broadcast(msg) => {
                let conns: Vec<u64> = self.conns.keys().copied().collect();
                for conn in conns {
                    self.send(conn, msg.clone());
                }
            }
            Event::Request { conn, worker, msg, admission } => self.request(conn, worker, msg, admission),
            Event::Replicate { msg, admission } => {
                self.replicate(&msg);
                drop(admission);
            }
            Event::ReplicaAck { partition, seq } => {
                if let Some(p) = self.parts.get_mut(&partition) {
                    p.acked(seq);
                }
            }
            Event::Backup { partition, link } => {
                if let Some(p) = self.parts.get_mut(&partition) {
                    p.set_backup(self.me, link);
                }
                if self.awaiting_backup.remove(&partition) {
                    self.unpark();
                }
            }
            Event::Promote(partitions) => {
                for partition in partitions {
                    match self.parts.get_mut(&partition) {
                        Some(p) if p.role == Role::Replica => {
                            p.promote();
                            tracing::warn!("serving partition {partition} from its backup copy (its server died)");
                        }
                        Some(_) => {}
                        None => tracing::error!("partition {partition} moved here, but this server has no copy of it"),
                    }
                }
                self.unpark();
            }
        }
        self.deliver();
    }

    /// Routes a request to its partition (see the module docs).
    fn request(&mut self, conn: u64, worker: Rank, msg: Message, admission: Admission) {
        let partition = msg.partition.map_or(self.settings.rank, u32::from);
        match self.parts.get_mut(&partition) {
            Some(p) if p.role == Role::Primary && !self.awaiting_backup.contains(&partition) => {
                p.request(conn, worker, &msg);
                // The frame is handled: held pushes are accounted by the held budget now.
                drop(admission);
            }
            Some(_) => self.parked.push((conn, worker, msg, admission)),
            None => {
                let text = format!(
                    "partition {partition} is not held by server rank {}; are all nodes the same synkv version, with the same DMLC_NUM_SERVER?",
                    self.settings.rank
                );
                self.send(conn, ServerError::new(ErrorCode::Other, text).to_message(msg.request_id));
            }
        }
    }

    /// Handles the parked requests again (some may park again).
    fn unpark(&mut self) {
        for (conn, worker, msg, admission) in std::mem::take(&mut self.parked) {
            self.request(conn, worker, msg, admission);
        }
    }

    /// Applies a `Replicate` message to the backup copy it is about (a snapshot's `BEGIN`
    /// creates the copy).
    fn replicate(&mut self, msg: &Message) {
        let Some(partition) = msg.partition.map(u32::from) else {
            tracing::warn!("ignoring a Replicate without a partition");
            return;
        };
        let settings = Settings { rank: partition, ..self.settings.clone() };
        let done = &self.done;
        let p = self.parts.entry(partition).or_insert_with(|| {
            let mut p = Partition::new(settings, Role::Replica);
            p.workers_done(done);
            p
        });
        match p.replicated(msg) {
            Ok(true) => {
                tracing::info!("the backup copy of partition {partition} is complete");
                if let Some(ready) = &self.ready {
                    let _ = ready.send(partition);
                }
            }
            Ok(false) => {}
            Err(e) => tracing::error!("backup copy of partition {partition}: {e}"),
        }
    }

    /// Sends what the partitions produced.
    fn deliver(&mut self) {
        let mut out = Vec::new();
        for p in self.parts.values_mut() {
            out.append(&mut p.out);
        }
        for (conn, msg) in out {
            self.send(conn, msg);
        }
    }

    fn send(&mut self, conn: u64, msg: Message) {
        let Some((outbox, close)) = self.conns.get(&conn) else { return };
        if let Err(e) = outbox.try_send(msg.with_sender(self.me)) {
            // A connection gone is seen by its worker; one that does not read is closed.
            tracing::warn!("closing data connection {conn}: {e}");
            close.cancel();
            self.conns.remove(&conn);
        }
    }

    /// Restores a checkpoint's shard into the partition it belongs to (before any worker
    /// connects). Returns the key parts restored.
    pub(super) fn restore(&mut self, shard: Shard) -> Result<usize, ServerError> {
        let rank = shard.header.rank;
        let p = self
            .parts
            .get_mut(&rank)
            .ok_or_else(|| ServerError::invalid(format!("the shard of partition {rank} does not belong to this server")))?;
        p.restore(shard)
    }
}
