//! [`FrameWriter`] (whole messages onto a byte stream, tensor bytes never copied), the bounded
//! [`Outbox`] a connection's messages wait in, and [`drain`]: the one loop that writes an
//! outbox to its connection, for every role.
//!
//! Writing hands the encoded head and every chunk's own `Bytes` to vectored I/O. A stall
//! timeout bounds each write call, not the whole message: a 1 GiB frame on a slow link is
//! fine as long as bytes keep moving; a peer that stops reading for the timeout is stuck.
//!
//! An outbox is bounded in bytes (a message larger than the bound is admitted alone), hard or
//! soft (see [`Outbox`]). [`Outbox::try_send`] never waits (for single-threaded state
//! machines: the scheduler's and the server's cores); [`Outbox::send`] waits for room.

use std::fmt;
use std::io::IoSlice;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use super::seal::{FrameMac, Seal, MAC_STEP};
use super::shm::{Member, Outgoing, DESCRIPTOR_LEN};
use crate::ps::proto::{Chunk, Command, EncodeError, Flags, Limits, Message};
use crate::ps::{Error, Result};

/// Most slices handed to one vectored write (below every platform's IOV_MAX).
const MAX_IOV: usize = 64;
/// Source of chunk padding.
static ZEROS: [u8; 8] = [0; 8];
/// Sealed frames up to this size are fed to their MAC before the write, so the trailer travels
/// in the same vectored write; larger ones are fed as each write call sends them.
const SEAL_AHEAD_MAX: usize = 256 << 10;

/// The writing half of a [`Connection`](super::Connection).
pub struct FrameWriter {
    io: Box<dyn AsyncWrite + Send + Unpin>,
    limits: Limits,
    peer: Arc<str>,
    /// Longest a single write may make no progress (`None`: unbounded).
    stall: Option<Duration>,
    /// After the handshake: every frame is followed by its trailer (`seal.rs`).
    seal: Option<Arc<Seal>>,
    /// This side's shared-memory segments, once the peer mapped them: the bulk bytes of data
    /// frames go through them (`shm/`). Settable after the split ([`FrameWriter::shm_slot`]).
    shm: Arc<OnceLock<ShmOut>>,
}

/// The shared memory a writer sends through.
#[derive(Debug)]
pub struct ShmOut {
    /// The connection's own segment.
    pub own: Outgoing,
    /// This connection's place in the sender's broadcast segment (a server's, where the
    /// worker reads it): answers that several local workers receive are copied once.
    pub broadcast: Option<Member>,
}

impl fmt::Debug for FrameWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameWriter").field("peer", &self.peer).finish_non_exhaustive()
    }
}

impl FrameWriter {
    pub(super) fn new(io: Box<dyn AsyncWrite + Send + Unpin>, peer: Arc<str>, limits: Limits) -> FrameWriter {
        FrameWriter { io, limits, peer, stall: None, seal: None, shm: Arc::default() }
    }

    /// Where this writer's shared-memory segment goes once the peer mapped it; a frame written
    /// after it is set may carry descriptors into it.
    pub fn shm_slot(&self) -> Arc<OnceLock<ShmOut>> {
        Arc::clone(&self.shm)
    }

    /// From now on every frame is followed by a trailer sealed with `seal`.
    pub(super) fn set_seal(&mut self, seal: Arc<Seal>) {
        self.seal = Some(seal);
    }

    /// The peer's name.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    pub(super) fn set_peer(&mut self, peer: Arc<str>) {
        self.peer = peer;
    }

    pub(super) fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Bounds every write call by `stall`: a peer that accepts no byte for that long makes the
    /// write fail with [`Error::Timeout`].
    pub fn set_stall_timeout(&mut self, stall: Option<Duration>) {
        self.stall = stall;
    }

    /// Writes one message: `[head, chunk0, pad0, chunk1, pad1, …]` through vectored writes.
    /// A message that breaks the limits fails with [`Error::Encode`] before any byte is
    /// written (the connection stays usable). Not cancel-safe: a cancelled write may leave
    /// half a frame, so the connection must then be dropped.
    pub async fn write_message(&mut self, msg: &Message) -> Result<()> {
        let via_shm = self.shm.get().and_then(|segment| into_shm(segment, msg));
        let msg = via_shm.as_ref().unwrap_or(msg);
        let mut segments: Vec<Bytes> = Vec::with_capacity(1 + 2 * msg.chunks.len());
        segments.push(msg.encode_head(&self.limits)?.freeze());
        for chunk in &msg.chunks {
            if !chunk.data.is_empty() {
                segments.push(chunk.data.clone());
            }
            let pad = Message::chunk_padding(chunk.data.len());
            if pad > 0 {
                segments.push(Bytes::from_static(&ZEROS[..pad]));
            }
        }
        let stall = self.stall;
        let sent = match &self.seal {
            None => write_all_vectored(&mut self.io, segments, stall, None).await,
            Some(seal) => write_sealed(&mut self.io, segments, stall, seal).await,
        };
        let written = match sent {
            Ok(()) => match stall {
                None => self.io.flush().await,
                Some(t) => tokio::time::timeout(t, self.io.flush()).await.unwrap_or_else(|_| Err(no_progress())),
            },
            Err(e) => Err(e),
        };
        written.map_err(|e| match (e.kind(), stall) {
            (std::io::ErrorKind::TimedOut, Some(t)) => Error::timeout(format!("{} to accept bytes (it stopped reading)", self.peer), t),
            _ => Error::Io(e),
        })
    }

    /// Flushes and closes the write direction (the peer reads a clean EOF).
    pub async fn shutdown(&mut self) -> Result<()> {
        self.io.shutdown().await?;
        Ok(())
    }
}

/// Data frames with at least this many chunk bytes travel through shared memory.
const SHM_MIN_BYTES: usize = 32 << 10;

/// `msg` with its chunks copied into shared memory and replaced by descriptors, if it is a
/// data frame large enough and a segment has room (else it travels whole on the stream).
fn into_shm(shm: &ShmOut, msg: &Message) -> Option<Message> {
    let is_data = matches!(msg.command, Command::Push | Command::PushPull | Command::Reply);
    let bytes: usize = msg.chunks.iter().map(|c| c.data.len()).sum();
    // Many tiny chunks (small keys) cost more in descriptors than they save.
    let worth = bytes >= SHM_MIN_BYTES && bytes >= 8 * DESCRIPTOR_LEN * msg.chunks.len();
    if !is_data || msg.flags.contains(Flags::INIT) || msg.flags.contains(Flags::SHM) || !worth {
        return None;
    }
    let transport = &crate::ps::metrics::METRICS.transport;
    // An answer goes through the broadcast segment: the other local workers' answers of the
    // same values name the same slots (values living there are named in place, the others of
    // a many-chunk answer are copied once into one slot).
    let broadcast = shm.broadcast.as_ref().filter(|_| msg.command == Command::Reply);
    if let Some(placed) = broadcast.and_then(|m| {
        let data: Vec<Bytes> = msg.chunks.iter().map(|c| c.data.clone()).collect();
        m.place_all(&data)
    }) {
        transport.shm_bytes.add(u64::try_from(bytes).unwrap_or(u64::MAX));
        transport.shm_broadcast.add(1);
        return Some(with_descriptors(msg, &placed, Flags::SHM.with(Flags::BROADCAST)));
    }
    let data: Vec<&[u8]> = msg.chunks.iter().map(|c| &c.data[..]).collect();
    let Some(placed) = shm.own.put(&data) else {
        transport.shm_full.add(1);
        return None;
    };
    transport.shm_bytes.add(u64::try_from(bytes).unwrap_or(u64::MAX));
    Some(with_descriptors(msg, &placed, Flags::SHM))
}

/// `msg` with its chunks replaced by `placed` (one each) and `flags` added.
fn with_descriptors(msg: &Message, placed: &[super::shm::Descriptor], flags: Flags) -> Message {
    let mut wire = BytesMut::with_capacity(placed.len() * DESCRIPTOR_LEN);
    placed.iter().for_each(|d| wire.extend_from_slice(&d.encode()));
    let wire = wire.freeze();
    let chunks = msg
        .chunks
        .iter()
        .enumerate()
        .map(|(i, c)| Chunk { dtype: c.dtype, data: wire.slice(i * DESCRIPTOR_LEN..(i + 1) * DESCRIPTOR_LEN) })
        .collect();
    Message { chunks, flags: msg.flags.with(flags), meta: msg.meta.clone(), ..*msg }
}

fn no_progress() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "no progress")
}

/// Writes a frame's segments and its trailer: small frames MACed first and written with the
/// trailer in one go, large ones MACed as they are written.
async fn write_sealed<W: AsyncWrite + Unpin + ?Sized>(
    w: &mut W,
    mut segments: Vec<Bytes>,
    stall: Option<Duration>,
    seal: &Seal,
) -> std::io::Result<()> {
    let mut mac = seal.outgoing();
    if segments.iter().map(Bytes::len).sum::<usize>() <= SEAL_AHEAD_MAX {
        segments.iter().for_each(|s| mac.update(s));
        segments.push(Bytes::copy_from_slice(&seal.seal(mac)?));
        return write_all_vectored(w, segments, stall, None).await;
    }
    write_all_vectored(w, segments, stall, Some(&mut mac)).await?;
    let trailer = Bytes::copy_from_slice(&seal.seal(mac)?);
    write_all_vectored(w, vec![trailer], stall, None).await
}

/// Writes every segment, in order, with as few vectored writes as the stream allows; each
/// write call bounded by `stall`. With `mac`, the bytes each call wrote are fed to it.
async fn write_all_vectored<W: AsyncWrite + Unpin + ?Sized>(
    w: &mut W,
    mut segments: Vec<Bytes>,
    stall: Option<Duration>,
    mut mac: Option<&mut FrameMac>,
) -> std::io::Result<()> {
    let mut first = 0;
    while first < segments.len() {
        let written = {
            // While sealing, at most MAC_STEP bytes per call (fed to the MAC while in cache).
            let mut budget = if mac.is_some() { MAC_STEP } else { usize::MAX };
            let slices: Vec<IoSlice<'_>> = segments[first..]
                .iter()
                .take(MAX_IOV)
                .map_while(|b| {
                    let take = b.len().min(budget);
                    budget -= take;
                    (take > 0).then(|| IoSlice::new(&b[..take]))
                })
                .collect();
            match stall {
                None => w.write_vectored(&slices).await?,
                Some(t) => tokio::time::timeout(t, w.write_vectored(&slices)).await.map_err(|_| no_progress())??,
            }
        };
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let mut left = written;
        while left > 0 && first < segments.len() {
            let seg = &mut segments[first];
            let done = left.min(seg.len());
            if let Some(m) = mac.as_deref_mut() {
                m.update(&seg[..done]);
            }
            if left >= seg.len() {
                left -= seg.len();
                first += 1;
            } else {
                seg.advance(left);
                left = 0;
            }
        }
    }
    Ok(())
}

/// Bytes queued in an outbox, and who waits for them to drain.
#[derive(Debug, Default)]
struct Queue {
    bytes: AtomicU64,
    drained: Notify,
}

/// A message waiting in an outbox, with its weight (returned to the queue when dropped).
#[derive(Debug)]
pub(super) struct Queued {
    msg: Message,
    weight: u64,
    queue: Arc<Queue>,
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.queue.bytes.fetch_sub(self.weight, Ordering::AcqRel);
        self.queue.drained.notify_waiters();
    }
}

/// Why [`Outbox::try_send`] refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OutboxError {
    /// The outbox holds its bound of messages or bytes: the peer does not read.
    #[error("not reading its messages (outbox full)")]
    Full,
    /// The writer is gone (the connection closed).
    #[error("connection closed")]
    Closed,
}

/// The sending side of a connection's queue of messages. Cheap to clone; the writer
/// ([`drain`]) flushes what is queued and closes the connection once every clone is dropped.
///
/// Two kinds of bound: a *hard* one ([`Outbox::bounded`]: [`try_send`](Outbox::try_send)
/// refuses past it, for control connections, where a full outbox means a dead peer), and a
/// *soft* one ([`Outbox::soft`]: sends always queue, and the connection's reader waits with
/// [`wait_room`](Outbox::wait_room) before reading the next request, so a peer that does not
/// read its answers stops being read, and TCP pushes back on it). The soft bound never drops
/// an answer an honest peer waits for, and waiting only on already-queued answers cannot
/// deadlock: they drain as soon as that peer reads.
#[derive(Clone, Debug)]
pub struct Outbox {
    tx: mpsc::Sender<Queued>,
    queue: Arc<Queue>,
    max_bytes: u64,
    hard: bool,
}

/// The receiving side of an [`Outbox`], for [`drain`].
#[derive(Debug)]
pub struct OutboxRx(mpsc::Receiver<Queued>);

impl Outbox {
    /// An outbox of at most `max_messages` messages and `max_bytes` bytes of chunks (a message
    /// larger than that is admitted when the outbox is empty).
    pub fn bounded(max_messages: usize, max_bytes: u64) -> (Outbox, OutboxRx) {
        Outbox::make(max_messages, max_bytes, true)
    }

    /// An outbox with a soft bound of `max_bytes` (see the type's docs).
    pub fn soft(max_bytes: u64) -> (Outbox, OutboxRx) {
        Outbox::make(Semaphore::MAX_PERMITS, max_bytes, false)
    }

    /// An outbox whose only bound is its sender's own: a worker's requests, which are the
    /// operations its program scheduled (each holding its one copy of the pushed arrays).
    /// Bounding them here could deadlock two workers whose full queues each wait for the
    /// other's pushes in a sync round.
    pub fn unbounded() -> (Outbox, OutboxRx) {
        Outbox::make(Semaphore::MAX_PERMITS, u64::MAX, false)
    }

    fn make(max_messages: usize, max_bytes: u64, hard: bool) -> (Outbox, OutboxRx) {
        let (tx, rx) = mpsc::channel(max_messages.clamp(1, Semaphore::MAX_PERMITS));
        (Outbox { tx, queue: Arc::default(), max_bytes: max_bytes.max(1), hard }, OutboxRx(rx))
    }

    fn weight(msg: &Message) -> u64 {
        msg.chunks.iter().map(|c| u64::try_from(c.data.len()).unwrap_or(u64::MAX)).sum()
    }

    /// Bytes queued now.
    pub fn queued_bytes(&self) -> u64 {
        self.queue.bytes.load(Ordering::Acquire)
    }

    fn room_for(&self, weight: u64) -> bool {
        let queued = self.queued_bytes();
        queued == 0 || queued.saturating_add(weight) <= self.max_bytes
    }

    fn enqueue(&self, msg: Message, weight: u64) -> std::result::Result<(), OutboxError> {
        self.queue.bytes.fetch_add(weight, Ordering::AcqRel);
        let queued = Queued { msg, weight, queue: Arc::clone(&self.queue) };
        self.tx.try_send(queued).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => OutboxError::Full,
            mpsc::error::TrySendError::Closed(_) => OutboxError::Closed,
        })
    }

    /// Queues `msg` if there is room now (always, under a soft bound, unless closed).
    pub fn try_send(&self, msg: Message) -> std::result::Result<(), OutboxError> {
        let weight = Outbox::weight(&msg);
        if self.hard && !self.room_for(weight) {
            return Err(OutboxError::Full);
        }
        self.enqueue(msg, weight)
    }

    /// Queues `msg`, waiting for room first.
    pub async fn send(&self, msg: Message) -> std::result::Result<(), OutboxError> {
        let weight = Outbox::weight(&msg);
        self.wait_until(|o| o.room_for(weight)).await?;
        let permit = self.tx.reserve().await.map_err(|_| OutboxError::Closed)?;
        self.queue.bytes.fetch_add(weight, Ordering::AcqRel);
        permit.send(Queued { msg, weight, queue: Arc::clone(&self.queue) });
        Ok(())
    }

    /// Waits until fewer than the bound's bytes are queued (a reader's flow control).
    pub async fn wait_room(&self) -> std::result::Result<(), OutboxError> {
        self.wait_until(|o| o.queued_bytes() < o.max_bytes).await
    }

    async fn wait_until(&self, ready: impl Fn(&Outbox) -> bool) -> std::result::Result<(), OutboxError> {
        loop {
            let drained = self.queue.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.tx.is_closed() {
                return Err(OutboxError::Closed);
            }
            if ready(self) {
                return Ok(());
            }
            tokio::select! {
                () = drained => {}
                () = self.tx.closed() => return Err(OutboxError::Closed),
            }
        }
    }

    /// Whether the writer is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

impl OutboxRx {
    /// The next queued message, if any (for tests of the state machines that queue them).
    pub fn try_recv(&mut self) -> Option<Message> {
        self.0.try_recv().ok().map(|q| q.msg.clone())
    }
}

/// How a [`drain`] loop ended.
#[derive(Debug)]
pub enum Drained {
    /// Every sender was dropped: everything queued was written and the stream shut down.
    Closed,
    /// `stop` was cancelled; queued messages were dropped.
    Stopped,
    /// A write failed (or stalled): the connection is unusable.
    Failed(Error),
}

/// A queued message in [`drain`]'s order: highest [`wire_priority`] first, then queue order.
struct Ready {
    priority: i32,
    seq: u64,
    queued: Queued,
}

impl PartialEq for Ready {
    fn eq(&self, other: &Ready) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Ready {}

impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Ready) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ready {
    fn cmp(&self, other: &Ready) -> std::cmp::Ordering {
        self.priority.cmp(&other.priority).then_with(|| other.seq.cmp(&self.seq))
    }
}

/// Where a message goes in the write order: a worker's data request by its operation's
/// priority (the `priority` argument of push and pull, so the gradients the next forward
/// pass needs first leave first on a busy link), and a server's answer by its request's
/// (the server copies it); every other message at 0, so control messages, errors and
/// replication (whose priority field names its kind) keep their order.
fn wire_priority(msg: &Message) -> i32 {
    match msg.command {
        Command::Push | Command::PushPull | Command::Pull if msg.flags.contains(Flags::REQUEST) => msg.meta.priority,
        Command::Reply => msg.meta.priority,
        _ => 0,
    }
}

/// Writes `rx`'s messages to `writer` until every [`Outbox`] is dropped (then shuts the stream
/// down), `stop` is cancelled, or a write fails. Before each write, the messages queued by
/// then are ordered by [`wire_priority`], highest first, and in queue order among equals
/// (at most the outbox's bound of messages are taken off it ahead of their turn, so the
/// bound holds twice over at most). A message that cannot be encoded (it breaks the frame
/// limits) is handed to `unsendable`, which may return a replacement to write instead (an
/// `Error` answering the same request); the connection stays up.
pub async fn drain<F>(mut writer: FrameWriter, mut rx: OutboxRx, stop: CancellationToken, mut unsendable: F) -> Drained
where
    F: FnMut(&Message, &EncodeError) -> Option<Message> + Send,
{
    let mut ready: std::collections::BinaryHeap<Ready> = std::collections::BinaryHeap::new();
    let mut seq = 0u64;
    let cap = rx.0.max_capacity();
    loop {
        if ready.is_empty() {
            let queued = tokio::select! {
                q = rx.0.recv() => q,
                () = stop.cancelled() => return Drained::Stopped,
            };
            let Some(queued) = queued else { break };
            seq += 1;
            ready.push(Ready { priority: wire_priority(&queued.msg), seq, queued });
        }
        while ready.len() < cap {
            let Ok(queued) = rx.0.try_recv() else { break };
            seq += 1;
            ready.push(Ready { priority: wire_priority(&queued.msg), seq, queued });
        }
        if stop.is_cancelled() {
            return Drained::Stopped;
        }
        let Some(Ready { queued, .. }) = ready.pop() else { continue };
        let mut next = Some(queued.msg.clone());
        while let Some(msg) = next.take() {
            match writer.write_message(&msg).await {
                Ok(()) => {}
                Err(Error::Encode(e)) => {
                    tracing::warn!("a {:?} for {} breaks the frame limits: {e}", msg.command, writer.peer());
                    next = unsendable(&msg, &e);
                }
                Err(e) => return Drained::Failed(e),
            }
        }
        // Written: its bytes leave the queue now.
        drop(queued);
    }
    let stall = writer.stall.unwrap_or(Duration::from_secs(10));
    let _ = tokio::time::timeout(stall, writer.shutdown()).await;
    Drained::Closed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ps::proto::{Chunk, Command, DTypeCode};

    fn sized(n: usize) -> Message {
        let mut m = Message::new(Command::Reply);
        m.meta.keys = vec![1];
        m.meta.lens = vec![n as u64];
        m.chunks.push(Chunk { dtype: DTypeCode::U8, data: Bytes::from(vec![0u8; n]) });
        m
    }

    #[tokio::test]
    async fn a_soft_outbox_takes_everything_and_holds_its_reader_until_it_drains() {
        let (out, mut rx) = Outbox::soft(100);
        out.try_send(sized(80)).unwrap();
        out.try_send(sized(80)).unwrap();
        assert_eq!(out.queued_bytes(), 160, "a soft bound never refuses");
        let waiting = tokio::spawn({
            let out = out.clone();
            async move { out.wait_room().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "160 queued bytes of 100: the reader waits");
        rx.0.recv().await.unwrap(); // written: 80 left
        assert_eq!(out.queued_bytes(), 80);
        waiting.await.unwrap().unwrap();
    }

    #[test]
    fn an_outbox_is_bounded_in_messages_and_bytes_but_takes_one_big_message_alone() {
        let (out, _rx) = Outbox::bounded(3, 100);
        assert_eq!(out.try_send(sized(60)), Ok(()));
        assert_eq!(out.try_send(sized(60)), Err(OutboxError::Full), "120 bytes > 100");
        let (out, _rx) = Outbox::bounded(3, 100);
        assert_eq!(out.try_send(sized(1000)), Ok(()), "an empty outbox admits a message above the byte bound");
        assert_eq!(out.try_send(sized(1)), Err(OutboxError::Full));
        let (out, _rx) = Outbox::bounded(2, 1 << 20);
        assert_eq!(out.try_send(sized(1)), Ok(()));
        assert_eq!(out.try_send(sized(1)), Ok(()));
        assert_eq!(out.try_send(sized(1)), Err(OutboxError::Full), "message bound");
    }

    #[tokio::test]
    async fn drain_writes_in_order_replaces_unsendable_messages_and_closes() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let tiny = Limits { max_frame_bytes: 4096, ..Limits::default() };
        let conn = super::super::Connection::new(a, "peer", tiny);
        let (_, writer) = conn.into_split();
        let (out, rx) = Outbox::bounded(16, 1 << 20);
        out.try_send(sized(8).with_request_id(1)).unwrap();
        out.try_send(sized(10_000).with_request_id(2)).unwrap();
        out.try_send(sized(16).with_request_id(3)).unwrap();
        drop(out);
        let end = drain(writer, rx, CancellationToken::new(), |m, e| Some(Message::error(m.request_id, e.to_string()))).await;
        assert!(matches!(end, Drained::Closed));
        let mut rx = super::super::Connection::new(b, "me", tiny);
        let mut seen = Vec::new();
        while let Some(m) = rx.read_message().await.unwrap() {
            seen.push((m.command, m.request_id));
        }
        assert_eq!(seen, vec![(Command::Reply, 1), (Command::Error, 2), (Command::Reply, 3)]);
    }

    /// A request of `bytes` bytes with `priority`, as a worker sends it.
    fn request(command: Command, id: u64, priority: i32, bytes: usize) -> Message {
        let mut m = Message::new(command).with_request_id(id);
        m.flags = m.flags.with(Flags::REQUEST);
        m.meta.priority = priority;
        m.chunks.push(Chunk { dtype: DTypeCode::U8, data: Bytes::from(vec![0u8; bytes]) });
        m
    }

    /// Priority order on a saturated link: the peer reads nothing while a first 1 MiB push
    /// (priority 0) fills the 64 KiB pipe; pushes and pulls of priorities 0, 5, -1, 9, 5, a
    /// control message and an answer of priority 7 queue behind it. Once the peer reads, they
    /// leave highest priority first (FIFO among the two 5s), the control message and the other
    /// priority-0 request in their queue order between 5 and -1.
    #[tokio::test]
    async fn on_a_saturated_link_queued_requests_leave_by_priority() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let conn = super::super::Connection::new(a, "peer", Limits::default());
        let (_, writer) = conn.into_split();
        let (out, rx) = Outbox::bounded(64, 1 << 30);
        let drained = tokio::spawn(drain(writer, rx, CancellationToken::new(), |_, _| None));
        out.try_send(request(Command::Push, 1, 0, 1 << 20)).unwrap();
        // Wait until the writer took the first push off the queue: it is writing it then (the
        // take and the start of the write are one step), stuck on the full pipe.
        while out.tx.capacity() < 64 {
            tokio::task::yield_now().await;
        }
        out.try_send(request(Command::Push, 2, 0, 1 << 10)).unwrap();
        out.try_send(request(Command::Push, 3, 5, 1 << 10)).unwrap();
        out.try_send(request(Command::Pull, 4, -1, 0)).unwrap();
        out.try_send(Message::new(Command::Barrier).with_request_id(5)).unwrap();
        out.try_send(request(Command::PushPull, 6, 9, 1 << 10)).unwrap();
        out.try_send(request(Command::Push, 7, 5, 1 << 10)).unwrap();
        let mut answer = Message::new(Command::Reply).with_request_id(8);
        answer.meta.priority = 7;
        out.try_send(answer).unwrap();
        drop(out);
        let mut rx = super::super::Connection::new(b, "me", Limits::default());
        let mut seen = Vec::new();
        while let Some(m) = rx.read_message().await.unwrap() {
            seen.push(m.request_id);
        }
        assert!(matches!(drained.await.unwrap(), Drained::Closed));
        assert_eq!(seen, vec![1, 6, 8, 3, 7, 2, 5, 4], "the first push was on the wire already; then by priority");
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_stops_reading_fails_the_write_after_the_stall_timeout() {
        let (a, _b) = tokio::io::duplex(1024);
        let conn = super::super::Connection::new(a, "slow", Limits::default());
        let (_, mut writer) = conn.into_split();
        writer.set_stall_timeout(Some(Duration::from_secs(3)));
        let err = writer.write_message(&sized(1 << 16)).await.unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(err.to_string().contains("slow"), "{err}");
    }
}
