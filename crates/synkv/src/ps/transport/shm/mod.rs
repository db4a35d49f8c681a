//! Shared-memory segments for the bulk bytes of peers on one host (`SYNKV_SHM`, on by default).
//! The only module of the transport with `unsafe`.
//!
//! Each side of a worker↔server connection creates one *outgoing* segment: an anonymous
//! `memfd` (never a file in `/dev/shm`: nothing to leak, whoever dies) that it maps and that
//! the peer maps too, by opening `/proc/<pid>/fd/<fd>` of the creator (the offer, naming pid,
//! fd, size and a random token, travels over the authenticated connection; the opener checks
//! the token in the segment's header, so a pid that names another process, or one on another
//! host, is refused). The segment lives while either process maps it: the kernel reclaims it
//! when both have unmapped it or died.
//!
//! A sender copies a frame's chunks into one *slot* of its outgoing segment and sends, per
//! chunk, a 32-byte descriptor (slot offset, slot sequence number, start, length) over the
//! connection instead of the bytes. The receiver checks the descriptors against the slot's
//! header, takes the slot (once: a slot is taken by one frame), and hands out the chunks in
//! place as [`Bytes`] (no copy); dropping the last of them marks the slot free, and the
//! sender reuses it. Slots are freed in any order; a chunk that does not fit (the segment is
//! full, or the receiver holds many slots) travels inline over the connection instead, so a
//! full segment slows nothing down and never blocks.
//!
//! Layout: a 4 KiB header (magic, version, size, token), then slots, each a 64-byte header
//! (magic, state, length, sequence number) and the data, padded to 64 bytes.
#![allow(unsafe_code)] // the only module of `ps` that maps memory (SAFETY notes at each block)

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

mod broadcast;
pub use broadcast::{Broadcast, Member, MAX_MEMBERS};

/// The segment header's magic bytes.
const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"SKVSHM01");
/// Bytes before the first slot.
const DATA_START: usize = 4096;
/// A slot's header, and the alignment of every slot.
const SLOT_HEADER: usize = 64;
const SLOT_MAGIC: u32 = 0x534C_4F54; // "SLOT"
/// Slot states.
const FREE: u32 = 0;
/// Filled by the sender, its descriptors on the way.
const IN_USE: u32 = 1;
/// Held by the receiver.
const TAKEN: u32 = 2;
/// Smallest segment (a header and one page of slots).
pub const MIN_SEGMENT: usize = DATA_START + 64 * 1024;
/// A descriptor's length on the wire.
pub const DESCRIPTOR_LEN: usize = 32;

/// Why a segment could not be made, opened or read.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// `memfd_create`, its sizing or its mapping failed.
    #[error("could not create a shared-memory segment of {size} bytes: {source}")]
    Create {
        /// The size asked for.
        size: usize,
        /// Why.
        source: std::io::Error,
    },
    /// The peer's segment could not be opened or mapped.
    #[error("could not open the peer's shared-memory segment ({path}): {source}")]
    Open {
        /// `/proc/<pid>/fd/<fd>`.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The segment is not the one offered (size, header, token).
    #[error("the peer's shared-memory segment is not what it offered: {0}")]
    Mismatch(String),
    /// A descriptor that names no slot in use, or not as its header says.
    #[error("bad shared-memory descriptor: {0}")]
    Descriptor(String),
}

/// Where a chunk lies in the sender's segment: bytes `[start, start + len)` of the data of
/// the slot at `offset` whose sequence number is `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// The slot's offset in the segment.
    pub offset: u64,
    /// The slot's sequence number (a stale descriptor names an older one).
    pub seq: u64,
    /// Where the chunk starts in the slot's data.
    pub start: u64,
    /// The chunk's length.
    pub len: u64,
}

impl Descriptor {
    /// The wire form.
    pub fn encode(&self) -> [u8; DESCRIPTOR_LEN] {
        let mut out = [0u8; DESCRIPTOR_LEN];
        for (i, w) in [self.offset, self.seq, self.start, self.len].into_iter().enumerate() {
            out[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// Reads the wire form.
    pub fn decode(bytes: &[u8]) -> Result<Descriptor, ShmError> {
        if bytes.len() != DESCRIPTOR_LEN {
            return Err(ShmError::Descriptor(format!("{} bytes, not {DESCRIPTOR_LEN}", bytes.len())));
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[8 * i..8 * i + 8]);
            u64::from_le_bytes(w)
        };
        Ok(Descriptor { offset: word(0), seq: word(1), start: word(2), len: word(3) })
    }
}

/// What a peer needs to map a segment.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Offer {
    /// The creator's process id.
    pub pid: u32,
    /// Its descriptor of the segment's memfd.
    pub fd: i32,
    /// The segment's size in bytes.
    pub size: u64,
    /// 32 hex digits.
    pub token: String,
    /// The creator's network namespace (`/proc/self/ns/net`): peers in different ones are
    /// treated as different hosts (containers, emulated clusters), even where they could map
    /// each other's memory.
    #[serde(default)]
    pub net: String,
}

/// This process's address-space limit in bytes (`RLIMIT_AS`, `ulimit -v`), if it has one.
pub fn address_space_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given; the result is checked.
    let r = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) };
    (r == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// This process's network namespace, as `net:[inode]` (empty if it cannot be read).
pub fn network_namespace() -> String {
    std::fs::read_link("/proc/self/ns/net").map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()
}

/// One mapping of a segment (either side's).
struct Map {
    ptr: NonNull<u8>,
    len: usize,
    /// Keeps the memfd open while mapped (the creator's offer names it).
    file: File,
}

// SAFETY: the mapping is plain memory shared with one peer; every access to a slot's header
// goes through atomics, and a slot's data is written only by the sender while the slot is
// FREE-to-IN_USE (before the descriptor is sent) and read only by the receiver while IN_USE.
unsafe impl Send for Map {}
// SAFETY: as above; `&Map` hands out no mutable access except through atomics and the
// sender's allocator, which holds the only right to write FREE slots.
unsafe impl Sync for Map {}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing borrows the mapping any
        // more (every `Slot` holds an `Arc<Map>`).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

impl Map {
    fn new(file: File, len: usize) -> std::io::Result<Map> {
        // SAFETY: a fresh shared read-write mapping of `len` bytes of an open file; the
        // result is checked against MAP_FAILED.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Map { ptr, len, file })
    }

    /// The atomic u64 at `offset` (8-aligned, within the mapping).
    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.len);
        // SAFETY: in bounds and aligned (the mapping is page-aligned; callers pass
        // 8-aligned offsets inside it); shared memory is only accessed atomically here.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset.is_multiple_of(4) && offset + 4 <= self.len);
        // SAFETY: as for `u64_at`.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU32>() }
    }
}

fn token_hex(t: &[u8; 16]) -> String {
    t.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_header(map: &Map, token: &[u8; 16]) {
    map.u64_at(0).store(SEGMENT_MAGIC, Ordering::Relaxed);
    map.u64_at(8).store(map.len as u64, Ordering::Relaxed);
    let mut a = [0u8; 8];
    a.copy_from_slice(&token[..8]);
    map.u64_at(16).store(u64::from_le_bytes(a), Ordering::Relaxed);
    a.copy_from_slice(&token[8..]);
    map.u64_at(24).store(u64::from_le_bytes(a), Ordering::Release);
}

fn read_token(map: &Map) -> String {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&map.u64_at(16).load(Ordering::Acquire).to_le_bytes());
    t[8..].copy_from_slice(&map.u64_at(24).load(Ordering::Acquire).to_le_bytes());
    token_hex(&t)
}

/// A fresh segment of at least `size` bytes with its header written, and its token;
/// `sealed` as for [`Outgoing::create_sealed`].
fn create_map(size: usize, sealed: bool) -> Result<(Arc<Map>, String), ShmError> {
    let size = size.max(MIN_SEGMENT).next_multiple_of(4096);
    let err = |source| ShmError::Create { size, source };
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"synkv-shm".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(size as u64).map_err(err)?;
    if sealed {
        // SAFETY: fcntl on a descriptor this function owns; the result is checked.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL) };
        if r < 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
    }
    let map = Map::new(file, size).map_err(err)?;
    let mut token = [0u8; 16];
    getrandom::fill(&mut token).map_err(|e| err(std::io::Error::other(e.to_string())))?;
    write_header(&map, &token);
    Ok((Arc::new(map), token_hex(&token)))
}

/// What a peer needs to map `map` (whose header carries `token`).
fn offer_of(map: &Map, token: &str) -> Offer {
    Offer { pid: std::process::id(), fd: map.file.as_raw_fd(), size: map.len as u64, token: token.to_owned(), net: network_namespace() }
}

/// A sender's own segment and its slot allocator.
pub struct Outgoing {
    map: Arc<Map>,
    token: String,
    slots: Mutex<Slots>,
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outgoing").field("size", &self.map.len).finish_non_exhaustive()
    }
}

/// Slots handed out and not yet seen free, in offset order, and the gaps between them, so that
/// neither an allocation nor a free scans the live slots (a server's broadcast segment holds
/// two per large value).
#[derive(Default)]
struct Slots {
    live: BTreeMap<usize, usize>, // offset → total bytes
    /// Free ranges, offset → length (the whole segment's, laid at the first allocation).
    gaps: BTreeMap<usize, usize>,
    /// The same ranges as (length, offset): the smallest that fits is the first from a length.
    by_len: BTreeSet<(usize, usize)>,
    next_seq: u64,
}

impl Slots {
    /// A slot of `total` bytes in a segment of `segment` bytes: at the start of the smallest
    /// gap that fits (the lowest of equal ones); `None` when none does.
    fn alloc(&mut self, total: usize, segment: usize) -> Option<usize> {
        // Nothing live and no gap: the first allocation (a segment all given out has live slots).
        if self.live.is_empty() && self.gaps.is_empty() && segment > DATA_START {
            self.add_gap(DATA_START, segment - DATA_START);
        }
        let &(len, at) = self.by_len.range((total.max(1), 0)..).next()?;
        self.remove_gap(at, len);
        if len > total {
            self.add_gap(at + total, len - total);
        }
        self.live.insert(at, total);
        Some(at)
    }

    /// Gives the live slot at `at` back, merged with the gaps on either side.
    fn free(&mut self, at: usize) {
        let Some(total) = self.live.remove(&at) else { return };
        let (mut start, mut len) = (at, total);
        if let Some((&before, &before_len)) = self.gaps.range(..at).next_back() {
            if before + before_len == at {
                self.remove_gap(before, before_len);
                (start, len) = (before, len + before_len);
            }
        }
        if let Some(&after_len) = self.gaps.get(&(at + total)) {
            self.remove_gap(at + total, after_len);
            len += after_len;
        }
        self.add_gap(start, len);
    }

    /// Gives back every live slot `is_free` says is free (a scan of all of them).
    fn free_where(&mut self, is_free: impl Fn(usize) -> bool) {
        let freed: Vec<usize> = self.live.keys().copied().filter(|&at| is_free(at)).collect();
        freed.into_iter().for_each(|at| self.free(at));
    }

    fn add_gap(&mut self, at: usize, len: usize) {
        self.gaps.insert(at, len);
        self.by_len.insert((len, at));
    }

    fn remove_gap(&mut self, at: usize, len: usize) {
        self.gaps.remove(&at);
        self.by_len.remove(&(len, at));
    }
}

impl Outgoing {
    /// A fresh segment of `size` bytes (pages are allocated as they are first used).
    pub fn create(size: usize) -> Result<Outgoing, ShmError> {
        Outgoing::create_sealed(size, true)
    }

    /// `sealed`: the segment's size is sealed (`F_SEAL_SHRINK | F_SEAL_GROW`), so that no
    /// process can truncate it under a peer's mapping (reading a truncated page would kill
    /// the reader with SIGBUS); the opener refuses a segment without the seals.
    fn create_sealed(size: usize, sealed: bool) -> Result<Outgoing, ShmError> {
        let (map, token) = create_map(size, sealed)?;
        Ok(Outgoing { map, token, slots: Mutex::default() })
    }

    /// What the peer needs to map this segment.
    pub fn offer(&self) -> Offer {
        offer_of(&self.map, &self.token)
    }

    /// Copies `chunks` into one free slot (each at an 8-aligned start); `None` when no slot
    /// is free for them.
    pub fn put(&self, chunks: &[&[u8]]) -> Option<Vec<Descriptor>> {
        let mut starts = Vec::with_capacity(chunks.len());
        let mut data_len = 0usize;
        for c in chunks {
            starts.push(data_len);
            data_len = data_len.checked_add(c.len().next_multiple_of(8))?;
        }
        let total = SLOT_HEADER.checked_add(data_len.next_multiple_of(SLOT_HEADER))?;
        let map = &self.map;
        let mut slots = self.live_slots();
        let at = slots.alloc(total, map.len)?;
        slots.next_seq += 1;
        let seq = slots.next_seq;
        drop(slots);
        for (c, start) in chunks.iter().zip(&starts) {
            // SAFETY: the slot [at, at + total) lies inside the mapping (checked above), each
            // chunk's range lies inside the slot's data (its start plus its padded length
            // is at most `data_len`), and no receiver holds the slot (it was not live: the
            // allocator owns it), so nothing else reads or writes these bytes meanwhile.
            let dst = unsafe { std::slice::from_raw_parts_mut(map.ptr.as_ptr().add(at + SLOT_HEADER + start), c.len()) };
            // Streaming stores for large chunks: the receiver, not this process, reads them next.
            crate::kernels::copy_bytes(dst, c);
        }
        map.u32_at(at).store(SLOT_MAGIC, Ordering::Relaxed);
        map.u64_at(at + 8).store(data_len as u64, Ordering::Relaxed);
        map.u64_at(at + 16).store(seq, Ordering::Relaxed);
        // Publishes the data and the header fields above to the receiver.
        map.u32_at(at + 4).store(IN_USE, Ordering::Release);
        let offset = at as u64;
        Some(chunks.iter().zip(starts).map(|(c, start)| Descriptor { offset, seq, start: start as u64, len: c.len() as u64 }).collect())
    }

    /// Bytes in slots not yet freed by the receiver (tests, metrics).
    pub fn in_use(&self) -> usize {
        self.live_slots().live.values().sum()
    }

    /// The allocator, locked, having forgotten the slots the receiver freed.
    fn live_slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let map = &self.map;
        slots.free_where(|at| map.u32_at(at + 4).load(Ordering::Acquire) == FREE);
        slots
    }
}

/// The peer's segment, mapped here, out of which received chunks are read in place.
pub struct Incoming {
    map: Arc<Map>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming").field("size", &self.map.len).finish_non_exhaustive()
    }
}

impl Incoming {
    /// Maps the segment `offer` names, if it is the one offered (size and token).
    pub fn open(offer: &Offer) -> Result<Incoming, ShmError> {
        let path = format!("/proc/{}/fd/{}", offer.pid, offer.fd);
        let here = network_namespace();
        if offer.net != here {
            return Err(ShmError::Mismatch(format!(
                "the peer is in another network namespace ({} here, {} there): another host",
                here, offer.net
            )));
        }
        let size = usize::try_from(offer.size).map_err(|_| ShmError::Mismatch(format!("size {}", offer.size)))?;
        if size < MIN_SEGMENT || size % 4096 != 0 {
            return Err(ShmError::Mismatch(format!("offered size {size} is not a valid segment size")));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| ShmError::Open { path: path.clone(), source })?;
        // SAFETY: fcntl on a descriptor this function owns; the result is checked.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        let need = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        if seals < 0 || seals & need != need {
            return Err(ShmError::Mismatch(format!("{path} is not sealed against resizing (it could be truncated under this mapping)")));
        }
        let len = file.metadata().map_err(|source| ShmError::Open { path: path.clone(), source })?.len();
        if len != offer.size {
            return Err(ShmError::Mismatch(format!("{path} holds {len} bytes, {} were offered", offer.size)));
        }
        let map = Map::new(file, size).map_err(|source| ShmError::Open { path: path.clone(), source })?;
        let magic = map.u64_at(0).load(Ordering::Acquire);
        let recorded = map.u64_at(8).load(Ordering::Acquire);
        if magic != SEGMENT_MAGIC || recorded != offer.size {
            return Err(ShmError::Mismatch(format!("{path} has no valid segment header")));
        }
        if read_token(&map) != offer.token {
            return Err(ShmError::Mismatch(format!("{path} is another segment (token differs)")));
        }
        Ok(Incoming { map: Arc::new(map) })
    }

    /// Takes the slot `d` lies in (a slot is taken once), as one [`Bytes`] of its data:
    /// freed for the sender when the last slice of it drops. [`chunk`](Incoming::chunk) cuts
    /// each chunk out of it.
    pub fn take(&self, d: &Descriptor) -> Result<Bytes, ShmError> {
        let bad = |what: String| Err(ShmError::Descriptor(what));
        let Ok(off) = usize::try_from(d.offset) else {
            return bad(format!("{d:?} does not fit this machine's addresses"));
        };
        if off < DATA_START || !off.is_multiple_of(SLOT_HEADER) || off.checked_add(SLOT_HEADER).is_none_or(|e| e > self.map.len) {
            return bad(format!("{d:?} lies outside the segment of {} bytes", self.map.len));
        }
        let map = &self.map;
        let (magic, seq) = (map.u32_at(off).load(Ordering::Acquire), map.u64_at(off + 16).load(Ordering::Acquire));
        if magic != SLOT_MAGIC || seq != d.seq {
            return bad(format!("{d:?} does not match its slot's header (sequence {seq})"));
        }
        let slot_len = map.u64_at(off + 8).load(Ordering::Acquire);
        let len = usize::try_from(slot_len).ok().filter(|l| off + SLOT_HEADER + l <= map.len);
        let Some(len) = len else {
            return bad(format!("{d:?}: its slot's length {slot_len} runs past the segment"));
        };
        if map.u32_at(off + 4).compare_exchange(IN_USE, TAKEN, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return bad(format!("{d:?} names a slot that is not waiting to be taken"));
        }
        // A sequence number changed between the check and the take means another slot.
        if map.u64_at(off + 16).load(Ordering::Acquire) != d.seq {
            map.u32_at(off + 4).store(IN_USE, Ordering::Release);
            return bad(format!("{d:?}: its slot changed while being taken"));
        }
        Ok(Bytes::from_owner(Slot { map: Arc::clone(&self.map), offset: off, len }))
    }

    /// Chunk `d` of the slot taken as `slot` (which must be the slot `d` names).
    pub fn chunk(slot: &Bytes, d: &Descriptor) -> Result<Bytes, ShmError> {
        let end = d.start.checked_add(d.len).and_then(|e| usize::try_from(e).ok()).filter(|e| *e <= slot.len());
        match (usize::try_from(d.start), end) {
            (Ok(start), Some(end)) => Ok(slot.slice(start..end)),
            _ => Err(ShmError::Descriptor(format!("{d:?} runs past its slot's {} bytes", slot.len()))),
        }
    }
}

/// A received chunk held in place; frees its slot when dropped.
struct Slot {
    map: Arc<Map>,
    offset: usize,
    len: usize,
}

impl AsRef<[u8]> for Slot {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the range was checked to lie inside the mapping (`Incoming::take`), the
        // mapping lives as long as `self.map`, and the sender does not write the slot while
        // it is IN_USE (it only writes slots its allocator owns, i.e. FREE ones).
        unsafe { std::slice::from_raw_parts(self.map.ptr.as_ptr().add(self.offset + SLOT_HEADER), self.len) }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.map.u32_at(self.offset + 4).store(FREE, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Live slots and gaps tile the segment exactly, the two gap indexes agree, and no two
    /// gaps touch (a free merges them).
    fn check_tiling(s: &Slots, segment: usize) {
        let mut pieces: Vec<(usize, usize, bool)> =
            s.live.iter().map(|(&a, &l)| (a, l, true)).chain(s.gaps.iter().map(|(&a, &l)| (a, l, false))).collect();
        pieces.sort_unstable();
        let mut at = DATA_START;
        let mut last_free = false;
        for (start, len, live) in pieces {
            assert_eq!(start, at, "a hole or an overlap at {at}");
            assert!(len > 0);
            assert!(live || !last_free, "two gaps touch at {start}");
            last_free = !live;
            at += len;
        }
        assert_eq!(at, segment);
        assert_eq!(s.by_len.len(), s.gaps.len());
        assert!(s.gaps.iter().all(|(&a, &l)| s.by_len.contains(&(l, a))));
    }

    proptest! {
        #[test]
        fn slots_tile_the_segment_through_any_allocations_and_frees(
            ops in proptest::collection::vec((any::<bool>(), 1usize..40, any::<u16>()), 1..200)
        ) {
            let segment = DATA_START + 64 * 1000;
            let mut s = Slots::default();
            let mut held: Vec<usize> = Vec::new();
            for (alloc, units, pick) in ops {
                if alloc || held.is_empty() {
                    let total = units * 64;
                    match s.alloc(total, segment) {
                        Some(at) => {
                            prop_assert!(at >= DATA_START && at + total <= segment);
                            held.push(at);
                        }
                        // Refused only when no gap is large enough.
                        None => prop_assert!(s.gaps.values().all(|&l| l < total)),
                    }
                } else {
                    let at = held.swap_remove(usize::from(pick) % held.len());
                    s.free(at);
                }
                check_tiling(&s, segment);
            }
            for at in held.drain(..) {
                s.free(at);
            }
            prop_assert_eq!(s.gaps.len(), 1, "all freed: one gap again");
            prop_assert!(s.live.is_empty());
        }
    }

    /// Takes the slot of `ds` and cuts out every chunk.
    fn take_all(inc: &Incoming, ds: &[Descriptor]) -> Vec<Bytes> {
        let slot = inc.take(&ds[0]).unwrap();
        ds.iter().map(|d| Incoming::chunk(&slot, d).unwrap()).collect()
    }

    #[test]
    fn chunks_travel_in_place_and_their_slot_is_reused_once_all_are_dropped() {
        let out = Outgoing::create(MIN_SEGMENT).unwrap();
        let inc = Incoming::open(&out.offer()).unwrap();
        let a: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let b = b"odd".to_vec();
        let ds = out.put(&[&a, &b]).unwrap();
        let wire: Vec<Descriptor> = ds.iter().map(|d| Descriptor::decode(&d.encode()).unwrap()).collect();
        assert_eq!(wire, ds);
        let got = take_all(&inc, &wire);
        assert_eq!((&got[0][..], &got[1][..]), (&a[..], &b[..]));
        assert!(inc.take(&wire[0]).is_err(), "a slot is taken once");
        let [x, y]: [Bytes; 2] = got.try_into().unwrap();
        drop(x);
        assert!(out.in_use() > 0, "a chunk of it is still held");
        drop(y);
        assert_eq!(out.in_use(), 0);
        let again = out.put(&[&a]).unwrap();
        assert_eq!(again[0].offset, ds[0].offset, "the freed slot is reused");
        assert_ne!(again[0].seq, ds[0].seq);
    }

    #[test]
    fn slots_free_in_any_order_and_a_full_segment_says_so() {
        let out = Outgoing::create(MIN_SEGMENT).unwrap();
        let inc = Incoming::open(&out.offer()).unwrap();
        let piece = vec![7u8; 16 * 1024 - SLOT_HEADER];
        let held: Vec<Bytes> = (0..4).map(|_| inc.take(&out.put(&[&piece]).unwrap()[0]).unwrap()).collect();
        assert!(out.put(&[&piece]).is_none(), "64 KiB of slots are all held");
        let [a, b, c, d]: [Bytes; 4] = held.try_into().unwrap();
        drop(b);
        let fresh = out.put(&[&piece]).expect("the middle slot is free again");
        assert_eq!(take_all(&inc, &fresh)[0][..], piece[..]);
        drop((a, c, d));
    }

    #[test]
    fn bad_descriptors_and_foreign_segments_are_refused() {
        let out = Outgoing::create(MIN_SEGMENT).unwrap();
        let inc = Incoming::open(&out.offer()).unwrap();
        let d = out.put(&[b"abcdefgh"]).unwrap()[0];
        for bad in [
            Descriptor { offset: 0, ..d },
            Descriptor { offset: d.offset + 8, ..d },
            Descriptor { offset: u64::MAX - 10, ..d },
            Descriptor { seq: d.seq + 1, ..d },
            Descriptor { offset: d.offset + 4096, ..d },
        ] {
            assert!(matches!(inc.take(&bad), Err(ShmError::Descriptor(_))), "{bad:?}");
        }
        let slot = inc.take(&d).unwrap();
        for bad in [Descriptor { len: d.len + 1, ..d }, Descriptor { len: u64::MAX, ..d }, Descriptor { start: 8, ..d }] {
            assert!(matches!(Incoming::chunk(&slot, &bad), Err(ShmError::Descriptor(_))), "{bad:?}");
        }
        assert!(Descriptor::decode(&[0u8; 31]).is_err());
        // Another segment's token, a wrong size, a process that does not exist.
        let other = Outgoing::create(MIN_SEGMENT).unwrap();
        let mut offer = out.offer();
        offer.token = other.offer().token;
        assert!(matches!(Incoming::open(&offer), Err(ShmError::Mismatch(_))));
        let mut offer = out.offer();
        offer.size += 4096;
        assert!(matches!(Incoming::open(&offer), Err(ShmError::Mismatch(_))));
        let mut offer = out.offer();
        offer.net = "net:[1]".into();
        assert!(matches!(Incoming::open(&offer), Err(ShmError::Mismatch(_))), "another network namespace is another host");
        let mut offer = out.offer();
        offer.pid = u32::MAX - 1;
        assert!(matches!(Incoming::open(&offer), Err(ShmError::Open { .. })));
    }

    #[test]
    fn a_corrupted_or_truncated_header_is_refused() {
        let out = Outgoing::create(MIN_SEGMENT).unwrap();
        out.map.u64_at(0).store(0xdead, Ordering::Relaxed);
        assert!(matches!(Incoming::open(&out.offer()), Err(ShmError::Mismatch(_))));
        let out = Outgoing::create(MIN_SEGMENT).unwrap();
        out.map.u64_at(8).store(1 << 40, Ordering::Relaxed);
        assert!(matches!(Incoming::open(&out.offer()), Err(ShmError::Mismatch(_))));
        // A segment that could be truncated under the mapping, and one truncated before.
        let out = Outgoing::create_sealed(2 * MIN_SEGMENT, false).unwrap();
        assert!(matches!(Incoming::open(&out.offer()), Err(ShmError::Mismatch(_))));
        out.map.file.set_len(MIN_SEGMENT as u64).unwrap();
        assert!(matches!(Incoming::open(&out.offer()), Err(ShmError::Mismatch(_))));
        // A sealed one cannot be truncated at all.
        let out = Outgoing::create(MIN_SEGMENT).unwrap();
        assert!(out.map.file.set_len(4096).is_err());
        // Slot headers overwritten after the descriptor was made: magic, and a length that
        // runs past the segment.
        let out = Outgoing::create(MIN_SEGMENT).unwrap();
        let inc = Incoming::open(&out.offer()).unwrap();
        let d = out.put(&[b"12345678"]).unwrap()[0];
        let off = usize::try_from(d.offset).unwrap();
        out.map.u32_at(off).store(0, Ordering::Relaxed);
        assert!(inc.take(&d).is_err());
        let d = out.put(&[b"12345678"]).unwrap()[0];
        out.map.u64_at(usize::try_from(d.offset).unwrap() + 8).store(u64::MAX / 2, Ordering::Relaxed);
        assert!(inc.take(&d).is_err());
    }

    #[test]
    fn the_segment_outlives_its_creator_while_the_peer_maps_it() {
        let out = Outgoing::create(MIN_SEGMENT).unwrap();
        let inc = Incoming::open(&out.offer()).unwrap();
        let ds = out.put(&[b"survives"]).unwrap();
        drop(out);
        assert_eq!(&take_all(&inc, &ds)[0][..], b"survives");
    }
}
