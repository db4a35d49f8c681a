//! State shared between a [`Cluster`](super::Cluster) handle and its background tasks, and
//! the tasks themselves: reader (dispatches the scheduler's messages), writer (drains the
//! outbox) and heartbeat (sends `Heartbeat`s and watches the scheduler's answers).
//!
//! The first failure wins and is kept: every pending barrier is failed with it, and every
//! later wait returns it, so a survivor always learns which node died and why.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::ps::node::{Node, Rank, Role};
use crate::ps::proto::{Command, Message};
use crate::ps::trace;
use crate::ps::transport::{drain, Drained, FrameReader, FrameWriter, Outbox, OutboxRx};
use crate::ps::Error;

/// Why the cluster can no longer be used.
#[derive(Clone, Debug)]
pub(super) enum Failure {
    /// A node (possibly the scheduler) died or stopped answering.
    Lost { node: Node, reason: String },
    /// The scheduler reported an error not tied to a request.
    Remote { node: Node, message: String },
    /// This node was shut down locally.
    Stopped(String),
}

impl Failure {
    pub(super) fn to_error(&self) -> Error {
        match self {
            Failure::Lost { node, reason } => Error::LostPeer { node: node.clone(), reason: reason.clone() },
            Failure::Remote { node, message } => Error::Remote { node: node.clone(), message: message.clone() },
            Failure::Stopped(why) => Error::Shutdown(why.clone()),
        }
    }
}

/// What waiters watch.
#[derive(Clone, Debug, Default)]
pub(super) struct Status {
    pub(super) failure: Option<Failure>,
    pub(super) shutdown_ordered: bool,
    /// Ranks of the workers that finished (`NodeDone`).
    pub(super) done_workers: BTreeSet<Rank>,
    /// The round of the next periodic checkpoint, as rank 0 announced it (`CheckpointAt`).
    pub(super) checkpoint_at: Option<u64>,
    /// Servers that died and failed over to their backups, in the announced order.
    pub(super) dead_servers: Vec<Rank>,
    /// Workers that died and may be restarted (`WorkerAway`, until `WorkerBack`).
    pub(super) away_workers: BTreeSet<Rank>,
    /// `NodeDone` of a worker, `WorkerAway` and `WorkerBack` messages so far.
    pub(super) worker_moves: u64,
}

#[derive(Debug)]
struct State {
    next_request: u64,
    barriers: HashMap<u64, oneshot::Sender<Result<(), Failure>>>,
    last_heard: Instant,
    node_list: Option<oneshot::Sender<Message>>,
}

#[derive(Debug)]
pub(super) struct Shared {
    state: Mutex<State>,
    pub(super) status: watch::Sender<Status>,
    pub(super) scheduler: Node,
    /// This node's role (whose flight recorder a failure dumps).
    role: Role,
}

impl Shared {
    pub(super) fn new(scheduler: Node, node_list: oneshot::Sender<Message>, role: Role) -> Arc<Shared> {
        let state = State { next_request: 1, barriers: HashMap::new(), last_heard: Instant::now(), node_list: Some(node_list) };
        Arc::new(Shared { state: Mutex::new(state), status: watch::Sender::new(Status::default()), scheduler, role })
    }

    /// Records a peer's death (an instant event) and dumps this node's flight recorder.
    fn peer_died(&self, op: trace::Op, node: &Node, why: &str) {
        trace::recorder(self.role).record(trace::Span::instant(op, node.to_string()));
        trace::dump(self.role, &trace::lost_cause(node), why);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn failure(&self) -> Option<Failure> {
        self.status.borrow().failure.clone()
    }

    /// Records the first failure and fails every pending barrier with it.
    pub(super) fn fail(&self, failure: Failure) {
        let mut first = false;
        self.status.send_if_modified(|s| {
            first = s.failure.is_none();
            if first {
                s.failure = Some(failure.clone());
            }
            first
        });
        if first {
            if !matches!(failure, Failure::Stopped(_)) {
                tracing::error!("cluster failed: {}", failure.to_error());
            }
            if let Failure::Lost { node, .. } = &failure {
                self.peer_died(trace::Op::NodeDead, node, &failure.to_error().to_string());
            }
            let pending: Vec<_> = self.lock().barriers.drain().collect();
            for (_, tx) in pending {
                let _ = tx.send(Err(failure.clone()));
            }
        }
    }

    /// Registers a barrier wait; fails at once if the cluster already failed.
    pub(super) fn begin_barrier(&self) -> Result<(u64, oneshot::Receiver<Result<(), Failure>>), Failure> {
        let mut state = self.lock();
        // Checked under the lock `fail` drains with, so no wait can slip past a failure.
        if let Some(f) = self.failure() {
            return Err(f);
        }
        let id = state.next_request;
        state.next_request += 1;
        let (tx, rx) = oneshot::channel();
        state.barriers.insert(id, tx);
        Ok((id, rx))
    }

    pub(super) fn cancel_barrier(&self, id: u64) {
        self.lock().barriers.remove(&id);
    }

    fn dispatch(&self, msg: Message) {
        self.lock().last_heard = Instant::now();
        match msg.command {
            Command::HeartbeatAck => {}
            Command::NodeList => match self.lock().node_list.take() {
                Some(tx) => {
                    let _ = tx.send(msg);
                }
                None => tracing::warn!("ignoring a second NodeList from the scheduler"),
            },
            Command::BarrierRelease => {
                if let Some(tx) = self.lock().barriers.remove(&msg.request_id) {
                    let _ = tx.send(Ok(()));
                }
            }
            Command::NodeDead => match msg.single_node() {
                Ok(node) => self.fail(Failure::Lost { node: node.clone(), reason: msg.meta.text.clone() }),
                Err(e) => self.fail(Failure::Lost { node: self.scheduler.clone(), reason: format!("sent a malformed NodeDead: {e}") }),
            },
            Command::NodeDone => match msg.single_node() {
                Ok(node) if node.role == Role::Worker => {
                    let rank = node.rank.unwrap_or(0);
                    tracing::info!("{node} finished");
                    self.status.send_modify(|s| {
                        s.done_workers.insert(rank);
                        s.worker_moves += 1;
                    });
                }
                Ok(node) => tracing::warn!("ignoring NodeDone for {node}, which is not a worker"),
                Err(e) => tracing::warn!("ignoring a malformed NodeDone: {e}"),
            },
            Command::Failover => match msg.single_node() {
                Ok(node) if node.role == Role::Server => {
                    let rank = node.rank.unwrap_or(u32::MAX);
                    tracing::warn!("{node} died ({}); its partitions moved to their backups", msg.meta.text);
                    self.peer_died(
                        trace::Op::Failover,
                        node,
                        &format!("{node} died ({}); its partitions moved to their backups", msg.meta.text),
                    );
                    self.status.send_modify(|s| {
                        if !s.dead_servers.contains(&rank) {
                            s.dead_servers.push(rank);
                        }
                    });
                }
                Ok(node) => tracing::warn!("ignoring Failover for {node}, which is not a server"),
                Err(e) => tracing::warn!("ignoring a malformed Failover: {e}"),
            },
            Command::WorkerAway | Command::WorkerBack => match msg.single_node() {
                Ok(node) if node.role == Role::Worker => {
                    let (rank, away) = (node.rank.unwrap_or(u32::MAX), msg.command == Command::WorkerAway);
                    if away {
                        tracing::warn!("{node} died; the job goes on without it until it is restarted");
                        self.peer_died(
                            trace::Op::WorkerAway,
                            node,
                            &format!("{node} died; the job goes on without it until it is restarted"),
                        );
                    } else {
                        tracing::warn!("{node} is back (restarted)");
                    }
                    self.status.send_modify(|s| {
                        if away {
                            s.away_workers.insert(rank);
                        } else {
                            s.away_workers.remove(&rank);
                        }
                        s.worker_moves += 1;
                    });
                }
                Ok(node) => tracing::warn!("ignoring {:?} for {node}, which is not a worker", msg.command),
                Err(e) => tracing::warn!("ignoring a malformed {:?}: {e}", msg.command),
            },
            Command::CheckpointAt => {
                let at = msg.request_id;
                self.status.send_modify(|s| s.checkpoint_at = Some(at));
            }
            Command::Shutdown => {
                tracing::info!("the scheduler ordered shutdown");
                self.status.send_modify(|s| s.shutdown_ordered = true);
            }
            Command::Error => {
                let pending = self.lock().barriers.remove(&msg.request_id);
                let failure = Failure::Remote { node: self.scheduler.clone(), message: msg.meta.text };
                match pending {
                    Some(tx) => {
                        let _ = tx.send(Err(failure));
                    }
                    None => self.fail(failure),
                }
            }
            other => tracing::warn!("ignoring unexpected {other:?} from the scheduler"),
        }
    }

    fn last_heard(&self) -> Instant {
        self.lock().last_heard
    }

    fn over(&self) -> bool {
        let s = self.status.borrow();
        s.failure.is_some() || s.shutdown_ordered
    }
}

/// Reads the scheduler's messages until EOF, an error or `stop`.
pub(super) async fn read_loop(mut reader: FrameReader, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let read = tokio::select! {
            r = reader.read_message() => r,
            () = stop.cancelled() => {
                shared.fail(Failure::Stopped("this node is shutting down".into()));
                return;
            }
        };
        match read {
            Ok(Some(msg)) => shared.dispatch(msg),
            Ok(None) => {
                if !shared.status.borrow().shutdown_ordered {
                    shared.fail(Failure::Lost { node: shared.scheduler.clone(), reason: "connection closed".into() });
                }
                return;
            }
            Err(e) => {
                shared.fail(Failure::Lost { node: shared.scheduler.clone(), reason: format!("connection failed: {e}") });
                return;
            }
        }
    }
}

/// Writes queued messages (each write bounded by `stall`); a failed write loses the scheduler.
pub(super) async fn write_loop(mut writer: FrameWriter, rx: OutboxRx, shared: Arc<Shared>, stop: CancellationToken, stall: Duration) {
    writer.set_stall_timeout(Some(stall));
    if let Drained::Failed(e) = drain(writer, rx, stop, |_, _| None).await {
        shared.fail(Failure::Lost { node: shared.scheduler.clone(), reason: format!("write failed: {e}") });
    }
}

/// Sends a heartbeat every `interval`; declares the scheduler dead after `timeout` of silence.
pub(super) async fn heartbeat_loop(outbox: Outbox, shared: Arc<Shared>, stop: CancellationToken, interval: Duration, timeout: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        if shared.over() {
            return;
        }
        let silent = Instant::now().saturating_duration_since(shared.last_heard());
        if silent > timeout {
            shared.fail(Failure::Lost { node: shared.scheduler.clone(), reason: format!("no answer for more than {timeout:?}") });
            return;
        }
        // A full outbox means heartbeats are already queued; skipping one is harmless.
        let _ = outbox.try_send(Message::new(Command::Heartbeat));
    }
}
