//! [`Cluster`]: a server's or worker's view of the cluster — ps-lite's `Postoffice`, as a
//! value rather than a singleton.
//!
//! [`Cluster::join`] connects to the scheduler (retrying until it is up, within
//! `SYNKV_TIMEOUT_MS`), authenticates, registers and waits for the node list; from then on
//! the handle knows every node's role, rank, id and address. Background tasks (tracked, and
//! stopped when the handle is closed or dropped) heartbeat to the scheduler and watch for its
//! answers.
//!
//! Failure: when the scheduler reports a dead node, or the scheduler itself goes silent for
//! `SYNKV_HEARTBEAT_TIMEOUT_MS` or drops the connection, every pending wait fails and every
//! later one returns the same [`Error::LostPeer`] naming the node. Higher layers `select!` on
//! [`Cluster::failed`] to fail their own waits.
//!
//! Waits: barriers and a worker's [`Cluster::finish`] last as long as every node is alive —
//! they end by failure detection (a dead node, a silent scheduler), never by a fixed deadline,
//! so a slow worker (a long validation, a checkpoint, an uneven last epoch) is not mistaken for
//! a dead one. Only the rendezvous is bounded by `SYNKV_TIMEOUT_MS` (nodes that never come
//! cannot be detected any other way).
//!
//! Shutdown: a worker calls [`Cluster::finish`] (tell the scheduler it is done, wait until
//! every worker is); a server awaits [`Cluster::wait_shutdown`], then [`Cluster::close`]s.
//! [`Cluster::done_workers`] follows the workers that finished (`NodeDone`).

mod shared;

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use self::shared::{heartbeat_loop, read_loop, write_loop, Shared};
use super::node::{Group, Node, Rank, Role};
use super::proto::{Command, Limits, Message};
use super::transport::{Connection, Outbox, Transport};
use super::{auth, Config, Error, Result};

/// Messages a node may queue for the scheduler.
const OUTBOX: usize = 256;

/// A joined node's handle on the cluster.
#[derive(Debug)]
pub struct Cluster {
    me: Node,
    rejoined: bool,
    nodes: Vec<Node>,
    config: Config,
    shared: Arc<Shared>,
    outbox: Outbox,
    stop: CancellationToken,
    tracker: TaskTracker,
    _guard: DropGuard,
}

async fn connect_with_retry<T: Transport>(transport: &T, addr: &str, deadline: Instant, config: &Config) -> Result<Connection> {
    let mut backoff = std::time::Duration::from_millis(20);
    loop {
        let attempt = tokio::time::timeout_at(deadline, transport.connect(addr)).await;
        match attempt {
            Ok(Ok(conn)) => return Ok(conn),
            Ok(Err(e)) if Instant::now() + backoff < deadline => {
                tracing::debug!("scheduler at {addr} not reachable yet: {e}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(1));
            }
            Ok(Err(e)) => return Err(Error::timeout(format!("the scheduler at {addr} (last error: {e})"), config.timeout)),
            Err(_) => return Err(Error::timeout(format!("a connection to the scheduler at {addr}"), config.timeout)),
        }
    }
}

impl Cluster {
    /// Joins the cluster as `config.role`, advertising `config.node_host:port` (the port this
    /// node's data listener is bound to; 0 if it has none). Waits at most `SYNKV_TIMEOUT_MS`
    /// for the whole rendezvous. Cancelling `shutdown` stops the background tasks and fails
    /// every wait with [`Error::Shutdown`].
    pub async fn join<T: Transport>(transport: &T, config: &Config, port: u16, shutdown: CancellationToken) -> Result<Cluster> {
        if config.role == Role::Scheduler {
            return Err(Error::InvalidArgument("the scheduler does not join; run a Scheduler instead".into()));
        }
        let deadline = Instant::now() + config.timeout;
        let root = config.root_addr();
        let scheduler = config.scheduler_node();
        let me = Node::unassigned(config.role, config.node_host.clone(), port, config.task_id);
        let connected = async {
            let mut backoff = std::time::Duration::from_millis(20);
            loop {
                let mut conn = connect_with_retry(transport, &root, deadline, config).await?;
                conn.set_limits(conn.limits().capped(Limits::CONTROL_FRAME_BYTES));
                let who = auth::Identity::new(config.role, crate::ps::node::NodeId::NONE);
                match auth::connect(&mut conn, config.secret.as_ref(), who, Role::Scheduler, config.timeout).await {
                    Ok(()) => {}
                    // The scheduler may be busy with other connections' handshakes.
                    Err(e) if auth::retryable(&e) && Instant::now() + backoff < deadline => {
                        tracing::debug!("handshake with the scheduler at {root} failed, trying again: {e}");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(std::time::Duration::from_secs(1));
                        continue;
                    }
                    Err(e) => return Err(e),
                }
                conn.write_message(&Message::register(me.clone())).await?;
                break Ok::<_, Error>(conn);
            }
        };
        let conn = tokio::select! {
            c = connected => c?,
            () = shutdown.cancelled() => return Err(Error::Shutdown("cancelled while joining".into())),
        };

        let (list_tx, list_rx) = oneshot::channel();
        let shared = Shared::new(scheduler.clone(), list_tx, config.role);
        let stop = shutdown.child_token();
        let guard = stop.clone().drop_guard();
        let tracker = TaskTracker::new();
        let (reader, writer) = conn.into_split();
        let (outbox, rx) = Outbox::bounded(OUTBOX, 2 * Limits::CONTROL_FRAME_BYTES);
        tracker.spawn(read_loop(reader, shared.clone(), stop.clone()));
        tracker.spawn(write_loop(writer, rx, shared.clone(), stop.clone(), config.timeout));
        tracker.spawn(heartbeat_loop(outbox.clone(), shared.clone(), stop.clone(), config.heartbeat_interval, config.heartbeat_timeout));
        tracker.close();

        // A little longer than the scheduler's own rendezvous deadline, so its diagnosis (who
        // is missing) arrives before we give up on our own.
        let list_deadline = deadline + config.heartbeat_interval;
        let mut status = shared.status.subscribe();
        let list = tokio::select! {
            m = list_rx => m.ok(),
            _ = status.wait_for(|s| s.failure.is_some() || s.shutdown_ordered) => None,
            () = tokio::time::sleep_until(list_deadline) => {
                return Err(Error::timeout(format!("the node list from the scheduler at {root} (rendezvous)"), config.timeout));
            }
        };
        let Some(list) = list else {
            return Err(shared
                .failure()
                .map_or_else(|| Error::Shutdown("the scheduler shut down before rendezvous".into()), |f| f.to_error()));
        };
        let (me, nodes) = validate_node_list(&list, &me, config, &scheduler)?;
        let rejoined = list.meta.text == crate::ps::scheduler::REJOIN;
        if rejoined {
            tracing::warn!("joined the running job as {me}, in the place of a worker that died");
        } else {
            tracing::info!("joined the cluster as {me}");
        }
        Ok(Cluster { me, rejoined, nodes, config: config.clone(), shared, outbox, stop, tracker, _guard: guard })
    }

    /// This node, with its id and rank.
    pub fn me(&self) -> &Node {
        &self.me
    }

    /// This node's role.
    pub fn role(&self) -> Role {
        self.me.role
    }

    /// This node's rank within its role.
    pub fn rank(&self) -> Rank {
        self.me.rank.unwrap_or(0)
    }

    /// Every node, the scheduler included, ordered by id.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The scheduler.
    pub fn scheduler(&self) -> &Node {
        &self.shared.scheduler
    }

    /// The nodes of `role`, ordered by rank.
    pub fn nodes_of(&self, role: Role) -> Vec<&Node> {
        let mut v: Vec<&Node> = self.nodes.iter().filter(|n| n.role == role).collect();
        v.sort_by_key(|n| n.rank);
        v
    }

    /// `DMLC_NUM_SERVER`.
    pub fn num_servers(&self) -> u32 {
        self.config.num_servers
    }

    /// `DMLC_NUM_WORKER` (also on servers, as in MXNet).
    pub fn num_workers(&self) -> u32 {
        self.config.num_workers
    }

    /// `Err` with the recorded failure if the cluster has failed.
    pub fn check(&self) -> Result<()> {
        self.shared.failure().map_or(Ok(()), |f| Err(f.to_error()))
    }

    /// Resolves with the cluster's failure when there is one (for `select!`).
    pub async fn failed(&self) -> Error {
        let mut status = self.shared.status.subscribe();
        let failure = status.wait_for(|s| s.failure.is_some()).await.ok().and_then(|s| s.failure.clone());
        failure.map_or_else(|| Error::Shutdown("cluster closed".into()), |f| f.to_error())
    }

    /// Like [`Cluster::failed`], but owning what it needs, so it can be spawned and outlive
    /// the borrow of this handle.
    pub fn failure_signal(&self) -> impl std::future::Future<Output = Error> + Send + 'static {
        let shared = Arc::clone(&self.shared);
        async move {
            let mut status = shared.status.subscribe();
            let failure = status.wait_for(|s| s.failure.is_some()).await.ok().and_then(|s| s.failure.clone());
            failure.map_or_else(|| Error::Shutdown("cluster closed".into()), |f| f.to_error())
        }
    }

    /// Queues `msg` for the scheduler. The outbox drains as long as the scheduler reads; a
    /// scheduler that stops reading is detected by the writer's stall timeout.
    async fn send(&self, msg: Message) -> Result<()> {
        match self.outbox.send(msg.with_sender(self.me.id)).await {
            Ok(()) => Ok(()),
            Err(_) => Err(self.closed_error()),
        }
    }

    fn closed_error(&self) -> Error {
        self.shared.failure().map_or_else(|| Error::Shutdown("cluster closed".into()), |f| f.to_error())
    }

    /// Blocks until every member of `group` reached this barrier (finished workers count as
    /// arrived). No deadline: it waits as long as every node is alive and fails with
    /// [`Error::LostPeer`] if one dies. This node must be in `group`.
    pub async fn barrier(&self, group: Group) -> Result<()> {
        if !group.contains(self.me.role) {
            return Err(Error::InvalidArgument(format!("a {} cannot wait at a {group} barrier", self.me.role)));
        }
        let (id, rx) = self.shared.begin_barrier().map_err(|f| f.to_error())?;
        if let Err(e) = self.send(Message::barrier(group, id)).await {
            self.shared.cancel_barrier(id);
            return Err(e);
        }
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(f)) => Err(f.to_error()),
            Err(_) => Err(self.closed_error()),
        }
    }

    /// The round of the next periodic checkpoint, once rank 0 announced one.
    pub fn checkpoint_planned(&self) -> Option<u64> {
        self.shared.status.borrow().checkpoint_at
    }

    /// Worker rank 0: announces to every worker (through the scheduler) that the next
    /// periodic checkpoint is taken at round `at`.
    pub async fn plan_checkpoint(&self, at: u64) -> Result<()> {
        self.send(Message::new(Command::CheckpointAt).with_request_id(at)).await
    }

    /// The workers that rounds must not wait for, updated as the scheduler reports them: those
    /// that finished, and those that died and may be restarted (`SYNKV_WORKER_RESTARTS=1`)
    /// until they are back.
    pub fn done_workers(&self) -> watch::Receiver<Absent> {
        self.watch_status(|s| Absent { ranks: s.done_workers.union(&s.away_workers).copied().collect(), moves: s.worker_moves })
    }

    /// Whether this worker took the rank of one that died (a restart into a running job).
    pub fn rejoined(&self) -> bool {
        self.rejoined
    }

    /// The ranks of the servers that died and whose partitions moved to their backups
    /// (`Failover`, with `SYNKV_SERVER_REPLICAS=1`), in the order the scheduler announced them.
    pub fn dead_servers(&self) -> watch::Receiver<Vec<Rank>> {
        self.watch_status(|s| s.dead_servers.clone())
    }

    /// Server: tells the scheduler its backup copy of `partition` is complete.
    pub async fn replica_ready(&self, partition: u32) -> Result<()> {
        let mut m = Message::new(Command::ReplicaReady);
        m.meta.head = i32::try_from(partition).unwrap_or(i32::MAX);
        self.send(m).await
    }

    /// A watch of one part of the status, updated when it changes.
    fn watch_status<T: PartialEq + Send + Sync + 'static>(&self, part: fn(&shared::Status) -> T) -> watch::Receiver<T> {
        let mut status = self.shared.status.subscribe();
        let (tx, rx) = watch::channel(part(&status.borrow()));
        let stop = self.stop.clone();
        self.tracker.spawn(async move {
            loop {
                tokio::select! {
                    changed = status.changed() => if changed.is_err() { return },
                    () = stop.cancelled() => return,
                    () = tx.closed() => return,
                }
                let now = part(&status.borrow_and_update());
                tx.send_if_modified(|d| {
                    let changed = *d != now;
                    *d = now;
                    changed
                });
            }
        });
        rx
    }

    /// Resolves when the scheduler orders shutdown (every worker is done); fails if the
    /// cluster fails first. Bounded by failure detection (heartbeats), not by a fixed
    /// deadline: a server waits here for the whole training run.
    pub async fn wait_shutdown(&self) -> Result<()> {
        let mut status = self.shared.status.subscribe();
        let seen = status.wait_for(|s| s.shutdown_ordered || s.failure.is_some()).await.ok().map(|s| s.clone());
        match seen {
            Some(s) if s.shutdown_ordered => Ok(()),
            Some(s) => Err(s.failure.map_or_else(|| Error::Shutdown("cluster closed".into()), |f| f.to_error())),
            None => Err(Error::Shutdown("cluster closed".into())),
        }
    }

    /// Worker: tells the scheduler this worker is done, waits until every worker is and the
    /// scheduler orders shutdown, then closes. No deadline: other workers may train for hours
    /// more; the wait ends by the shutdown order or by failure detection.
    pub async fn finish(self) -> Result<()> {
        if self.me.role != Role::Worker {
            return Err(Error::InvalidArgument(format!("only workers finish; a {} waits for shutdown", self.me.role)));
        }
        let result = async {
            self.send(Message::new(Command::Shutdown)).await?;
            self.wait_shutdown().await
        }
        .await;
        self.close().await;
        result
    }

    /// Stops the background tasks and waits for them (bounded by the heartbeat timeout).
    pub async fn close(self) {
        self.stop.cancel();
        if tokio::time::timeout(self.config.heartbeat_timeout, self.tracker.wait()).await.is_err() {
            tracing::warn!("cluster tasks did not stop within {:?}", self.config.heartbeat_timeout);
        }
    }
}

/// Checks the scheduler's node list against what this node registered and the configuration.
fn validate_node_list(list: &Message, registered: &Node, config: &Config, scheduler: &Node) -> Result<(Node, Vec<Node>)> {
    let bad = |detail: String| Error::Unexpected { peer: scheduler.to_string(), command: Command::NodeList, detail };
    let id = list.head_node_id().map_err(|e| bad(e.to_string()))?;
    let me = list.meta.nodes.iter().find(|n| n.id == id).ok_or_else(|| bad(format!("recipient id {id} is not in the list")))?;
    if me.role != registered.role || me.host != registered.host || me.port != registered.port || me.rank.is_none() {
        return Err(bad(format!("the entry for id {id} ({me}) is not what this node registered ({registered})")));
    }
    for (role, expected) in [(Role::Server, config.num_servers), (Role::Worker, config.num_workers)] {
        let mut ranks: Vec<Option<Rank>> = list.meta.nodes.iter().filter(|n| n.role == role).map(|n| n.rank).collect();
        ranks.sort();
        let want: Vec<Option<Rank>> = (0..expected).map(Some).collect();
        if ranks != want {
            return Err(bad(format!("{role} ranks are {ranks:?}, expected 0..{expected}")));
        }
    }
    let mut nodes = list.meta.nodes.clone();
    nodes.sort_by_key(|n| n.id);
    Ok((me.clone(), nodes))
}

/// The workers a round need not wait for, as the scheduler reported them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Absent {
    /// Workers that finished, and workers that died and may be restarted.
    pub ranks: BTreeSet<Rank>,
    /// How many times a worker died, came back or finished so far: a rejoined worker's hold
    /// on a server's rounds set before the latest of these no longer holds them while it is
    /// in `ranks` (`server/round.rs`).
    pub moves: u64,
}

impl Absent {
    /// Finished or dead workers `ranks`, after `moves` moves.
    pub fn new(ranks: impl IntoIterator<Item = Rank>, moves: u64) -> Absent {
        Absent { ranks: ranks.into_iter().collect(), moves }
    }
}
