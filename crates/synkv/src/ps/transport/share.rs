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
//!
//! A worker and a server in one process (a server hosted by a worker process under torchrun,
//! Slurm or MPI, `store/distributed/hosted.rs`) always share memory, even with `SYNKV_SHM=0`:
//! that setting keeps bytes between *processes* on the sockets, and no socket is needed for a
//! process's own server. [`InProcess`] marks such a server; [`in_process`] asks.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::shm::{self, Broadcast, Incoming, Offer, Outgoing};
use super::writer::ShmOut;
use super::Connection;
use crate::ps::node::NodeId;
use crate::ps::proto::{Command, Message};
use crate::ps::{Config, Error, Result};

/// The servers this process hosts, as they advertise themselves (host, port).
static IN_PROCESS: Mutex<Vec<(String, u16)>> = Mutex::new(Vec::new());

/// A server hosted by this process, marked for [`in_process`] while this value lives.
#[derive(Debug)]
pub struct InProcess {
    host: String,
    port: u16,
}

impl InProcess {
    /// Marks the server advertised at `host:port` as this process's own.
    pub fn mark(host: &str, port: u16) -> InProcess {
        IN_PROCESS.lock().unwrap_or_else(PoisonError::into_inner).push((host.to_owned(), port));
        InProcess { host: host.to_owned(), port }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        let mut marked = IN_PROCESS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = marked.iter().position(|(h, p)| *h == self.host && *p == self.port) {
            marked.swap_remove(i);
        }
    }
}

/// Whether the server advertised at `host:port` runs in this process. A wrong `true` (another
/// host advertising the same address) costs one declined offer, never a wrong byte: the
/// server checks the offer's segment (`shm.rs`).
pub fn in_process(host: &str, port: u16) -> bool {
    IN_PROCESS.lock().unwrap_or_else(PoisonError::into_inner).iter().any(|(h, p)| h == host && *p == port)
}

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
    let theirs: WorkerTerms = match serde_json::from_str(&offer.meta.text) {
        Ok(o) => o,
        Err(e) => return declined(format!("malformed shared-memory offer: {e}")),
    };
    // A worker of this very process shares memory whatever SYNKV_SHM says (module docs); the
    // segment's token proves the pid (`Incoming::open`).
    if !config.shm && theirs.segment.pid != std::process::id() {
        return declined("SYNKV_SHM=0 on this server".to_owned());
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn server_config(shm: &str) -> Config {
        Config::from_map([
            ("DMLC_ROLE", "server"),
            ("DMLC_PS_ROOT_URI", "127.0.0.1"),
            ("DMLC_PS_ROOT_PORT", "9000"),
            ("DMLC_NUM_SERVER", "1"),
            ("DMLC_NUM_WORKER", "1"),
            ("SYNKV_SHM", shm),
        ])
        .expect("a valid configuration")
    }

    /// A worker's `Shm` offer of `segment`, its pid replaced by `pid`.
    fn offer_from(segment: &Outgoing, pid: u32) -> Message {
        let mut terms = WorkerTerms { segment: segment.offer(), reads_broadcast: false };
        terms.segment.pid = pid;
        let mut msg = Message::new(Command::Shm).with_request_id(7);
        msg.meta.text = serde_json::to_string(&terms).expect("terms serialize");
        msg
    }

    #[test]
    fn a_mark_names_its_server_while_it_lives() {
        // A port no other test marks.
        assert!(!in_process("in-process-test-host", 61_234));
        let mark = InProcess::mark("in-process-test-host", 61_234);
        assert!(in_process("in-process-test-host", 61_234));
        assert!(!in_process("in-process-test-host", 61_235), "another port");
        assert!(!in_process("127.0.0.1", 61_234), "another host");
        drop(mark);
        assert!(!in_process("in-process-test-host", 61_234));
    }

    /// With SYNKV_SHM=0 a server still maps the segment of a worker of its own process (no
    /// socket is needed inside a process), and declines every other; with SYNKV_SHM=1 it maps
    /// this process's segment either way.
    #[test]
    fn shm_off_still_shares_memory_within_the_process() {
        let segment = Outgoing::create(shm::MIN_SEGMENT).expect("a segment");
        let hub = BroadcastHub::default();
        let (reply, segments) = answer(&offer_from(&segment, std::process::id()), &server_config("0"), &hub);
        assert_eq!(reply.command, Command::Shm, "{}", reply.meta.text);
        assert!(segments.is_some());

        let other = std::process::id().wrapping_add(1);
        let (reply, segments) = answer(&offer_from(&segment, other), &server_config("0"), &hub);
        assert_eq!(reply.command, Command::Error);
        assert!(reply.meta.text.contains("SYNKV_SHM=0"), "{}", reply.meta.text);
        assert!(segments.is_none());

        let (reply, _) = answer(&offer_from(&segment, std::process::id()), &server_config("1"), &hub);
        assert_eq!(reply.command, Command::Shm, "{}", reply.meta.text);
    }
}
