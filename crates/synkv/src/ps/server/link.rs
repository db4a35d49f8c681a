//! A primary's link to the server keeping its partition's backup copy
//! (`SYNKV_SERVER_REPLICAS=1`): one authenticated connection per partition, a writer task
//! draining the partition's `Replicate` messages, and a reader task handing the backup's
//! acknowledgements to the core as [`Event::ReplicaAck`].
//!
//! The backup acknowledges a message once it is queued for its core (`conn.rs`), which is
//! enough: its core applies queued messages in order, before any later failover event, so a
//! primary dying right after an acknowledgement loses nothing. The outbox is unbounded but
//! cannot run away: every reply of the partition waits for the acknowledgements, so workers
//! cannot push faster than the backup takes the changes.
//!
//! A link that ends is reported ([`Lost`]): if its backup is not announced dead within failure
//! detection, the primary cannot replicate any more and stops (exits with an error), which
//! the scheduler handles like any server death: the partition fails over to the backup, whose
//! copy holds everything a worker has seen.

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::core::Event;
use crate::ps::node::{Node, Role};
use crate::ps::proto::{Command, Message};
use crate::ps::transport::{drain, Drained, Outbox, Transport};
use crate::ps::{auth, Config, Result};

/// Connects (as server `me`) to `backup` for `partition` and starts the link's tasks (stopped by `stop`).
/// Returns the outbox to send `Replicate` messages on.
pub(super) async fn connect<T: Transport>(
    transport: &T,
    config: &Config,
    (me, backup): (crate::ps::node::NodeId, &Node),
    partition: u32,
    reports: Reports,
    stop: CancellationToken,
    tracker: &TaskTracker,
) -> Result<Outbox> {
    let conn = auth::dial(transport, backup, config, auth::Identity::new(Role::Server, me), "the replication link to").await?;
    let (mut reader, mut writer) = conn.into_split();
    writer.set_stall_timeout(Some(config.timeout));
    let (outbox, rx) = Outbox::unbounded();
    let peer = backup.to_string();
    let writer_stop = stop.clone();
    tracker.spawn(async move {
        if let Drained::Failed(e) = drain(writer, rx, writer_stop, |_, _| None).await {
            tracing::warn!("replication link of partition {partition} to {peer}: {e}");
        }
    });
    let (peer, backup_rank) = (backup.to_string(), backup.rank.unwrap_or(u32::MAX));
    let Reports { events, lost } = reports;
    tracker.spawn(async move {
        let gone = Lost { partition, backup: backup_rank };
        loop {
            let read = tokio::select! {
                r = reader.read_message() => r,
                () = stop.cancelled() => return,
            };
            match read {
                Ok(Some(m)) if matches!(m.command, Command::Reply | Command::Error) => {
                    if m.command == Command::Error {
                        tracing::error!("the backup copy of partition {partition} on {peer} refused a change: {}", m.meta.text);
                    }
                    if events.send(Event::ReplicaAck { partition, seq: m.request_id }).await.is_err() {
                        return;
                    }
                }
                Ok(Some(m)) => tracing::warn!("ignoring {:?} on the replication link to {peer}", m.command),
                // A dead backup is the scheduler's to announce (a failover assigns another);
                // the supervisor waits for that, and stops this server if it does not come.
                Ok(None) => {
                    let _ = lost.send(gone);
                    return;
                }
                Err(e) => {
                    tracing::warn!("replication link of partition {partition} to {peer}: {e}");
                    let _ = lost.send(gone);
                    return;
                }
            }
        }
    });
    tracing::info!("partition {partition} replicates to {backup}");
    Ok(outbox)
}

/// Where a link reports: the backup's acknowledgements to the core, its end to the
/// supervisor.
#[derive(Clone)]
pub(super) struct Reports {
    pub(super) events: mpsc::Sender<Event>,
    pub(super) lost: mpsc::UnboundedSender<Lost>,
}

/// A replication link that ended while the server runs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lost {
    pub(super) partition: u32,
    /// The backup's server rank.
    pub(super) backup: u32,
}

/// The acknowledgement of `Replicate` message `msg`.
pub(super) fn ack(msg: &Message) -> Message {
    let mut m = Message::new(Command::Reply).with_request_id(msg.request_id);
    m.partition = msg.partition;
    m
}
