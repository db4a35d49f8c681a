//! Agreeing on shared memory over a fresh worker→server connection (`SYNKV_SHM`).
//!
//! The worker, right after the handshake, sends `Shm` with its segment's offer (`shm.rs`);
//! a server that can map it (same host, same user) answers `Shm` with its own, else an
//! `Error` saying why, and both sides go on with every byte on the connection. Either way the
//! offer costs one round trip per connection; failure detection is unchanged (the
//! connection carries every frame, the segments only the bulk bytes of data frames).

use std::time::Duration;

use super::shm::{Incoming, Offer, Outgoing};
use super::Connection;
use crate::ps::node::NodeId;
use crate::ps::proto::{Command, Message};
use crate::ps::{Config, Error, Result};

/// Worker side: offers a segment to the server at the other end of `conn` and, if it maps it
/// and offers one back, switches `conn` to shared memory. `Ok(false)` when the server
/// declined (another host, `SYNKV_SHM=0` there, or no memory for a segment).
pub async fn offer(conn: &mut Connection, config: &Config, me: NodeId, within: Duration) -> Result<bool> {
    let outgoing = match Outgoing::create(usize::try_from(config.shm_bytes).unwrap_or(usize::MAX)) {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!("no shared memory with {}: {e}", conn.peer());
            return Ok(false);
        }
    };
    let text = serde_json::to_string(&outgoing.offer()).map_err(|e| Error::Io(std::io::Error::other(e)))?;
    let mut msg = Message::new(Command::Shm).with_sender(me);
    msg.meta.text = text;
    let peer = conn.peer().to_owned();
    let answer = tokio::time::timeout(within, async {
        conn.write_message(&msg).await?;
        conn.read_message().await
    })
    .await
    .map_err(|_| Error::timeout(format!("{peer} to answer the shared-memory offer"), within))??;
    let answer = answer.ok_or_else(|| Error::Shutdown(format!("{peer} closed the connection after the shared-memory offer")))?;
    match answer.command {
        Command::Shm => {
            let offer: Offer = serde_json::from_str(&answer.meta.text)
                .map_err(|e| Error::InvalidArgument(format!("{peer} answered the shared-memory offer with a malformed offer: {e}")))?;
            match Incoming::open(&offer) {
                Ok(incoming) => {
                    conn.set_shm(outgoing, incoming);
                    Ok(true)
                }
                Err(e) => Err(Error::InvalidArgument(format!(
                    "{peer} mapped this worker's shared memory but offered a segment this worker cannot map: {e}"
                ))),
            }
        }
        Command::Error => {
            tracing::debug!("{peer} declined shared memory: {}", answer.meta.text);
            Ok(false)
        }
        other => Err(Error::InvalidArgument(format!("{peer} answered the shared-memory offer with {other:?}"))),
    }
}

/// Server side: maps the worker's offered segment and makes one of its own. The answer to
/// send (`Shm` with this side's offer, or an `Error` saying why not), and the segments when
/// they are to be used: the reader takes `Incoming` at once, the writer `Outgoing` once the
/// answer is queued.
pub fn answer(offer: &Message, config: &Config) -> (Message, Option<(Outgoing, Incoming)>) {
    let declined = |why: String| (Message::error(offer.request_id, why), None);
    if !config.shm {
        return declined("SYNKV_SHM=0 on this server".to_owned());
    }
    let theirs: Offer = match serde_json::from_str(&offer.meta.text) {
        Ok(o) => o,
        Err(e) => return declined(format!("malformed shared-memory offer: {e}")),
    };
    let incoming = match Incoming::open(&theirs) {
        Ok(i) => i,
        Err(e) => return declined(e.to_string()),
    };
    let outgoing = match Outgoing::create(usize::try_from(config.shm_bytes).unwrap_or(usize::MAX)) {
        Ok(o) => o,
        Err(e) => return declined(e.to_string()),
    };
    let mut msg = Message::new(Command::Shm).with_request_id(offer.request_id);
    match serde_json::to_string(&outgoing.offer()) {
        Ok(text) => msg.meta.text = text,
        Err(e) => return declined(e.to_string()),
    }
    (msg, Some((outgoing, incoming)))
}
