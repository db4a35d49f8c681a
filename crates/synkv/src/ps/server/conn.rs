//! One worker connection to a server: authenticate, then relay requests to the core while a
//! writer task drains the connection's outbox.
//!
//! Every message must come from one worker: its header's sender id must be a worker id of
//! this cluster, the same for the whole connection. A malformed frame, a failed handshake or
//! a foreign sender closes this connection only, after an `Error` reply where the connection
//! still allows one (mini-redis's rule); an unknown command gets an `Error` reply and the
//! connection stays open.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::core::{Event, Outbox};
use crate::ps::node::{Rank, Role};
use crate::ps::proto::{Command, Message};
use crate::ps::transport::{Connection, FrameWriter};
use crate::ps::{auth, Config, Error};

/// Everything a connection task needs.
pub(super) struct ConnTask {
    pub(super) id: u64,
    pub(super) conn: Connection,
    pub(super) config: Config,
    pub(super) events: mpsc::UnboundedSender<Event>,
    pub(super) token: CancellationToken,
    pub(super) tracker: TaskTracker,
    /// Every live connection's outbox, for the farewell message on failure.
    pub(super) outboxes: Outboxes,
}

/// The outboxes of the live connections, by connection id.
pub(super) type Outboxes = Arc<Mutex<HashMap<u64, Outbox>>>;

/// Sends `msg` to every live connection (a server's last word before it stops).
pub(super) fn tell_all(outboxes: &Outboxes, msg: &Message) {
    for outbox in outboxes.lock().unwrap_or_else(PoisonError::into_inner).values() {
        let _ = outbox.send(msg.clone());
    }
}

impl ConnTask {
    pub(super) async fn run(mut self) {
        let peer = self.conn.peer().to_owned();
        let handshake = self.config.heartbeat_timeout;
        let proven = tokio::select! {
            r = auth::accept(&mut self.conn, self.config.secret.as_ref(), handshake) => r,
            () = self.token.cancelled() => return,
        };
        match proven {
            Ok(None | Some(Role::Worker)) => {}
            Ok(Some(role)) => {
                let text = format!("a {role} cannot send data requests to a server");
                let _ = tokio::time::timeout(handshake, self.conn.write_message(&Message::error(0, text))).await;
                tracing::warn!("closing connection from {peer}: authenticated as {role}, not a worker");
                return;
            }
            Err(e) => {
                tracing::warn!("closing connection from {peer}: {e}");
                return;
            }
        }
        let ConnTask { id, conn, config, events, token, tracker, outboxes } = self;
        let (mut reader, writer) = conn.into_split();
        let (outbox, rx) = mpsc::unbounded_channel();
        outboxes.lock().unwrap_or_else(PoisonError::into_inner).insert(id, outbox.clone());
        tracker.spawn(write_loop(writer, rx, token.clone(), config.timeout));
        let mut worker: Option<Rank> = None;
        loop {
            let read = tokio::select! {
                r = reader.read_message() => r,
                () = token.cancelled() => break,
            };
            let msg = match read {
                Ok(Some(msg)) => msg,
                Ok(None) => break,
                Err(e) => {
                    if let Error::Protocol { source, .. } = &e {
                        let _ = outbox.send(Message::error(0, format!("malformed frame: {source}")));
                    }
                    tracing::warn!("closing connection from {peer}: {e}");
                    break;
                }
            };
            let rank = match sender_rank(&msg, config.num_workers, worker) {
                Ok(r) => r,
                Err(text) => {
                    tracing::warn!("closing connection from {peer}: {text}");
                    let _ = outbox.send(Message::error(msg.request_id, text));
                    break;
                }
            };
            worker = Some(rank);
            match msg.command {
                Command::Push | Command::Pull | Command::PushPull | Command::ServerCommand => {
                    let ev = Event::Request { conn: id, worker: rank, msg, reply: outbox.clone() };
                    if events.send(ev).is_err() {
                        break;
                    }
                }
                other => {
                    let _ = outbox.send(Message::error(msg.request_id, format!("a server does not accept {other:?}")));
                }
            }
        }
        outboxes.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
        let _ = events.send(Event::Closed { conn: id });
        // The writer flushes what is queued, then closes, once the core drops its clones.
        drop(outbox);
    }
}

/// The worker rank a message comes from; it must be the same for the whole connection.
fn sender_rank(msg: &Message, num_workers: u32, seen: Option<Rank>) -> Result<Rank, String> {
    match (msg.sender.role_rank(), seen) {
        (Some((Role::Worker, r)), None) if r < num_workers => Ok(r),
        (Some((Role::Worker, r)), Some(s)) if r == s => Ok(r),
        (_, Some(s)) => Err(format!("sender id {} on a connection of worker rank {s}", msg.sender)),
        _ => Err(format!("sender id {} is not a worker of this cluster ({num_workers} workers)", msg.sender)),
    }
}

/// Writes queued messages until every sender is gone (then closes the connection) or the
/// token is cancelled. Each write is bounded by `timeout`; a failed write cancels the token.
async fn write_loop(mut writer: FrameWriter, mut rx: mpsc::UnboundedReceiver<Message>, token: CancellationToken, timeout: Duration) {
    loop {
        let msg = tokio::select! {
            m = rx.recv() => m,
            () = token.cancelled() => return,
        };
        let Some(msg) = msg else { break };
        match tokio::time::timeout(timeout, writer.write_message(&msg)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!("write to {} failed: {e}", writer.peer());
                token.cancel();
                return;
            }
            Err(_) => {
                tracing::warn!("write to {} timed out after {timeout:?}", writer.peer());
                token.cancel();
                return;
            }
        }
    }
    let _ = tokio::time::timeout(timeout, writer.shutdown()).await;
}
