//! The scheduler's state machine: one task owns all cluster state and reacts to connection
//! events and clock ticks. It never awaits: replies go into each peer's bounded outbox
//! (`try_send`), so one slow peer cannot stall the others — a peer whose outbox is full is
//! treated as dead.
//!
//! Phases: `Registering` (collecting `Register`s until every server and worker is here, or the
//! rendezvous deadline passes) → `Running` (barriers, heartbeats) → done, either because every
//! worker sent `Shutdown` (everyone is told `Shutdown`; `Ok`) or because a node died (survivors
//! are told `NodeDead`; `Err(LostPeer)`).

use std::collections::{BTreeMap, HashMap};

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ranks::assign_ranks;
use crate::ps::node::{Group, Node, NodeId, Role};
use crate::ps::proto::{Command, Message};
use crate::ps::{Config, Error, Result};

/// Identifies one accepted connection.
pub(super) type ConnId = u64;

/// What connection tasks tell the core.
#[derive(Debug)]
pub(super) enum Event {
    /// A peer authenticated and sent a valid `Register`.
    Registered { conn: ConnId, node: Node, outbox: mpsc::Sender<Message>, token: CancellationToken },
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
    outbox: mpsc::Sender<Message>,
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
    barriers: HashMap<Group, BTreeMap<NodeId, u64>>,
}

impl Core {
    pub(super) fn new(config: Config, now: Instant) -> Core {
        let me = Node {
            role: Role::Scheduler,
            id: NodeId::SCHEDULER,
            rank: Some(0),
            host: config.root_uri.clone(),
            port: config.root_port,
            task_id: None,
        };
        let deadline = now + config.timeout;
        Core { config, me, phase: Phase::Registering, deadline, peers: BTreeMap::new(), barriers: HashMap::new() }
    }

    /// Sends `msg` to `conn`; a full or closed outbox marks the peer as unreachable.
    fn send(&mut self, conn: ConnId, msg: Message) -> std::result::Result<(), String> {
        let Some(peer) = self.peers.get(&conn) else { return Ok(()) };
        peer.outbox.try_send(msg.with_sender(NodeId::SCHEDULER)).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => "not reading its messages (outbox full)".to_owned(),
            mpsc::error::TrySendError::Closed(_) => "connection closed".to_owned(),
        })
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
            Role::Server => self.config.num_servers,
            Role::Worker => self.config.num_workers,
            Role::Scheduler => 0,
        }
    }

    pub(super) fn on_event(&mut self, event: Event, now: Instant) -> Outcome {
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

    fn on_register(&mut self, conn: ConnId, node: Node, outbox: mpsc::Sender<Message>, token: CancellationToken, now: Instant) -> Outcome {
        self.peers.insert(conn, Peer { node: node.clone(), outbox, token, last_seen: now, done: false });
        if self.phase != Phase::Registering {
            let text =
                format!("the cluster is already formed ({} nodes); joining or restarting a node is not supported", self.config.num_nodes());
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
        if self.count(Role::Server) == self.config.num_servers && self.count(Role::Worker) == self.config.num_workers {
            self.form_cluster(now);
        }
        Outcome::Continue
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
        self.phase = Phase::Running;
        tracing::info!("cluster formed: {} servers, {} workers", self.config.num_servers, self.config.num_workers);
        for (conn, node) in conns.into_iter().zip(nodes) {
            if let Err(reason) = self.send(conn, Message::node_list(list.clone(), node.id)) {
                tracing::warn!("could not send the node list to {node}: {reason}");
            }
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
            Command::Shutdown if node.role == Role::Worker && self.phase == Phase::Running => {
                if let Some(p) = self.peers.get_mut(&conn) {
                    p.done = true;
                }
                tracing::info!("{node} is done");
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
        let size = [Role::Server, Role::Worker].into_iter().filter(|r| group.contains(*r)).map(|r| self.expected(r)).sum::<u32>();
        let waiting = self.barriers.entry(group).or_default();
        if waiting.insert(node.id, msg.request_id).is_some() {
            return Err(format!("{node} is already waiting at the {group} barrier"));
        }
        if u32::try_from(waiting.len()).unwrap_or(u32::MAX) < size {
            return Ok(());
        }
        let released = std::mem::take(waiting);
        tracing::debug!("releasing the {group} barrier");
        for (id, request_id) in released {
            if let Some(conn) = self.peers.iter().find(|(_, p)| p.node.id == id).map(|(c, _)| *c) {
                let _ = self.send(conn, Message::barrier_release(group, request_id));
            }
        }
        Ok(())
    }

    /// Every worker is done: tell every node to stop.
    fn maybe_finish(&mut self) -> Outcome {
        let done = self.peers.values().filter(|p| p.done).count();
        if u32::try_from(done).unwrap_or(0) < self.config.num_workers {
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
        tracing::error!("{node} is dead: {reason}; telling every survivor");
        self.broadcast(|p| (!p.done).then(|| Message::node_dead(node.clone(), &reason)));
        Outcome::Done(Err(Error::LostPeer { node, reason }))
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
        let limit = self.config.heartbeat_timeout;
        let silent = self.peers.iter().find(|(_, p)| !p.done && now.saturating_duration_since(p.last_seen) > limit).map(|(c, _)| *c);
        match silent {
            Some(conn) => self.declare_dead(conn, format!("no heartbeat for more than {limit:?}")),
            None => Outcome::Continue,
        }
    }
}
