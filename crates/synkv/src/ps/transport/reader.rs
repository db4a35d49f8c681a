//! [`FrameReader`]: whole [`Message`]s out of a byte stream, holding only the bytes that arrived.
//!
//! Reading follows mini-redis: bytes accumulate in a buffer; [`check`] says whether a whole
//! frame is there. Unlike mini-redis (and unlike our first version) a header alone reserves
//! nothing: the buffer grows as the frame's bytes arrive, at most doubling what is already
//! buffered, so a peer that announces a huge frame and stalls costs a few KiB. A large frame's
//! allocation is kept once the caller drops the frame and reused for the next large one (a
//! fresh multi-MiB allocation costs a page fault per page), which also spares the steady state
//! the copies of growing.
//!
//! Reads never run ahead of the current frame by more than [`LOOKAHEAD`] bytes. A reader that
//! shares an [`Ingress`] budget ([`FrameReader::read_admitted`]) must obtain the frame's bytes
//! from it after the header arrived and before reading the body; the permit travels with the
//! message and returns when the consumer drops it. While the budget is spent the reader stops
//! reading, the kernel's socket buffer fills, and TCP pushes back on the sender: what a process
//! holds in received, unprocessed frames is bounded by the budget, whatever the number of peers.
//!
//! A clean EOF between frames is `Ok(None)`; EOF inside a frame is [`Error::EofMidFrame`]; a
//! peer that stops in the middle of a frame for the stall timeout is [`Error::Timeout`].

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::landing::{padded, Landing, Target, LAND_MIN};
use super::seal::{FrameMac, Seal, MAC_STEP, TRAILER_LEN};
use super::shm::{Descriptor, Incoming, ShmError};
use crate::ps::proto::{check, parse, parse_head, Command, DecodeError, Flags, Header, Limits, Message, HEADER_LEN};
use crate::ps::{AuthError, Error, Result};

/// Bytes a read may take beyond the end of the current frame (the start of the next one).
pub(crate) const LOOKAHEAD: usize = 8 * 1024;
/// Frames at least this large leave their allocation for reuse by a later large frame, once
/// the caller dropped them.
const RECYCLE_MIN: usize = 1 << 20;

/// A budget of bytes in received frames not yet released by their consumer, shared by the
/// readers of one process (a server's connections, or a worker's), and the pool of large
/// frames' allocations kept for reuse by those readers (a fresh multi-MiB allocation costs a
/// page fault per page). The pool keeps at most the budget ([`Ingress::pooling`] raises it),
/// whatever the number of readers. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Ingress {
    permits: Arc<Semaphore>,
    bytes: u32,
    /// Most bytes of allocations the pool keeps.
    pool_bytes: usize,
    pool: Arc<Mutex<Vec<Bytes>>>,
}

impl Ingress {
    /// Whether a frame of `len` bytes is admitted whole (not larger than the budget).
    fn admits_whole(&self, len: usize) -> bool {
        u64::try_from(len).is_ok_and(|l| l <= u64::from(self.bytes))
    }

    /// A budget of `bytes` (at most `u32::MAX`; at least 64 KiB).
    pub fn new(bytes: u64) -> Ingress {
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX).max(64 << 10);
        Ingress { permits: Arc::new(Semaphore::new(bytes as usize)), bytes, pool_bytes: bytes as usize, pool: Arc::default() }
    }

    /// Lets the pool keep up to `bytes` of allocations (at least the budget): for a consumer
    /// that releases a frame's budget before its last use of the frame's bytes — a server
    /// holds pushes unsummed past their admission (`Config::held_bytes`), so with a pool of
    /// only the budget every frame past it was a fresh allocation (16M over TCP on one host:
    /// ~3000 page faults a step, 48.7 ms against 45.1 with this; BENCHMARKS.md, 2026-12-07).
    #[must_use]
    pub fn pooling(mut self, bytes: u64) -> Ingress {
        self.pool_bytes = usize::try_from(bytes).unwrap_or(usize::MAX).max(self.bytes as usize);
        self
    }

    fn pool(&self) -> MutexGuard<'_, Vec<Bytes>> {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `frame`'s allocation for reuse once its consumers drop it, dropping the oldest
    /// kept ones beyond the budget.
    fn keep(&self, frame: &Bytes) {
        let mut pool = self.pool();
        pool.push(frame.clone());
        while pool.len() > 1 && pool.iter().map(Bytes::len).sum::<usize>() > self.pool_bytes {
            pool.remove(0);
        }
    }

    /// Allocations in the pool that nobody holds (tests).
    #[cfg(test)]
    pub(crate) fn free_pooled(&self) -> usize {
        self.pool().iter().filter(|b| b.is_unique()).count()
    }

    /// An allocation of the pool that nobody holds any more and that can take `total` bytes,
    /// cleared.
    fn reuse(&self, total: usize) -> Option<BytesMut> {
        let mut pool = self.pool();
        let mut i = 0;
        while i < pool.len() {
            if !pool[i].is_unique() {
                i += 1;
                continue;
            }
            match pool.remove(i).try_into_mut() {
                Ok(mut spare) if spare.capacity() >= total => {
                    spare.clear();
                    return Some(spare);
                }
                Ok(spare) => pool.insert(i, spare.freeze()),
                Err(old) => pool.insert(i, old),
            }
            i += 1;
        }
        None
    }

    /// The whole budget in bytes.
    pub fn capacity(&self) -> u64 {
        u64::from(self.bytes)
    }

    /// Bytes not held by any frame right now.
    pub fn available(&self) -> u64 {
        u64::try_from(self.permits.available_permits()).unwrap_or(u64::MAX)
    }

    /// Waits for room for a frame of `len` bytes (a frame larger than the whole budget takes
    /// all of it: it is read alone).
    async fn admit(&self, len: usize) -> Result<Admission> {
        let n = u32::try_from(len).unwrap_or(u32::MAX).min(self.bytes);
        let permit =
            Arc::clone(&self.permits).acquire_many_owned(n).await.map_err(|_| Error::Shutdown("the ingress budget was closed".into()))?;
        Ok(Admission(Some(permit)))
    }
}

/// Finds the landing registered for a reply's request id (`landing.rs`).
pub type Landings<'a> = &'a (dyn Fn(u64) -> Option<Arc<Landing>> + Sync);

/// A frame's share of an [`Ingress`] budget: returned when dropped.
#[derive(Debug, Default)]
pub struct Admission(#[allow(dead_code)] Option<OwnedSemaphorePermit>); // held, not read: dropping it returns the bytes

/// The reading half of a [`Connection`](super::Connection).
pub struct FrameReader {
    io: Box<dyn AsyncRead + Send + Unpin>,
    buffer: BytesMut,
    limits: Limits,
    peer: Arc<str>,

    /// The current frame's admission, once obtained (kept across cancelled reads).
    admitted: Option<Admission>,
    /// Longest a peer may pause in the middle of a frame (`None`: unbounded).
    stall: Option<Duration>,
    /// After the handshake: every frame is followed by a trailer that must open (`seal.rs`).
    seal: Option<Arc<Seal>>,
    /// The MAC of the current frame's bytes received so far (sealed connections; started at
    /// the frame's first bytes).
    mac: Option<FrameMac>,
    /// The peer's shared-memory segment, once mapped: frames flagged `SHM` are read from it.
    shm: Option<Arc<Incoming>>,
    /// The peer's broadcast segment and this receiver's bit in it: frames flagged
    /// `SHM | BROADCAST` are read from it.
    broadcast: Option<(Arc<Incoming>, u32)>,
    /// The frame at the head of the buffer was looked at for landing and is read the usual way.
    declined: bool,
}

impl fmt::Debug for FrameReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameReader").field("peer", &self.peer).field("buffered", &self.buffer.len()).finish_non_exhaustive()
    }
}

impl FrameReader {
    pub(super) fn new(io: Box<dyn AsyncRead + Send + Unpin>, peer: Arc<str>, limits: Limits) -> FrameReader {
        FrameReader {
            io,
            buffer: BytesMut::with_capacity(LOOKAHEAD),
            limits,
            peer,
            admitted: None,
            stall: None,
            seal: None,
            mac: None,
            shm: None,
            broadcast: None,
            declined: false,
        }
    }

    /// From now on frames flagged `SHM` are read in place from `segment`.
    pub fn set_shm(&mut self, segment: Incoming) {
        self.shm = Some(Arc::new(segment));
    }

    /// From now on frames flagged `SHM | BROADCAST` are read in place from `segment`, the
    /// peer's broadcast segment, in which this receiver is `bit`.
    pub fn set_broadcast(&mut self, segment: Incoming, bit: u32) {
        self.broadcast = Some((Arc::new(segment), bit));
    }

    /// From now on every frame must carry a trailer that `seal` opens.
    pub(super) fn set_seal(&mut self, seal: Arc<Seal>) {
        self.seal = Some(seal);
    }

    /// Bytes after each frame (a sealed connection's trailer).
    fn trailer_len(&self) -> usize {
        if self.seal.is_some() {
            TRAILER_LEN
        } else {
            0
        }
    }

    /// The peer's name.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    pub(super) fn set_peer(&mut self, peer: Arc<str>) {
        self.peer = peer;
    }

    pub(super) fn limits(&self) -> Limits {
        self.limits
    }

    pub(super) fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Bounds how long the peer may pause in the middle of a frame: a frame that gets no byte
    /// for `stall` fails with [`Error::Timeout`] (a stuck or hostile peer must not keep its
    /// ingress admission, nor its buffer, forever). Between frames, silence is fine.
    pub fn set_stall_timeout(&mut self, stall: Option<Duration>) {
        self.stall = stall;
    }

    /// Bytes received and not yet handed out (tests and diagnostics).
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// Bytes the buffer has reserved (tests: a header alone must not reserve its frame).
    pub fn reserved(&self) -> usize {
        self.buffer.capacity()
    }

    /// Reads the next message; `Ok(None)` on a clean EOF between frames. Cancel-safe: all
    /// state lives in `self`, and the only await is one read.
    pub async fn read_message(&mut self) -> Result<Option<Message>> {
        Ok(self.read(None).await?.map(|(m, _)| m))
    }

    /// Like [`read_message`](FrameReader::read_message), but the frame's bytes are first
    /// admitted by `ingress` (waiting, without reading, while the budget is spent). The
    /// [`Admission`] returns them when dropped. Cancel-safe.
    pub async fn read_admitted(&mut self, ingress: &Ingress) -> Result<Option<(Message, Admission)>> {
        self.read(Some(ingress)).await
    }

    /// Like [`read_admitted`](FrameReader::read_admitted), but a reply for which `landings`
    /// finds a [`Landing`] has its chunks read straight into the landing's targets (see
    /// `landing.rs`); such a message is flagged [`Flags::LANDED`]. Not cancel-safe while a
    /// reply lands: a cancelled read leaves the reader in the middle of a frame (the caller
    /// drops it).
    pub async fn read_landing(&mut self, ingress: &Ingress, landings: Landings<'_>) -> Result<Option<(Message, Admission)>> {
        self.read_with(Some(ingress), Some(landings)).await
    }

    async fn read(&mut self, ingress: Option<&Ingress>) -> Result<Option<(Message, Admission)>> {
        self.read_with(ingress, None).await
    }

    async fn read_with(&mut self, ingress: Option<&Ingress>, landings: Option<Landings<'_>>) -> Result<Option<(Message, Admission)>> {
        loop {
            if let Some(landings) = landings {
                if let Some(msg) = self.try_land(ingress, landings).await? {
                    return Ok(Some((msg, self.admitted.take().unwrap_or_default())));
                }
            }
            if let Some(msg) = self.parse_buffered(ingress)? {
                return Ok(Some((msg, self.admitted.take().unwrap_or_default())));
            }
            let frame_len = self.frame_len()?.map(|len| len + self.trailer_len());
            if let (Some(ingress), Some(len), None) = (ingress, frame_len, &self.admitted) {
                self.admitted = Some(ingress.admit(len).await?);
            }
            // A frame the ingress budget admitted whole may be reserved whole: the budget
            // already accounts for it.
            let whole = matches!((ingress, frame_len), (Some(i), Some(len)) if i.admits_whole(len));
            let want = frame_len.unwrap_or(HEADER_LEN);
            self.make_room(want, whole, ingress);
            let limit = want.saturating_sub(self.buffer.len()).saturating_add(LOOKAHEAD);
            let limit = limit.min(self.buffer.capacity() - self.buffer.len()).max(1);
            let limit = if self.seal.is_some() { limit.min(MAC_STEP) } else { limit };
            let stall = self.stall.filter(|_| !self.buffer.is_empty());
            let mut io = (&mut self.io).take(u64::try_from(limit).unwrap_or(u64::MAX));
            let n = match stall {
                None => io.read_buf(&mut self.buffer).await?,
                Some(t) => match tokio::time::timeout(t, io.read_buf(&mut self.buffer)).await {
                    Ok(n) => n?,
                    Err(_) => {
                        let what = format!("{} to send the rest of a frame ({} bytes received)", self.peer, self.buffer.len());
                        return Err(Error::timeout(what, t));
                    }
                },
            };
            if n == 0 {
                if self.buffer.is_empty() {
                    return Ok(None);
                }
                return Err(Error::EofMidFrame { peer: self.peer.to_string(), buffered: self.buffer.len() });
            }
        }
    }

    /// The length of the frame being received, once its header is in (validated).
    fn frame_len(&self) -> Result<Option<usize>> {
        if self.buffer.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = Header::decode(&self.buffer, &self.limits).and_then(|h| h.frame_len());
        len.map(Some).map_err(|e| Error::protocol(self.peer.to_string(), e))
    }

    /// Takes one frame out of the buffer if a whole one is there (with its trailer, which must
    /// open, on a sealed connection).
    fn parse_buffered(&mut self, ingress: Option<&Ingress>) -> Result<Option<Message>> {
        let protocol = |e| Error::protocol(self.peer.to_string(), e);
        let len = match &self.seal {
            None => match check(&self.buffer, &self.limits).map_err(protocol)? {
                Some(len) => len,
                None => return Ok(None),
            },
            Some(seal) => {
                let Some(len) = self.frame_len()? else { return Ok(None) };
                // Feed the MAC what arrived of the frame while it is still in cache.
                let arrived = len.min(self.buffer.len());
                let fed = self.mac.as_ref().map_or(0, |m| m.fed);
                if arrived > fed {
                    self.mac.get_or_insert_with(|| seal.incoming()).update(&self.buffer[fed..arrived]);
                }
                if self.buffer.len() < len + TRAILER_LEN {
                    return Ok(None);
                }
                let mac = self.mac.take().unwrap_or_else(|| seal.incoming());
                if !seal.open(&self.buffer[len..len + TRAILER_LEN], mac) {
                    return Err(AuthError::Integrity { peer: self.peer.to_string() }.into());
                }
                len
            }
        };
        let total = len + self.trailer_len();
        self.declined = false;
        let frame = self.buffer.split_to(total).freeze().slice(..len);
        if let Some(ingress) = ingress.filter(|_| len >= RECYCLE_MIN) {
            // Let go of the allocation's tail (copying the few bytes of the next frame read so
            // far), so the whole allocation can be reused once the caller drops the frame.
            self.buffer = BytesMut::from(&self.buffer[..]);
            ingress.keep(&frame);
        }
        let msg = parse(frame, &self.limits).map_err(protocol)?;
        if msg.flags.contains(Flags::SHM) {
            return self.read_shm(msg).map(Some);
        }
        Ok(Some(msg))
    }

    /// Lands the frame at the head of the buffer if it is a reply whose request registered a
    /// [`Landing`] and whose chunks are the expected ones: its head is parsed from the buffer,
    /// each chunk read from the socket straight into its target, and its padding and trailer
    /// checked. `Ok(None)`: not such a frame (it is then read the usual way).
    async fn try_land(&mut self, ingress: Option<&Ingress>, landings: Landings<'_>) -> Result<Option<Message>> {
        if self.declined || self.buffer.len() < HEADER_LEN || self.mac.is_some() || self.admitted.is_some() {
            return Ok(None);
        }
        let peer = Arc::clone(&self.peer);
        let protocol = |e| Error::protocol(peer.to_string(), e);
        let header = Header::decode(&self.buffer, &self.limits).map_err(protocol)?;
        let body = header.frame_len().map_err(protocol)? - HEADER_LEN;
        // Whatever happens below, this frame is looked at once.
        self.declined = true;
        if header.command != Command::Reply || header.flags.contains(Flags::SHM) || body < LAND_MIN {
            return Ok(None);
        }
        let Some(landing) = landings(header.request_id) else { return Ok(None) };
        let Some((targets, head_len)) = landing.claim(body) else { return Ok(None) };
        // The targets go back to the landing however this ends (the receiver may still need
        // them: to copy a landed value into more outputs, or to write one that did not land).
        let mut claimed = Claimed { landing: Arc::clone(&landing), targets: Some(targets) };
        let seal = self.seal.clone();
        let tail = self.trailer_len() + 8 * claimed.targets().len();
        if let Some(ingress) = ingress {
            self.admitted = Some(ingress.admit(head_len + tail).await?);
        }
        self.fill_to(head_len).await?;
        let (mut msg, lens) = parse_head(&self.buffer[..head_len], &self.limits).map_err(protocol)?;
        let dtypes: Vec<_> = msg.chunks.iter().map(|c| c.dtype).collect();
        if !landing.fits(claimed.targets(), &lens, &dtypes) {
            // Another layout than expected: read it the usual way (and admit it whole).
            self.admitted = None;
            return Ok(None);
        }
        if let Some(seal) = &seal {
            self.mac.get_or_insert_with(|| seal.incoming()).update(&self.buffer[..head_len]);
        }
        self.buffer.advance(head_len);
        let count = claimed.targets().len();
        for i in 0..count {
            let Some(target) = claimed.targets.as_mut().and_then(|t| t.get_mut(i)) else { break };
            let dst = target.bytes_mut();
            let len = dst.len();
            // Bytes of the chunk that came with the head (read ahead) are copied.
            let early = len.min(self.buffer.len());
            dst[..early].copy_from_slice(&self.buffer[..early]);
            self.buffer.advance(early);
            if let Some(mac) = self.mac.as_mut() {
                mac.update(&dst[..early]);
            }
            let mut pos = early;
            while pos < len {
                let end = if seal.is_some() { (pos + MAC_STEP).min(len) } else { len };
                let n = self.read_some(&mut dst[pos..end]).await?;
                if let Some(mac) = self.mac.as_mut() {
                    // Fed while still in cache.
                    mac.update(&dst[pos..pos + n]);
                }
                pos += n;
            }
            let pad = padded(len) - len;
            self.fill_to(pad).await?;
            if self.buffer[..pad].iter().any(|b| *b != 0) {
                return Err(protocol(DecodeError::InvalidField { field: "chunk padding", value: 0 }));
            }
            if let Some(mac) = self.mac.as_mut() {
                mac.update(&self.buffer[..pad]);
            }
            self.buffer.advance(pad);
        }
        if let Some(seal) = &seal {
            self.fill_to(TRAILER_LEN).await?;
            let mac = self.mac.take().unwrap_or_else(|| seal.incoming());
            if !seal.open(&self.buffer[..TRAILER_LEN], mac) {
                return Err(AuthError::Integrity { peer: self.peer.to_string() }.into());
            }
            self.buffer.advance(TRAILER_LEN);
        }
        self.declined = false;
        let landed: usize = claimed.targets().iter().map(|t| t.bytes().len()).sum();
        crate::ps::metrics::METRICS.transport.landed_bytes.add(u64::try_from(landed).unwrap_or(u64::MAX));
        msg.flags = msg.flags.with(Flags::LANDED);
        Ok(Some(msg))
    }

    /// Reads until at least `n` bytes are buffered (a frame's head, padding or trailer: never
    /// more than `n` in total, so nothing past them is read into the buffer).
    async fn fill_to(&mut self, n: usize) -> Result<()> {
        while self.buffer.len() < n {
            let want = n - self.buffer.len();
            self.buffer.reserve(want);
            let mut io = (&mut self.io).take(u64::try_from(want).unwrap_or(u64::MAX));
            let read = match self.stall {
                None => io.read_buf(&mut self.buffer).await?,
                Some(t) => tokio::time::timeout(t, io.read_buf(&mut self.buffer)).await.map_err(|_| self.stalled(t))??,
            };
            if read == 0 {
                return Err(Error::EofMidFrame { peer: self.peer.to_string(), buffered: self.buffer.len() });
            }
        }
        Ok(())
    }

    /// One read from the socket into `dst` (a landing chunk), bounded by the stall timeout.
    async fn read_some(&mut self, dst: &mut [u8]) -> Result<usize> {
        let n = match self.stall {
            None => self.io.read(dst).await?,
            Some(t) => tokio::time::timeout(t, self.io.read(dst)).await.map_err(|_| self.stalled(t))??,
        };
        if n == 0 {
            return Err(Error::EofMidFrame { peer: self.peer.to_string(), buffered: self.buffer.len() });
        }
        Ok(n)
    }

    fn stalled(&self, t: Duration) -> Error {
        Error::timeout(format!("{} to send the rest of a frame", self.peer), t)
    }

    /// Replaces a `SHM` frame's descriptors by the bytes they name, in place.
    fn read_shm(&self, mut msg: Message) -> Result<Message> {
        let protocol = |e| Error::protocol(self.peer.to_string(), e);
        let Some(segment) = &self.shm else {
            return Err(protocol(DecodeError::InvalidField { field: "flags SHM without a shared-memory segment", value: 0x100 }));
        };
        let bad = |e: ShmError| {
            tracing::warn!("{}: {e}", self.peer);
            protocol(DecodeError::InvalidField { field: "shared-memory descriptor", value: 0 })
        };
        if msg.flags.contains(Flags::BROADCAST) {
            let Some((segment, bit)) = &self.broadcast else {
                return Err(protocol(DecodeError::InvalidField { field: "flags BROADCAST without a broadcast segment", value: 0x200 }));
            };
            // Each slot is taken once; chunks naming the same slot (the values of a many-chunk
            // answer laid out together) are slices of it.
            let mut taken: Vec<(Descriptor, Bytes)> = Vec::new();
            for chunk in &mut msg.chunks {
                let d = Descriptor::decode(&chunk.data).map_err(bad)?;
                let slot = match taken.iter().find(|(t, _)| (t.offset, t.seq) == (d.offset, d.seq)) {
                    Some((_, slot)) => slot.clone(),
                    None => {
                        let slot = segment.take_broadcast_slot(&d, *bit).map_err(bad)?;
                        taken.push((d, slot.clone()));
                        slot
                    }
                };
                chunk.data = Incoming::chunk(&slot, &d).map_err(bad)?;
            }
            msg.flags = msg.flags.without(Flags::SHM).without(Flags::BROADCAST);
            msg.check_chunks().map_err(protocol)?;
            return Ok(msg);
        }
        // Every chunk of a frame lies in one slot, taken once.
        let mut slot: Option<(Descriptor, Bytes)> = None;
        for chunk in &mut msg.chunks {
            let d = Descriptor::decode(&chunk.data).map_err(bad)?;
            let data = match &slot {
                Some((first, taken)) if (first.offset, first.seq) == (d.offset, d.seq) => Incoming::chunk(taken, &d),
                Some(_) => Err(ShmError::Descriptor(format!("{d:?} names another slot than the frame's first chunk"))),
                None => {
                    let taken = segment.take(&d).map_err(bad)?;
                    let data = Incoming::chunk(&taken, &d);
                    slot = Some((d, taken));
                    data
                }
            };
            chunk.data = data.map_err(bad)?;
        }
        msg.flags = msg.flags.without(Flags::SHM);
        msg.check_chunks().map_err(protocol)?;
        Ok(msg)
    }

    /// Makes room for the next read of a frame of `want` bytes: a free allocation of an
    /// earlier large frame if one is big enough, else the whole frame if it was admitted
    /// whole, else growth by at most the bytes buffered (never past the frame plus
    /// [`LOOKAHEAD`]).
    fn make_room(&mut self, want: usize, whole: bool, ingress: Option<&Ingress>) {
        let have = self.buffer.len();
        let need = want.saturating_sub(have);
        let spare = self.buffer.capacity() - have;
        if spare >= need.max(1) {
            return;
        }
        if let Some(mut reused) = ingress.filter(|_| want >= RECYCLE_MIN).and_then(|i| i.reuse(want + LOOKAHEAD)) {
            reused.extend_from_slice(&self.buffer);
            self.buffer = reused;
            return;
        }
        if whole {
            self.buffer.reserve(need + LOOKAHEAD);
            return;
        }
        if spare >= need.clamp(1, LOOKAHEAD) {
            return;
        }
        let step = need.saturating_add(LOOKAHEAD).min(have.max(LOOKAHEAD));
        self.buffer.reserve(step);
    }
}

/// A landing's targets while a reader writes into them; given back when dropped.
struct Claimed {
    landing: Arc<Landing>,
    targets: Option<Vec<Box<dyn Target>>>,
}

impl Claimed {
    fn targets(&self) -> &[Box<dyn Target>] {
        self.targets.as_deref().unwrap_or(&[])
    }
}

impl Drop for Claimed {
    fn drop(&mut self) {
        if let Some(targets) = self.targets.take() {
            self.landing.give_back(targets);
        }
    }
}
