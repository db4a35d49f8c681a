//! One connection to a server: authenticate, then relay requests to the core while a writer
//! task drains the connection's outbox.
//!
//! Every message must come from one node: its header's sender id must be a worker (or, for a
//! replication link, a server) of this cluster, the same for the whole connection and the
//! role it authenticated as. Workers send data requests and commands; a server sends
//! `Replicate` messages for the partition copies this server keeps (`SYNKV_SERVER_REPLICAS`),
//! each acknowledged once it is queued for the core (`link.rs` says why that is enough). A malformed frame, a failed handshake or
//! a foreign sender closes this connection only, after an `Error` reply where the connection
//! still allows one (mini-redis's rule); an unknown command gets an `Error` reply and the
//! connection stays open.
//!
//! A worker's first frame may be `Shm`, an offer of shared memory for the bulk bytes of its
//! data frames (`transport/share.rs`); it is answered before any other frame.
//!
//! Memory: each frame is admitted by the server's [`Ingress`] budget before its body is read,
//! and events wait for room in the core's bounded queue, so a flooding or fast client is
//! slowed down by TCP, never buffered without bound. Replies wait in the connection's
//! [`Outbox`], whose soft bound (`SYNKV_PARTITION_BYTES` × 8) holds back the reading of the
//! worker's next request while its answers are unread; a reply that cannot be encoded (it
//! would break the frame limit) is answered with an error instead, and the connection stays
//! up.

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::core::Event;
use super::error::ServerError;
use crate::ps::auth::Identity;
use crate::ps::node::{NodeId, Rank, Role};
use crate::ps::proto::{Command, ErrorCode, Message};
use crate::ps::transport::{drain, share, Connection, Drained, Ingress, Outbox, Pending};
use crate::ps::{auth, Config, Error};

/// Everything a connection task needs.
pub(super) struct ConnTask {
    pub(super) id: u64,
    /// This server's node id (told to each connector at the handshake).
    pub(super) me: NodeId,
    pub(super) conn: Connection,
    pub(super) config: Config,
    pub(super) events: mpsc::Sender<Event>,
    pub(super) token: CancellationToken,
    pub(super) tracker: TaskTracker,
    pub(super) ingress: Ingress,
    /// This server's broadcast segment (shared memory with local workers).
    pub(super) broadcast: std::sync::Arc<share::BroadcastHub>,
}

impl ConnTask {
    /// Runs the connection; `pending` is its place until the handshake succeeded (within the
    /// place's deadline), then traded for an established one.
    pub(super) async fn run(mut self, pending: Pending) {
        let peer = self.conn.peer().to_owned();
        let handshake = pending.deadline();
        let proven = tokio::select! {
            r = tokio::time::timeout(handshake, auth::accept(&mut self.conn, self.config.secret.as_ref(), auth::Identity::new(Role::Server, self.me), handshake)) => {
                r.unwrap_or_else(|_| Err(Error::timeout(format!("{peer} to authenticate"), handshake)))
            }
            () = self.token.cancelled() => return,
        };
        let authed = match proven {
            Ok(who) if who.is_none_or(|w| matches!(w.role, Role::Worker | Role::Server)) => who,
            Ok(who) => {
                let role = who.map_or(Role::Scheduler, |w| w.role);
                let text = format!("a {role} cannot send data requests to a server");
                let _ = tokio::time::timeout(handshake, self.conn.write_message(&Message::error(0, text))).await;
                tracing::warn!("closing connection from {peer}: authenticated as {role}, not a worker");
                return;
            }
            Err(e) => {
                tracing::warn!("closing connection from {peer}: {e}");
                return;
            }
        };
        let Some(_place) = pending.establish() else {
            let text = "the server holds as many connections as the cluster has nodes (and a slack): refusing another";
            let _ = tokio::time::timeout(handshake, self.conn.write_message(&Message::error(0, text))).await;
            tracing::warn!("closing connection from {peer}: {text}");
            return;
        };
        let ConnTask { id, conn, config, events, token, tracker, ingress, broadcast, .. } = self;
        let (mut reader, mut writer) = conn.into_split();
        writer.set_stall_timeout(Some(config.timeout));
        reader.set_stall_timeout(Some(config.timeout));
        let shm_slot = writer.shm_slot();
        let mut shm_offered = false;
        let (outbox, rx) = Outbox::soft(config.outbox_bytes());
        if events.send(Event::Opened { conn: id, outbox: outbox.clone(), close: token.clone() }).await.is_err() {
            return;
        }
        let writer_token = token.clone();
        tracker.spawn(async move {
            let unsendable = |m: &Message, e: &crate::ps::proto::EncodeError| {
                (m.command != Command::Error).then(|| {
                    let text = format!("the answer does not fit in a frame ({e}); raise SYNKV_MAX_FRAME_BYTES");
                    ServerError::new(ErrorCode::TooLarge, text).to_message(m.request_id)
                })
            };
            if let Drained::Failed(e) = drain(writer, rx, writer_token.clone(), unsendable).await {
                tracing::warn!("closing data connection {id}: {e}");
            }
            writer_token.cancel();
        });
        let mut who: Option<(Role, Rank)> = None;
        loop {
            // Answers this worker has not read yet hold back its next request (TCP pushes
            // back on it): its memory on this server stays bounded, and an honest worker,
            // which reads every answer, is never cut off.
            tokio::select! {
                room = outbox.wait_room() => if room.is_err() { break },
                () = token.cancelled() => break,
            }
            let read = tokio::select! {
                r = reader.read_admitted(&ingress) => r,
                () = token.cancelled() => break,
            };
            let (msg, admission) = match read {
                Ok(Some(read)) => read,
                Ok(None) => break,
                Err(e) => {
                    if let Error::Protocol { source, .. } = &e {
                        let _ = outbox.try_send(Message::error(0, format!("malformed frame: {source}")));
                    }
                    tracing::warn!("closing connection from {peer}: {e}");
                    break;
                }
            };
            let (role, rank) = match sender_of(&msg, &config, who, authed) {
                Ok(r) => r,
                Err(text) => {
                    tracing::warn!("closing connection from {peer}: {text}");
                    let _ = outbox.try_send(Message::error(msg.request_id, text));
                    break;
                }
            };
            who = Some((role, rank));
            let (ev, ack) = match (role, msg.command) {
                (Role::Worker, Command::Push | Command::Pull | Command::PushPull | Command::ServerCommand) => {
                    (Event::Request { conn: id, worker: rank, msg, admission }, None)
                }
                (Role::Worker, Command::Shm) if !shm_offered => {
                    // Shared memory for the bulk bytes (`transport/share.rs`): asked once.
                    shm_offered = true;
                    let (answer, segments) = share::answer(&msg, &config, &broadcast);
                    let outgoing = segments.map(|(outgoing, incoming)| {
                        reader.set_shm(incoming);
                        outgoing
                    });
                    let _ = outbox.try_send(answer);
                    // Only frames queued after the answer may use this side's segment.
                    if let Some(outgoing) = outgoing {
                        let _ = shm_slot.set(outgoing);
                        tracing::debug!("worker rank {rank} at {peer} exchanges bulk bytes through shared memory");
                    }
                    continue;
                }
                (Role::Server, Command::Replicate) => {
                    let ack = super::link::ack(&msg);
                    (Event::Replicate { msg, admission }, Some(ack))
                }
                (_, other) => {
                    let _ = outbox.try_send(Message::error(msg.request_id, format!("a server does not accept {other:?} from a {role}")));
                    continue;
                }
            };
            let sent = tokio::select! {
                s = events.send(ev) => s,
                () = token.cancelled() => break,
            };
            if sent.is_err() {
                break;
            }
            if let Some(ack) = ack {
                let _ = outbox.try_send(ack);
            }
        }
        let _ = events.send(Event::Closed { conn: id }).await;
        // The writer flushes what is queued, then closes, once the core drops its clone.
        drop(outbox);
    }
}

/// The node a message comes from: a worker, or a server (a replication link); the same for
/// the whole connection, and the identity the connection authenticated as (its role, and its
/// node id once it had one).
fn sender_of(msg: &Message, config: &Config, seen: Option<(Role, Rank)>, authed: Option<Identity>) -> Result<(Role, Rank), String> {
    let sender = msg.sender.role_rank();
    match (sender, seen) {
        (Some(s), Some(prev)) if s == prev => return Ok(s),
        (_, Some((role, rank))) => return Err(format!("sender id {} on a connection of {role} rank {rank}", msg.sender)),
        _ => {}
    }
    let (role, rank) = match sender {
        Some((Role::Worker, r)) if r < config.num_workers => (Role::Worker, r),
        Some((Role::Server, r)) if r < config.num_servers => (Role::Server, r),
        _ => {
            return Err(format!(
                "sender id {} is not a worker of this cluster ({} workers) or one of its servers",
                msg.sender, config.num_workers
            ))
        }
    };
    match authed {
        Some(a) if a.role != role => Err(format!("a connection authenticated as a {} sends as {role} rank {rank}", a.role)),
        Some(a) if a.id != NodeId::NONE && a.id != msg.sender => {
            Err(format!("a connection authenticated as {a} sends as {role} rank {rank}; one connection cannot speak for another node"))
        }
        _ => Ok((role, rank)),
    }
}
