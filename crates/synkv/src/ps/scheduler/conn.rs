//! One accepted connection: authenticate, read `Register`, then relay messages to the core
//! while a writer task drains the peer's outbox.
//!
//! Nothing a peer sends reaches the core before authentication and a valid `Register`. A
//! malformed frame, a failed handshake or a wrong first message closes this connection only
//! (with an `Error` reply where the connection still allows one) and is logged with the reason.
//! The writer closes the connection once the core drops the outbox (after flushing what was
//! queued) or when the connection's token is cancelled.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::core::{ConnId, Event};
use crate::ps::node::Role;
use crate::ps::proto::{Command, Limits, Message};
use crate::ps::transport::{drain, Connection, Drained, Outbox, Pending};
use crate::ps::{auth, Config, Error, Result};

/// Messages queued for one peer before it counts as unresponsive.
const OUTBOX: usize = 1024;

/// Everything a connection task needs.
pub(super) struct ConnTask {
    pub(super) id: ConnId,
    pub(super) conn: Connection,
    pub(super) config: Config,
    pub(super) events: mpsc::Sender<Event>,
    pub(super) token: CancellationToken,
    pub(super) tracker: TaskTracker,
}

impl ConnTask {
    /// Runs the connection; `pending` is its place until it authenticated and registered
    /// (within the place's deadline), then traded for an established one.
    pub(super) async fn run(mut self, pending: Pending) {
        let peer = self.conn.peer().to_owned();
        // Only control messages travel to the scheduler.
        let control = self.conn.limits().capped(Limits::CONTROL_FRAME_BYTES);
        self.conn.set_limits(control);
        let deadline = pending.deadline();
        let token = self.token.clone();
        let register = tokio::select! {
            r = tokio::time::timeout(deadline, self.authenticate_and_register(deadline)) => {
                r.unwrap_or_else(|_| Err(Error::timeout(format!("{peer} to authenticate and register"), deadline)))
            }
            () = token.cancelled() => return,
        };
        let node = match register {
            Ok(node) => node,
            Err(e) => {
                tracing::warn!("closing connection from {peer}: {e}");
                return;
            }
        };
        let Some(_place) = pending.establish() else {
            let text = "the scheduler holds as many connections as the cluster has nodes (and a slack): refusing another";
            let _ = tokio::time::timeout(deadline, self.conn.write_message(&Message::error(0, text))).await;
            tracing::warn!("closing connection from {peer}: {text}");
            return;
        };
        let ConnTask { id, mut conn, config, events, token, tracker } = self;
        conn.set_peer(node.to_string());
        let (mut reader, mut writer) = conn.into_split();
        writer.set_stall_timeout(Some(config.timeout));
        let (outbox, rx) = Outbox::bounded(OUTBOX, 2 * Limits::CONTROL_FRAME_BYTES);
        let writer_token = token.clone();
        tracker.spawn(async move {
            match drain(writer, rx, writer_token.clone(), |_, _| None).await {
                Drained::Failed(e) => tracing::warn!("closing the connection: {e}"),
                Drained::Closed | Drained::Stopped => {}
            }
            // The core dropped this peer, or a write failed: stop the reader as well.
            writer_token.cancel();
        });
        if events.send(Event::Registered { conn: id, node, outbox, token: token.clone() }).await.is_err() {
            return;
        }
        let reason = loop {
            let read = tokio::select! {
                r = reader.read_message() => r,
                // The core dropped this peer, or a write failed: report it (ignored if dropped).
                () = token.cancelled() => break Some("the connection failed or was closed by the scheduler".to_owned()),
            };
            match read {
                Ok(Some(msg)) => {
                    if events.send(Event::Message { conn: id, msg }).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break None,
                Err(e) => {
                    tracing::warn!("closing connection from {}: {e}", reader.peer());
                    break Some(e.to_string());
                }
            }
        };
        let _ = events.send(Event::Closed { conn: id, reason }).await;
    }

    /// Authentication handshake, then the first message, which must be a valid `Register`.
    async fn authenticate_and_register(&mut self, within: Duration) -> Result<crate::ps::Node> {
        let me = auth::Identity::new(Role::Scheduler, crate::ps::node::NodeId::SCHEDULER);
        let proven = auth::accept(&mut self.conn, self.config.secret.as_ref(), me, within).await?.map(|who| who.role);
        let first = tokio::time::timeout(within, self.conn.read_message())
            .await
            .map_err(|_| Error::timeout(format!("Register from {}", self.conn.peer()), within))?;
        let refuse =
            |conn: &Connection, detail: String| Error::Unexpected { peer: conn.peer().to_owned(), command: Command::Register, detail };
        let msg = match first {
            Ok(Some(m)) if m.command == Command::Register => m,
            Ok(Some(m)) => {
                let e = Error::Unexpected { peer: self.conn.peer().to_owned(), command: m.command, detail: "expected Register".into() };
                let _ = self.conn.write_message(&Message::error(m.request_id, e.to_string())).await;
                return Err(e);
            }
            Ok(None) => return Err(refuse(&self.conn, "closed before registering".into())),
            Err(e) => {
                if let Error::Protocol { source, .. } = &e {
                    let _ = self.conn.write_message(&Message::error(0, format!("malformed frame: {source}"))).await;
                }
                return Err(e);
            }
        };
        let node = match msg.single_node() {
            Ok(n) => n.clone(),
            Err(e) => {
                let _ = self.conn.write_message(&Message::error(msg.request_id, e.to_string())).await;
                return Err(Error::protocol(self.conn.peer(), e));
            }
        };
        let problem = match (node.role, proven) {
            (Role::Scheduler, _) => Some("a scheduler cannot register with the scheduler".to_owned()),
            (role, Some(proved)) if role != proved => Some(format!("registered as {role} but authenticated as {proved}")),
            _ => None,
        };
        if let Some(detail) = problem {
            let _ = self.conn.write_message(&Message::error(msg.request_id, detail.clone())).await;
            return Err(refuse(&self.conn, detail));
        }
        Ok(node)
    }
}
