//! One worker connection to a server: authenticate, then relay requests to the core while a
//! writer task drains the connection's outbox.
//!
//! Every message must come from one worker: its header's sender id must be a worker id of
//! this cluster, the same for the whole connection. A malformed frame, a failed handshake or
//! a foreign sender closes this connection only, after an `Error` reply where the connection
//! still allows one (mini-redis's rule); an unknown command gets an `Error` reply and the
//! connection stays open.
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
use crate::ps::node::{Rank, Role};
use crate::ps::proto::{Command, ErrorCode, Message};
use crate::ps::transport::{drain, Connection, Drained, Ingress, Outbox};
use crate::ps::{auth, Config, Error};

/// Everything a connection task needs.
pub(super) struct ConnTask {
    pub(super) id: u64,
    pub(super) conn: Connection,
    pub(super) config: Config,
    pub(super) events: mpsc::Sender<Event>,
    pub(super) token: CancellationToken,
    pub(super) tracker: TaskTracker,
    pub(super) ingress: Ingress,
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
        let ConnTask { id, conn, config, events, token, tracker, ingress } = self;
        let (mut reader, mut writer) = conn.into_split();
        writer.set_stall_timeout(Some(config.timeout));
        reader.set_stall_timeout(Some(config.timeout));
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
        let mut worker: Option<Rank> = None;
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
            let rank = match sender_rank(&msg, config.num_workers, worker) {
                Ok(r) => r,
                Err(text) => {
                    tracing::warn!("closing connection from {peer}: {text}");
                    let _ = outbox.try_send(Message::error(msg.request_id, text));
                    break;
                }
            };
            worker = Some(rank);
            match msg.command {
                Command::Push | Command::Pull | Command::PushPull | Command::ServerCommand => {
                    let ev = Event::Request { conn: id, worker: rank, msg, admission };
                    let sent = tokio::select! {
                        s = events.send(ev) => s,
                        () = token.cancelled() => break,
                    };
                    if sent.is_err() {
                        break;
                    }
                }
                other => {
                    let _ = outbox.try_send(Message::error(msg.request_id, format!("a server does not accept {other:?}")));
                }
            }
        }
        let _ = events.send(Event::Closed { conn: id }).await;
        // The writer flushes what is queued, then closes, once the core drops its clone.
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
