//! The scheduler's state machine: one task owns all cluster state and reacts to connection
//! events and clock ticks. It never awaits: replies go into each peer's bounded outbox
//! (`try_send`), so one slow peer cannot stall the others — a peer whose outbox is full is
//! treated as dead.
//!
//! Phases: `Registering` (collecting `Register`s until every server and worker is here, or the
//! rendezvous deadline passes) → `Running` (barriers, heartbeats) → done, either because every
//! worker sent `Shutdown` (everyone is told `Shutdown`; `Ok`) or because a node died (survivors
//! are told `NodeDead`; `Err(LostPeer)`).
//!
//! **Finished workers.** A worker that sent `Shutdown` is *done*, for good: it is counted
//! whether or not its connection is still open (a finished worker may exit before the others
//! finish), its departure is no failure, every other node is told (`NodeDone`: servers stop
//! waiting for its pushes in sync rounds), and worker barriers count it as arrived. Training
//! with uneven epochs therefore ends cleanly instead of hanging (MXNet hangs).
//!
//! **Server failover** (`SYNKV_SERVER_REPLICAS=1`). When a server dies and every partition
//! it holds has a complete backup copy on a live server ([`Topology`]), the job goes on: every
//! node is told `Failover` (not `NodeDead`), workers send the dead server's requests to the
//! new holders, and servers promote their copies and send copies to new backups. A partition
//! whose backup changed is *unprotected* until its new backup reports `ReplicaReady`; the
//! death of a server holding an unprotected partition, or of the last server, ends the job
//! with `NodeDead` as without replicas. The job starts protected: at rendezvous the servers
//! get the node list at once, and the workers only when every partition has reported its
//! first complete backup copy (a server restored from a checkpoint holds data its backup does
//! not have yet), so no worker's update ever lands on a partition without a backup.
//!
//! **Barriers** are idempotent per request: a node's barrier request id that is already
//! waiting is ignored, and one that was already released is released again (a retry after a
//! lost reply), never counted twice.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ranks::assign_ranks;
use crate::ps::node::{Group, Node, NodeId, Role};
use crate::ps::proto::{Command, Message};
use crate::ps::topology::Topology;
use crate::ps::trace;
use crate::ps::transport::Outbox;
use crate::ps::{Config, Error, Result};

/// The text of a `NodeList` sent to a restarted worker that takes an away rank.
pub(crate) const REJOIN: &str = "rejoin";

/// Identifies one accepted connection.
pub(super) type ConnId = u64;

/// What connection tasks tell the core.
#[derive(Debug)]
pub(super) enum Event {
    /// A peer authenticated and sent a valid `Register`.
    Registered { conn: ConnId, node: Node, outbox: Outbox, token: CancellationToken },
    /// A message from a registered peer.
    Message { conn: ConnId, msg: Message },
    /// The connection ended: `None` for a clean EOF, else why.
    Closed { conn: ConnId, reason: Option<String> },
}

/// Whether the scheduler should keep running.
#[derive(Debug)]
pub(super) enum Outcome {
    Continue,
    Done(Result<()>),
}

#[derive(Debug)]
struct Peer {
    node: Node,
    outbox: Outbox,
    token: CancellationToken,
    last_seen: Instant,
    /// A worker that sent `Shutdown`; its departure is not a failure.
    done: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Registering,
    Running,
}

#[derive(Debug)]
pub(super) struct Core {
    config: Config,
    me: Node,
    phase: Phase,
    deadline: Instant,
    peers: BTreeMap<ConnId, Peer>,
    /// Workers that finished, connected or not.
    done: BTreeSet<NodeId>,
    /// Per group, the nodes waiting and their barrier request ids.
    barriers: HashMap<Group, BTreeMap<NodeId, u64>>,
    /// Per (group, node), the request id of the last barrier released.
    released: HashMap<(Group, NodeId), u64>,
    /// Per group, when the first node of its waiting barrier arrived (for its trace span).
    barrier_since: HashMap<Group, std::time::Instant>,
    /// Which live server holds each partition and its backup (replicas).
    topology: Topology,
    /// Partitions whose backup copy is being rebuilt after a failover.
    unprotected: BTreeSet<u32>,
    /// Workers that died and may be restarted (`SYNKV_WORKER_RESTARTS=1`): their last node
    /// entry and since when they are away.
    away: BTreeMap<crate::ps::node::Rank, (Node, Instant)>,
    /// The node list sent at rendezvous (every node, dead or alive), kept for rejoins.
    formed: Vec<Node>,
    /// With replicas, the workers whose node list waits until every partition has a complete
    /// backup, and the deadline for that.
    held: Vec<ConnId>,
    held_until: Option<Instant>,
}

impl Core {
    pub(super) fn new(config: Config, now: Instant) -> Core {
        let me = config.scheduler_node();
        let deadline = now + config.timeout;
        Core {
            me,
            phase: Phase::Registering,
            deadline,
            peers: BTreeMap::new(),
            done: BTreeSet::new(),
            barriers: HashMap::new(),
            released: HashMap::new(),
            barrier_since: HashMap::new(),
            topology: Topology::new(config.num_servers),
            // Every backup copy starts empty and is complete once its first snapshot arrived.
            unprotected: if config.replicas > 0 { (0..config.num_servers).collect() } else { BTreeSet::new() },
            away: BTreeMap::new(),
            formed: Vec::new(),
            held: Vec::new(),
            held_until: None,
            config,
        }
    }

    /// Sends `msg` to `conn`; a full or closed outbox marks the peer as unreachable.
    fn send(&mut self, conn: ConnId, msg: Message) -> std::result::Result<(), String> {
        let Some(peer) = self.peers.get(&conn) else { return Ok(()) };
        peer.outbox.try_send(msg.with_sender(NodeId::SCHEDULER)).map_err(|e| e.to_string())
    }

    /// Sends a final message and closes the peer's connection gracefully.
    fn send_and_close(&mut self, conn: ConnId, msg: Message) {
        let _ = self.send(conn, msg);
        // Dropping the only sender lets the writer flush, then close.
        self.peers.remove(&conn);
    }

    /// Closes every connection gracefully after queued messages are written.
    pub(super) fn close_all(&mut self) {
        self.peers.clear();
    }

    fn count(&self, role: Role) -> u32 {
        let n = self.peers.values().filter(|p| p.node.role == role).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    fn expected(&self, role: Role) -> u32 {
        match role {
            Role::Server => u32::try_from(self.topology.live().count()).unwrap_or(u32::MAX),
            Role::Worker => self.config.num_workers,
            Role::Scheduler => 0,
        }
    }

    pub(super) fn on_event(&mut self, event: Event, now: Instant) -> Outcome {
        let outcome = self.handle(event, now);
        self.publish();
        outcome
    }

    /// Copies the node counts into the metrics (a few relaxed stores).
    fn publish(&self) {
        let m = &crate::ps::metrics::METRICS.scheduler;
        m.live_servers.set(i64::from(self.count(Role::Server)));
        m.live_workers.set(i64::from(self.count(Role::Worker)));
        m.workers_away.set(i64::try_from(self.away.len()).unwrap_or(i64::MAX));
        m.workers_finished.set(i64::try_from(self.done.len()).unwrap_or(i64::MAX));
    }

    fn handle(&mut self, event: Event, now: Instant) -> Outcome {
        match event {
            Event::Registered { conn, node, outbox, token } => self.on_register(conn, node, outbox, token, now),
            Event::Message { conn, msg } => self.on_message(conn, msg, now),
            Event::Closed { conn, reason } => {
                let Some(peer) = self.peers.get(&conn) else { return Outcome::Continue };
                if peer.done {
                    self.peers.remove(&conn);
                    return Outcome::Continue;
                }
                let reason = reason.map_or_else(|| "connection closed".to_owned(), |r| format!("connection closed: {r}"));
                self.declare_dead(conn, reason)
            }
        }
    }

    fn on_register(&mut self, conn: ConnId, node: Node, outbox: Outbox, token: CancellationToken, now: Instant) -> Outcome {
        self.peers.insert(conn, Peer { node: node.clone(), outbox, token, last_seen: now, done: false });
        if self.phase == Phase::Running && node.role == Role::Worker && !self.away.is_empty() {
            self.rejoin(conn, node, now);
            return Outcome::Continue;
        }
        if self.phase != Phase::Registering {
            let text = if self.config.worker_restarts && node.role == Role::Worker {
                "the job is running and no worker rank is free: a restarted worker takes the rank of one that died, and none has (or its death is not detected yet); try again later".to_owned()
            } else {
                format!(
                    "the cluster is already formed ({} nodes); joining is not supported (a worker may be restarted with SYNKV_WORKER_RESTARTS=1)",
                    self.config.num_nodes()
                )
            };
            tracing::warn!("refusing late registration of {node}");
            self.send_and_close(conn, Message::error(0, text));
            return Outcome::Continue;
        }
        if self.count(node.role) > self.expected(node.role) {
            let var = if node.role == Role::Server { "DMLC_NUM_SERVER" } else { "DMLC_NUM_WORKER" };
            let text = format!("too many {}s: {var}={}", node.role, self.expected(node.role));
            tracing::warn!("refusing {node}: {text}");
            self.send_and_close(conn, Message::error(0, text));
            return Outcome::Continue;
        }
        tracing::info!("registered {node} ({} of {})", self.peers.len(), self.config.num_nodes());
        trace::recorder(Role::Scheduler).record(trace::Span::instant(trace::Op::Register, node.to_string()));
        if self.count(Role::Server) == self.config.num_servers && self.count(Role::Worker) == self.config.num_workers {
            self.form_cluster(now);
        }
        Outcome::Continue
    }

    /// A restarted worker registers while its rank is away: it takes that rank (the one its
    /// task id names, else the lowest away), gets the node list marked `rejoin`, and every other
    /// node is told `WorkerBack`. Its barrier history starts over (a new process counts its
    /// barrier requests from 1 again).
    fn rejoin(&mut self, conn: ConnId, mut node: Node, now: Instant) {
        let rank = node.task_id.filter(|t| self.away.contains_key(t)).or_else(|| self.away.keys().next().copied());
        let Some((rank, (old, _))) = rank.and_then(|r| self.away.remove_entry(&r)) else { return };
        node.rank = Some(rank);
        node.id = old.id;
        if let Some(p) = self.peers.get_mut(&conn) {
            p.node = node.clone();
            p.last_seen = now;
        }
        for waiting in self.barriers.values_mut() {
            waiting.remove(&node.id);
        }
        self.released.retain(|(_, id), _| *id != node.id);
        // The rendezvous list, with the new process's address in its rank's entry.
        for n in self.formed.iter_mut().filter(|n| n.id == node.id) {
            *n = node.clone();
        }
        let mut msg = Message::node_list(self.formed.clone(), node.id);
        msg.meta.text = REJOIN.to_owned();
        tracing::warn!("{node} rejoins the running job as worker rank {rank} (restarted)");
        if let Err(reason) = self.send(conn, msg) {
            tracing::warn!("could not send the node list to {node}: {reason}");
        }
        let back = node.clone();
        self.broadcast(|p| (p.node.id != back.id).then(|| Message::worker_moved(Command::WorkerBack, back.clone())));
    }

    /// With `SYNKV_WORKER_RESTARTS=1`, a dead worker is *away*, not fatal: every node is told
    /// `WorkerAway`, rounds and barriers stop waiting for it, and a restarted process may take
    /// its rank (within `SYNKV_TIMEOUT_MS`). `None` when that does not apply.
    fn worker_away(&mut self, node: &Node, reason: &str) -> Option<Outcome> {
        let rank = node.rank?;
        if !self.config.worker_restarts || node.role != Role::Worker || self.done.contains(&node.id) {
            return None;
        }
        tracing::warn!("{node} died: {reason}; the job goes on without it until a restarted worker takes rank {rank}");
        self.away.insert(rank, (node.clone(), Instant::now()));
        for waiting in self.barriers.values_mut() {
            waiting.remove(&node.id);
        }
        let gone = node.clone();
        self.broadcast(|_| Some(Message::worker_moved(Command::WorkerAway, gone.clone())));
        self.release_ready_barriers();
        Some(Outcome::Continue)
    }

    /// Every node is here: assign ranks and send everyone the node list.
    fn form_cluster(&mut self, now: Instant) {
        let conns: Vec<ConnId> = self.peers.keys().copied().collect();
        let mut nodes: Vec<Node> = self.peers.values().map(|p| p.node.clone()).collect();
        assign_ranks(&mut nodes);
        for (conn, node) in conns.iter().zip(&nodes) {
            if let Some(p) = self.peers.get_mut(conn) {
                p.node = node.clone();
                p.last_seen = now;
            }
        }
        let mut list = vec![self.me.clone()];
        list.extend(nodes.iter().cloned());
        list.sort_by_key(|n| n.id);
        self.formed = list.clone();
        self.phase = Phase::Running;
        tracing::info!("cluster formed: {} servers, {} workers", self.config.num_servers, self.config.num_workers);
        let hold = !self.unprotected.is_empty();
        for (conn, node) in conns.into_iter().zip(nodes) {
            if hold && node.role == Role::Worker {
                self.held.push(conn);
            } else {
                self.send_node_list(conn);
            }
        }
        if hold {
            tracing::info!("the workers start once every partition has a complete backup copy");
            self.held_until = Some(now + self.config.timeout);
        }
    }

    fn send_node_list(&mut self, conn: ConnId) {
        let Some(node) = self.peers.get(&conn).map(|p| p.node.clone()) else { return };
        if let Err(reason) = self.send(conn, Message::node_list(self.formed.clone(), node.id)) {
            tracing::warn!("could not send the node list to {node}: {reason}");
        }
    }

    /// Every partition is protected: the held workers get their node lists.
    fn release_held(&mut self) {
        if !self.unprotected.is_empty() || self.held.is_empty() {
            return;
        }
        tracing::info!("every partition has a complete backup copy: the workers start");
        self.held_until = None;
        for conn in std::mem::take(&mut self.held) {
            self.send_node_list(conn);
        }
    }

    fn on_message(&mut self, conn: ConnId, msg: Message, now: Instant) -> Outcome {
        let Some(peer) = self.peers.get_mut(&conn) else { return Outcome::Continue };
        peer.last_seen = now;
        let node = peer.node.clone();
        let reply = match msg.command {
            Command::Heartbeat => Message::new(Command::HeartbeatAck).with_request_id(msg.request_id),
            Command::Barrier => match self.on_barrier(&node, &msg) {
                Ok(()) => return Outcome::Continue,
                Err(text) => Message::error(msg.request_id, text),
            },
            Command::CheckpointAt if node.role == Role::Worker && node.rank == Some(0) && self.phase == Phase::Running => {
                let at = msg.request_id;
                tracing::info!("a checkpoint at round {at}, announced by {node}");
                self.broadcast(|p| (p.node.role == Role::Worker).then(|| Message::new(Command::CheckpointAt).with_request_id(at)));
                return Outcome::Continue;
            }
            Command::ReplicaReady if node.role == Role::Server && self.phase == Phase::Running => {
                let partition = u32::try_from(msg.meta.head).unwrap_or(u32::MAX);
                if node.rank.is_some() && self.topology.backup(partition) == node.rank && self.unprotected.remove(&partition) {
                    tracing::info!("partition {partition} has a complete backup, on {node}");
                    self.release_held();
                }
                return Outcome::Continue;
            }
            Command::Shutdown if node.role == Role::Worker && self.phase == Phase::Running => {
                if let Some(p) = self.peers.get_mut(&conn) {
                    p.done = true;
                }
                if self.done.insert(node.id) {
                    tracing::info!("{node} is done ({} of {} workers)", self.done.len(), self.config.num_workers);
                    let done = node.clone();
                    self.broadcast(|p| (p.node.id != done.id).then(|| Message::node_done(done.clone())));
                    self.release_ready_barriers();
                }
                return self.maybe_finish();
            }
            other => Message::error(msg.request_id, format!("the scheduler does not accept {other:?} from a {} here", node.role)),
        };
        match self.send(conn, reply) {
            Ok(()) => Outcome::Continue,
            Err(reason) => self.declare_dead(conn, reason),
        }
    }

    fn on_barrier(&mut self, node: &Node, msg: &Message) -> std::result::Result<(), String> {
        if self.phase != Phase::Running {
            return Err("barrier before the cluster is formed".to_owned());
        }
        let group = msg.group().map_err(|e| e.to_string())?;
        if !group.contains(node.role) {
            return Err(format!("a {} is not a member of barrier group {group}", node.role));
        }
        if self.released.get(&(group, node.id)).is_some_and(|&r| msg.request_id <= r) {
            // A retry of a barrier that was released already: release it again.
            self.send_release(group, node.id, msg.request_id);
            return Ok(());
        }
        let waiting = self.barriers.entry(group).or_default();
        match waiting.get(&node.id) {
            Some(&id) if id == msg.request_id => return Ok(()), // the same request again
            Some(&id) => return Err(format!("{node} is already waiting at the {group} barrier (request {id})")),
            None => {
                waiting.insert(node.id, msg.request_id);
                self.barrier_since.entry(group).or_insert_with(std::time::Instant::now);
            }
        }
        self.release_ready_barriers();
        Ok(())
    }

    /// Releases every barrier whose members have all arrived; finished workers count as
    /// arrived (they take part in no later barrier).
    fn release_ready_barriers(&mut self) {
        let groups: Vec<Group> = self.barriers.keys().copied().collect();
        for group in groups {
            let size: u32 = [Role::Server, Role::Worker].into_iter().filter(|r| group.contains(*r)).map(|r| self.expected(r)).sum();
            let Some(waiting) = self.barriers.get(&group) else { continue };
            let done = if group.contains(Role::Worker) {
                let away = self.away.values().map(|(n, _)| n.id);
                self.done.iter().copied().chain(away).filter(|id| !waiting.contains_key(id)).count()
            } else {
                0
            };
            if waiting.is_empty() || u32::try_from(waiting.len() + done).unwrap_or(u32::MAX) < size {
                continue;
            }
            let released = self.barriers.remove(&group).unwrap_or_default();
            tracing::debug!("releasing the {group} barrier");
            let since = self.barrier_since.remove(&group);
            let rec = trace::recorder(Role::Scheduler);
            if let (true, Some(since)) = (rec.enabled(), since) {
                let mut span = trace::Span::new(trace::Op::Barrier, since, std::time::Instant::now());
                span.label = Some(format!("{group} barrier").into());
                rec.record(span);
            }
            crate::ps::metrics::METRICS.scheduler.barriers.add(1);
            for (id, request_id) in released {
                self.released.insert((group, id), request_id);
                self.send_release(group, id, request_id);
            }
        }
    }

    fn send_release(&mut self, group: Group, id: NodeId, request_id: u64) {
        if let Some(conn) = self.peers.iter().find(|(_, p)| p.node.id == id).map(|(c, _)| *c) {
            let _ = self.send(conn, Message::barrier_release(group, request_id));
        }
    }

    /// Every worker is done: tell every node to stop.
    fn maybe_finish(&mut self) -> Outcome {
        if u32::try_from(self.done.len()).unwrap_or(u32::MAX) < self.config.num_workers {
            return Outcome::Continue;
        }
        tracing::info!("all workers are done: shutting the cluster down");
        self.broadcast(|_| Some(Message::new(Command::Shutdown)));
        Outcome::Done(Ok(()))
    }

    /// An external stop: tell every node, then finish.
    pub(super) fn on_stop(&mut self) -> Outcome {
        tracing::info!("scheduler stopping on request: telling every node to shut down");
        self.broadcast(|_| Some(Message::new(Command::Shutdown)));
        Outcome::Done(Ok(()))
    }

    fn broadcast(&mut self, mut make: impl FnMut(&Peer) -> Option<Message>) {
        let conns: Vec<(ConnId, Option<Message>)> = self.peers.iter().map(|(c, p)| (*c, make(p))).collect();
        for (conn, msg) in conns {
            if let Some(msg) = msg {
                let _ = self.send(conn, msg);
            }
        }
    }

    fn declare_dead(&mut self, conn: ConnId, reason: String) -> Outcome {
        let Some(peer) = self.peers.remove(&conn) else { return Outcome::Continue };
        peer.token.cancel();
        let node = peer.node;
        if self.phase == Phase::Registering {
            tracing::warn!("forgetting {node} before rendezvous: {reason}");
            return Outcome::Continue;
        }
        trace::recorder(Role::Scheduler).record(trace::Span::instant(trace::Op::NodeDead, node.to_string()));
        trace::dump(Role::Scheduler, &trace::lost_cause(&node), &format!("{node} is dead: {reason}"));
        if let Some(outcome) = self.fail_over(&node, &reason) {
            return outcome;
        }
        if let Some(outcome) = self.worker_away(&node, &reason) {
            return outcome;
        }
        tracing::error!("{node} is dead: {reason}; telling every survivor");
        self.broadcast(|_| Some(Message::node_dead(node.clone(), &reason)));
        Outcome::Done(Err(Error::LostPeer { node, reason }))
    }

    /// With replicas, a dead server whose partitions all have complete backups fails over:
    /// every survivor is told `Failover` and the job goes on. `None` when it cannot.
    fn fail_over(&mut self, node: &Node, reason: &str) -> Option<Outcome> {
        let rank = node.rank?;
        if self.config.replicas == 0 || node.role != Role::Server || !self.topology.alive(rank) {
            return None;
        }
        let held = self.topology.held_by(rank);
        if let Some(p) = held.iter().find(|p| self.unprotected.contains(p) || self.topology.backup(**p).is_none()) {
            tracing::error!("{node} held partition {p}, which has no complete backup: the job cannot go on");
            return None;
        }
        let before: Vec<Option<u32>> = (0..self.config.num_servers).map(|p| self.topology.backup(p)).collect();
        self.topology.kill(rank);
        for (p, was) in before.into_iter().enumerate() {
            let p = u32::try_from(p).unwrap_or(u32::MAX);
            if self.topology.backup(p) != was {
                self.unprotected.insert(p);
            }
        }
        tracing::warn!(
            "{node} is dead: {reason}; its partitions {held:?} fail over to their backups (servers left: {:?}; partitions without a complete backup until copied: {:?})",
            self.topology.live().collect::<Vec<_>>(),
            self.unprotected
        );
        let text = format!("{reason}; its partitions moved to their backups");
        self.broadcast(|_| Some(Message::failover(node.clone(), &text)));
        self.release_ready_barriers();
        Some(Outcome::Continue)
    }

    /// Liveness and rendezvous deadlines.
    pub(super) fn on_tick(&mut self, now: Instant) -> Outcome {
        if self.phase == Phase::Registering && now >= self.deadline {
            let what = format!(
                "rendezvous: {} of {} servers and {} of {} workers registered",
                self.count(Role::Server),
                self.config.num_servers,
                self.count(Role::Worker),
                self.config.num_workers
            );
            let text = format!("timed out after {:?} waiting for {what}", self.config.timeout);
            self.broadcast(|_| Some(Message::error(0, text.clone())));
            return Outcome::Done(Err(Error::timeout(what, self.config.timeout)));
        }
        if self.held_until.is_some_and(|until| now >= until) {
            let what = format!("the servers' first backup copies (partitions {:?} have none)", self.unprotected);
            let text = format!("timed out after {:?} waiting for {what}", self.config.timeout);
            tracing::error!("{text}");
            self.broadcast(|_| Some(Message::error(0, text.clone())));
            return Outcome::Done(Err(Error::timeout(what, self.config.timeout)));
        }
        if let Some((rank, (node, _))) =
            self.away.iter().find(|(_, (_, since))| now.saturating_duration_since(*since) > self.config.timeout)
        {
            let (node, reason) = (node.clone(), format!("died, and no restarted worker took rank {rank} within {:?}", self.config.timeout));
            tracing::error!("{node} {reason}; telling every survivor");
            self.broadcast(|_| Some(Message::node_dead(node.clone(), &reason)));
            return Outcome::Done(Err(Error::LostPeer { node, reason }));
        }
        let limit = self.config.heartbeat_timeout;
        let silent = self.peers.iter().find(|(_, p)| !p.done && now.saturating_duration_since(p.last_seen) > limit).map(|(c, _)| *c);
        match silent {
            Some(conn) => self.declare_dead(conn, format!("no heartbeat for more than {limit:?}")),
            None => Outcome::Continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ps::transport::OutboxRx;

    fn config() -> Config {
        Config::from_map([
            ("DMLC_ROLE", "scheduler"),
            ("DMLC_PS_ROOT_URI", "127.0.0.1"),
            ("DMLC_PS_ROOT_PORT", "9000"),
            ("DMLC_NUM_SERVER", "1"),
            ("DMLC_NUM_WORKER", "2"),
        ])
        .unwrap()
    }

    /// A core with `nodes` (role, task id) registered as connections 1, 2, …; their outbox
    /// receivers.
    fn registered(config: Config, nodes: &[(Role, u32)]) -> (Core, Vec<OutboxRx>) {
        let now = Instant::now();
        let mut core = Core::new(config, now);
        let mut rxs = Vec::new();
        for (conn, (role, task)) in nodes.iter().enumerate() {
            let (outbox, rx) = Outbox::bounded(64, 1 << 20);
            let node = Node::unassigned(*role, "127.0.0.1", 0, Some(*task));
            let conn = ConnId::try_from(conn + 1).unwrap();
            assert!(matches!(
                core.on_event(Event::Registered { conn, node, outbox, token: CancellationToken::new() }, now),
                Outcome::Continue
            ));
            rxs.push(rx);
        }
        (core, rxs)
    }

    /// A formed cluster of 1 server and 2 workers; returns the core and each peer's outbox
    /// receiver (conn 1 = server, 2 = worker 0, 3 = worker 1), with the node lists read.
    fn formed() -> (Core, Vec<OutboxRx>) {
        formed_with(config())
    }

    fn formed_with(config: Config) -> (Core, Vec<OutboxRx>) {
        let (core, mut rxs) = registered(config, &[(Role::Server, 0), (Role::Worker, 0), (Role::Worker, 1)]);
        for rx in &mut rxs {
            assert_eq!(rx.try_recv().map(|m| m.command), Some(Command::NodeList));
        }
        (core, rxs)
    }

    fn send(core: &mut Core, conn: ConnId, msg: Message) -> Outcome {
        core.on_event(Event::Message { conn, msg }, Instant::now())
    }

    fn drain(rx: &mut OutboxRx) -> Vec<(Command, u64)> {
        std::iter::from_fn(|| rx.try_recv()).map(|m| (m.command, m.request_id)).collect()
    }

    #[test]
    fn a_barrier_request_sent_twice_counts_once_and_a_released_one_is_released_again() {
        let (mut core, mut rxs) = formed();
        send(&mut core, 2, Message::barrier(Group::WORKERS, 5));
        send(&mut core, 2, Message::barrier(Group::WORKERS, 5)); // a duplicate: no error, not counted twice
        assert!(drain(&mut rxs[1]).is_empty(), "one worker of two: nothing released yet");
        send(&mut core, 3, Message::barrier(Group::WORKERS, 9));
        assert_eq!(drain(&mut rxs[1]), vec![(Command::BarrierRelease, 5)]);
        assert_eq!(drain(&mut rxs[2]), vec![(Command::BarrierRelease, 9)]);
        // A retry of a released barrier (its release was lost) is released again, alone.
        send(&mut core, 2, Message::barrier(Group::WORKERS, 5));
        assert_eq!(drain(&mut rxs[1]), vec![(Command::BarrierRelease, 5)]);
        assert!(drain(&mut rxs[2]).is_empty());
        // A new barrier needs both workers again.
        send(&mut core, 2, Message::barrier(Group::WORKERS, 6));
        assert!(drain(&mut rxs[1]).is_empty());
        // Another request id while one waits is an error.
        send(&mut core, 2, Message::barrier(Group::WORKERS, 7));
        assert_eq!(drain(&mut rxs[1]), vec![(Command::Error, 7)]);
    }

    #[test]
    fn a_finished_worker_is_announced_counts_at_barriers_and_its_departure_is_no_failure() {
        let (mut core, mut rxs) = formed();
        send(&mut core, 3, Message::barrier(Group::WORKERS, 1));
        assert!(matches!(send(&mut core, 2, Message::new(Command::Shutdown)), Outcome::Continue));
        let server: Vec<Command> = drain(&mut rxs[0]).into_iter().map(|(c, _)| c).collect();
        assert_eq!(server, vec![Command::NodeDone], "the server learns that worker 0 finished");
        assert_eq!(drain(&mut rxs[2]), vec![(Command::NodeDone, 0), (Command::BarrierRelease, 1)], "the barrier no longer waits for it");
        // Its connection closes: not a failure.
        assert!(matches!(core.on_event(Event::Closed { conn: 2, reason: None }, Instant::now()), Outcome::Continue));
        // The last worker finishes: every node is told to shut down.
        assert!(matches!(send(&mut core, 3, Message::new(Command::Shutdown)), Outcome::Done(Ok(()))));
        assert_eq!(drain(&mut rxs[0]).last().map(|m| m.0), Some(Command::Shutdown));
    }

    #[test]
    fn with_restarts_a_dead_worker_is_away_counts_at_barriers_and_a_new_process_takes_its_rank() {
        let mut c = config();
        c.worker_restarts = true;
        let (mut core, mut rxs) = formed_with(c);
        send(&mut core, 2, Message::barrier(Group::WORKERS, 4));
        // Worker 1 dies: no failure; everyone hears WorkerAway, and the barrier stops waiting.
        assert!(matches!(core.on_event(Event::Closed { conn: 3, reason: None }, Instant::now()), Outcome::Continue));
        assert_eq!(drain(&mut rxs[0]), vec![(Command::WorkerAway, 0)]);
        assert_eq!(drain(&mut rxs[1]), vec![(Command::WorkerAway, 0), (Command::BarrierRelease, 4)]);
        // A restarted process registers (task id 1): it gets rank 1 and a node list marked
        // `rejoin`; the others hear WorkerBack.
        let (outbox, mut rx) = Outbox::bounded(64, 1 << 20);
        let node = Node::unassigned(Role::Worker, "127.0.0.1", 0, Some(1));
        let event = Event::Registered { conn: 4, node, outbox, token: CancellationToken::new() };
        assert!(matches!(core.on_event(event, Instant::now()), Outcome::Continue));
        let list = rx.try_recv().expect("a node list");
        assert_eq!((list.command, list.meta.text.as_str()), (Command::NodeList, REJOIN));
        let me = list.meta.nodes.iter().find(|n| Ok(n.id) == list.head_node_id()).expect("its own entry");
        assert_eq!(me.rank, Some(1));
        assert_eq!(list.meta.nodes.iter().filter(|n| n.role == Role::Worker).count(), 2);
        assert_eq!(drain(&mut rxs[0]), vec![(Command::WorkerBack, 0)]);
        // Its barrier history starts over: request 1 is new, and waits for worker 0.
        assert!(matches!(
            core.on_event(Event::Message { conn: 4, msg: Message::barrier(Group::WORKERS, 1) }, Instant::now()),
            Outcome::Continue
        ));
        assert!(rx.try_recv().is_none());
        send(&mut core, 2, Message::barrier(Group::WORKERS, 5));
        assert_eq!(rx.try_recv().map(|m| (m.command, m.request_id)), Some((Command::BarrierRelease, 1)));
    }

    #[test]
    fn with_restarts_a_worker_that_never_comes_back_ends_the_job_after_the_timeout() {
        let mut c = config();
        c.worker_restarts = true;
        let timeout = c.timeout;
        let (mut core, _rxs) = formed_with(c);
        assert!(matches!(core.on_event(Event::Closed { conn: 3, reason: None }, Instant::now()), Outcome::Continue));
        let later = Instant::now() + timeout + std::time::Duration::from_secs(1);
        // Keep the live peers' heartbeats fresh so only the away worker can end the job.
        for conn in [1, 2] {
            let _ = core.on_event(Event::Message { conn, msg: Message::new(Command::Heartbeat) }, later);
        }
        match core.on_tick(later) {
            Outcome::Done(Err(Error::LostPeer { reason, .. })) => assert!(reason.contains("no restarted worker took rank 1"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    /// Registers 2 servers and 1 worker with replicas; returns the core and the outbox
    /// receivers (conn 1, 2 = servers, 3 = worker).
    fn replicated() -> (Core, Vec<OutboxRx>) {
        let mut c = config();
        c.num_servers = 2;
        c.num_workers = 1;
        c.replicas = 1;
        registered(c, &[(Role::Server, 0), (Role::Server, 1), (Role::Worker, 0)])
    }

    fn replica_ready(partition: u32) -> Message {
        let mut m = Message::new(Command::ReplicaReady);
        m.meta.head = i32::try_from(partition).unwrap();
        m
    }

    #[test]
    fn with_replicas_the_workers_start_only_once_every_partition_has_a_complete_backup() {
        let (mut core, mut rxs) = replicated();
        for rx in &mut rxs[..2] {
            assert_eq!(rx.try_recv().map(|m| m.command), Some(Command::NodeList), "servers start at once");
        }
        assert!(rxs[2].try_recv().is_none(), "the worker waits for the backups");
        // The backup of each partition is the other server; a report from the wrong one is ignored.
        let conn_of = |core: &Core, rank: u32| core.peers.iter().find(|(_, p)| p.node.rank == Some(rank)).map(|(c, _)| *c).unwrap();
        let backup = |core: &Core, p: u32| core.topology.backup(p).unwrap();
        let (b0, b1) = (backup(&core, 0), backup(&core, 1));
        let wrong = conn_of(&core, 1 - b0);
        send(&mut core, wrong, replica_ready(0));
        let first = conn_of(&core, b0);
        send(&mut core, first, replica_ready(0));
        assert!(rxs[2].try_recv().is_none(), "partition 1 has no backup yet");
        let second = conn_of(&core, b1);
        send(&mut core, second, replica_ready(1));
        assert_eq!(rxs[2].try_recv().map(|m| m.command), Some(Command::NodeList), "now the worker starts");
    }

    #[test]
    fn with_replicas_backups_that_never_complete_end_the_job_after_the_timeout() {
        let (mut core, _rxs) = replicated();
        let later = Instant::now() + core.config.timeout + std::time::Duration::from_secs(1);
        for conn in [1, 2, 3] {
            let _ = core.on_event(Event::Message { conn, msg: Message::new(Command::Heartbeat) }, later);
        }
        match core.on_tick(later) {
            Outcome::Done(Err(e)) => assert!(e.to_string().contains("first backup copies"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
