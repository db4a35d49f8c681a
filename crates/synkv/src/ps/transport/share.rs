//! Agreeing on shared memory over a fresh worker→server connection (`SYNKV_SHM`).
//!
//! The worker, right after the handshake, sends `Shm` with its segment's offer (`shm.rs`);
//! a server that can map it (same host, same user) answers `Shm` with its own, else an
//! `Error` saying why, and both sides go on with every byte on the connection. Either way the
//! offer costs one round trip per connection; failure detection is unchanged (the
//! connection carries every frame, the segments only the bulk bytes of data frames).
//!
//! A worker that reads broadcast segments says so in its offer; the server then also names
//! its broadcast segment (one per server, `shm/broadcast.rs`) and the worker's bit in it, and
//! answers that every local worker pulls are copied there once.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::shm::{self, Broadcast, Incoming, Offer, Outgoing};
use super::writer::ShmOut;
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
    let terms = WorkerTerms { segment: outgoing.offer(), reads_broadcast: true };
    let text = serde_json::to_string(&terms).map_err(|e| Error::Io(std::io::Error::other(e)))?;
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
            let terms: ServerTerms = serde_json::from_str(&answer.meta.text)
                .map_err(|e| Error::InvalidArgument(format!("{peer} answered the shared-memory offer with a malformed offer: {e}")))?;
            let cannot = |e| {
                Error::InvalidArgument(format!(
                    "{peer} mapped this worker's shared memory but offered a segment this worker cannot map: {e}; \
                     set SYNKV_SHM=0 to move every byte over the connection"
                ))
            };
            let incoming = Incoming::open(&terms.segment).map_err(cannot)?;
            let broadcast = match terms.broadcast {
                Some(joined) => Some((Incoming::open(&joined.segment).map_err(cannot)?, joined.bit)),
                None => None,
            };
            conn.set_shm(outgoing, incoming);
            if let Some((segment, bit)) = broadcast {
                conn.set_broadcast(segment, bit);
            }
            Ok(true)
        }
        Command::Error => {
            tracing::debug!("{peer} declined shared memory: {}", answer.meta.text);
            Ok(false)
        }
        other => Err(Error::InvalidArgument(format!("{peer} answered the shared-memory offer with {other:?}"))),
    }
}

/// A worker's offer: its segment, and whether it reads a server's broadcast segment.
#[derive(Serialize, Deserialize)]
struct WorkerTerms {
    #[serde(flatten)]
    segment: Offer,
    #[serde(default)]
    reads_broadcast: bool,
}

/// A server's answer: its segment for this connection, and its broadcast segment with the
/// worker's bit in it (for a worker that reads one, while bits last).
#[derive(Serialize, Deserialize)]
struct ServerTerms {
    #[serde(flatten)]
    segment: Offer,
    #[serde(default)]
    broadcast: Option<Joined>,
}

#[derive(Serialize, Deserialize)]
struct Joined {
    segment: Offer,
    bit: u32,
}

/// A server's broadcast segment, made when the first local worker connects (`None` if it
/// could not be).
#[derive(Debug, Default)]
pub struct BroadcastHub(OnceLock<Option<Arc<Broadcast>>>);

/// A broadcast segment's size: it holds the server's large values too (`server/entry.rs`),
/// so it is sized far beyond them (pages take memory only once used), but at most an eighth
/// of this process's address-space limit (`ulimit -v`, which some clusters set): every local
/// worker maps it too.
fn broadcast_bytes(at_least: usize) -> usize {
    let cap = shm::address_space_limit().map_or(usize::MAX, |l| usize::try_from(l / 8).unwrap_or(usize::MAX));
    at_least.max((64usize << 30).min(cap))
}

impl BroadcastHub {
    /// The segment, if a local worker made the server create it.
    pub fn existing(&self) -> Option<&Arc<Broadcast>> {
        self.0.get().and_then(Option::as_ref)
    }

    fn get(&self, size: usize) -> Option<&Arc<Broadcast>> {
        self.0
            .get_or_init(|| {
                Broadcast::create(broadcast_bytes(size))
                    .inspect_err(|e| tracing::warn!("no broadcast segment (each local worker's answers are copied for it): {e}"))
                    .ok()
            })
            .as_ref()
    }
}

/// Server side: maps the worker's offered segment and makes one of its own (and gives the
/// worker a bit in `hub`'s broadcast segment if it reads one). The answer to send (`Shm`
/// with this side's offer, or an `Error` saying why not), and the segments when they are to
/// be used: the reader takes `Incoming` at once, the writer [`ShmOut`] once the answer is
/// queued.
pub fn answer(offer: &Message, config: &Config, hub: &BroadcastHub) -> (Message, Option<(ShmOut, Incoming)>) {
    let declined = |why: String| (Message::error(offer.request_id, why), None);
    if !config.shm {
        return declined("SYNKV_SHM=0 on this server".to_owned());
    }
    let theirs: WorkerTerms = match serde_json::from_str(&offer.meta.text) {
        Ok(o) => o,
        Err(e) => return declined(format!("malformed shared-memory offer: {e}")),
    };
    let incoming = match Incoming::open(&theirs.segment) {
        Ok(i) => i,
        Err(e) => return declined(e.to_string()),
    };
    let size = usize::try_from(config.shm_bytes).unwrap_or(usize::MAX);
    let outgoing = match Outgoing::create(size) {
        Ok(o) => o,
        Err(e) => return declined(e.to_string()),
    };
    let member = if theirs.reads_broadcast { hub.get(size).and_then(|b| b.join(theirs.segment.pid)) } else { None };
    let joined = member.as_ref().map(|m| Joined { segment: m.segment_offer(), bit: m.bit() });
    let terms = ServerTerms { segment: outgoing.offer(), broadcast: joined };
    let mut msg = Message::new(Command::Shm).with_request_id(offer.request_id);
    match serde_json::to_string(&terms) {
        Ok(text) => msg.meta.text = text,
        Err(e) => return declined(e.to_string()),
    }
    (msg, Some((ShmOut { own: outgoing, broadcast: member }, incoming)))
}
