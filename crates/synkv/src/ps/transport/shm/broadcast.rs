//! A server's *broadcast* segment: one answer, copied once, read by every local worker.
//!
//! In a synchronous round every worker pulls the same summed value. Through the per-connection
//! segments (`mod.rs`) the server copies that value once per local worker; through this
//! segment it copies it once, and each worker's connection carries only a descriptor of it.
//!
//! Each worker connection that agreed on shared memory *joins* the segment and gets one bit
//! (at most [`MAX_MEMBERS`]). A slot's header holds two bit sets: `holders` (the receivers the
//! slot was named to and that have not let it go, plus [`SENDER_HOLD`], held while the
//! sender may still name it to more receivers) and `taken` (the receivers that took it: a
//! slot is taken once per receiver). The slot is free once `holders` is empty.
//!
//! The sender remembers which answer (which `Bytes`, by address and length) each slot holds,
//! and keeps that `Bytes` while it holds the slot: the memory behind a live `Bytes` never
//! changes, so another connection answering with the same `Bytes` names the same slot. The
//! sender lets go of a slot once every receiver it was named to let go of it (checked on the
//! next placement).
//!
//! An answer of several values (the small keys of one pull travel together) is named value by
//! value: values living in value slots in place, the others laid one after another, each
//! 64-byte aligned, in one slot that answers with the same values share; a receiver takes a
//! slot once and reads each value as a slice of it.
//!
//! A connection that closes *retires* its bit: where the receiver took a slot and its process
//! lives, the bit clears when it lets go; where it did not take it yet, or its process died,
//! the sender clears it (taking it in the receiver's place first, so the two never race). A
//! retired bit is given out again once no slot holds it. So a dead worker's slots are
//! reclaimed, and a worker that reconnects never sees a slot reused under it.
//!
//! Unlike a per-connection segment, a receiver here could clear another receiver's bit: the
//! workers of one job trust each other with it (they all hold the cluster's secret).
#![allow(unsafe_code)] // slot data in a shared mapping (SAFETY notes at each block)

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use smallvec::{smallvec, SmallVec};

use super::{create_map, offer_of, Descriptor, Incoming, Map, Offer, ShmError, Slots, DATA_START, IN_USE, SLOT_HEADER};

/// A broadcast slot's magic ("BSLT"; a per-connection slot's differs).
const BROADCAST_MAGIC: u32 = 0x4253_4C54;
/// Offsets of the two bit sets in a slot's header.
const HOLDERS: usize = 24;
const TAKEN_BY: usize = 32;
/// The bit of `holders` the sender keeps while it may name the slot to more receivers.
const SENDER_HOLD: u64 = 1 << 63;
/// The bit of `holders` a value slot keeps while the value living in it exists.
const VALUE_HOLD: u64 = 1 << 62;
/// Both of the sender's bits.
const SENDER_BITS: u64 = SENDER_HOLD | VALUE_HOLD;
/// Most receivers of one segment (one bit each; the last two bits are the sender's).
pub const MAX_MEMBERS: u32 = 62;
/// Each value of a many-chunk answer starts this aligned in its slot (whole cache lines, so
/// every element type is aligned and two values never share a line).
const GROUP_ALIGN: usize = 64;

/// The sender's (a server's) broadcast segment.
pub struct Broadcast {
    map: Arc<Map>,
    token: String,
    state: Mutex<State>,
    /// Set when a value slot's value is dropped (its slot may be free once no receiver holds
    /// it): the next sweep looks at every live slot. Not under `state`'s lock: a value can be
    /// dropped while a sweep holds it.
    values_dropped: AtomicBool,
}

impl std::fmt::Debug for Broadcast {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broadcast").field("size", &self.map.len).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    slots: Slots,
    /// Slots the sender still holds, with the answer each holds.
    placed: Vec<Arc<Placed>>,
    /// Bits given out (members and retired ones).
    bits: u64,
    /// Bits of closed connections (with the receiver's process) still named by some slot.
    retired: Vec<(u32, u32)>,
}

/// A slot the sender holds: the answer it holds (one value, or the values of a many-chunk
/// answer laid one after another), and its copy into the slot, which every connection naming
/// the slot at the time helps with.
struct Placed {
    /// (Inline for one value, the common answer: no allocation besides the `Arc`.)
    sources: SmallVec<[Bytes; 1]>,
    /// Where each source starts in the slot's data ([`GROUP_ALIGN`]-aligned).
    at: SmallVec<[usize; 1]>,
    /// Where each source starts in the sources' concatenation (the copy's steps count these
    /// bytes), and their total at the end.
    cum: SmallVec<[usize; 2]>,
    offset: usize,
    seq: u64,
    /// The next step of the copy to hand out.
    next: AtomicUsize,
    /// Bytes copied so far.
    copied: AtomicUsize,
    /// The answer lives in a value slot (nothing to copy; the value keeps the slot, this
    /// entry keeps the value unchanged until every receiver let go).
    in_value: bool,
}

impl Broadcast {
    /// A fresh segment of `size` bytes.
    pub fn create(size: usize) -> Result<Arc<Broadcast>, ShmError> {
        let (map, token) = create_map(size, true)?;
        Ok(Arc::new(Broadcast { map, token, state: Mutex::default(), values_dropped: AtomicBool::new(false) }))
    }

    /// What a receiver needs to map the segment.
    pub fn offer(&self) -> Offer {
        offer_of(&self.map, &self.token)
    }

    /// A bit for a new receiver (process `pid`), if one is free.
    pub fn join(self: &Arc<Self>, pid: u32) -> Option<Member> {
        let mut st = self.lock();
        self.sweep(&mut st);
        let bit = (0..MAX_MEMBERS).find(|b| st.bits & (1 << b) == 0)?;
        st.bits |= 1 << bit;
        Some(Member { broadcast: Arc::clone(self), bit, pid })
    }

    /// A slot of `bytes` for a value the sender keeps (a server's stored value): its data
    /// stays the sender's while the returned [`ValueSlot`] lives, and answers with the value
    /// name the slot instead of copying it. `None` when no slot is free.
    pub fn alloc_value(self: &Arc<Self>, bytes: usize) -> Option<ValueSlot> {
        let mut st = self.lock();
        self.sweep(&mut st);
        // Complete as far as receivers go: they read it only while it is named to them.
        let (at, _) = self.new_slot(&mut st, bytes, VALUE_HOLD, IN_USE)?;
        Some(ValueSlot { broadcast: Arc::clone(self), offset: at, len: bytes })
    }

    /// Makes a slot for `bytes` of data, held by `holders` (not yet named to any receiver),
    /// its state `state`: its offset and sequence number.
    fn new_slot(&self, st: &mut State, bytes: usize, holders: u64, state: u32) -> Option<(usize, u64)> {
        let total = SLOT_HEADER.checked_add(bytes.next_multiple_of(SLOT_HEADER))?;
        let at = st.slots.alloc(total, self.map.len)?;
        st.slots.next_seq += 1;
        let seq = st.slots.next_seq;
        let map = &self.map;
        map.u32_at(at).store(BROADCAST_MAGIC, Ordering::Relaxed);
        map.u64_at(at + 8).store(bytes as u64, Ordering::Relaxed);
        map.u64_at(at + 16).store(seq, Ordering::Relaxed);
        self.taken_by(at).store(0, Ordering::Relaxed);
        // Live from now on (a sweep keeps it).
        self.holders(at).store(holders, Ordering::Relaxed);
        map.u32_at(at + 4).store(state, Ordering::Release);
        Some((at, seq))
    }

    /// Bytes in slots not yet free (tests, metrics).
    pub fn in_use(&self) -> usize {
        let mut st = self.lock();
        self.sweep(&mut st);
        st.slots.live.values().sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn holders(&self, offset: usize) -> &AtomicU64 {
        self.map.u64_at(offset + HOLDERS)
    }

    fn taken_by(&self, offset: usize) -> &AtomicU64 {
        self.map.u64_at(offset + TAKEN_BY)
    }

    /// Clears retired bits where their owner can no longer let go itself, lets go of the
    /// slots every receiver let go of, and forgets free slots: those it let go of now, or
    /// every free one after a closed connection or a dropped value (the only other ways a
    /// slot becomes free), so that a sweep does not scan every live slot on each answer.
    fn sweep(&self, st: &mut State) {
        let mut scan = !st.retired.is_empty();
        if scan {
            self.sweep_retired(st);
        }
        let mut let_go = Vec::new();
        st.placed.retain(|p| {
            let done = self.holders(p.offset).load(Ordering::Acquire) & !SENDER_BITS == 0;
            if done {
                if !p.in_value {
                    self.holders(p.offset).fetch_and(!SENDER_HOLD, Ordering::AcqRel);
                }
                let_go.push(p.offset);
            }
            !done
        });
        // After the retain: a value its entries kept may have been dropped just now.
        scan |= self.values_dropped.swap(false, Ordering::AcqRel);
        let free = |at: usize| self.holders(at).load(Ordering::Acquire) == 0;
        if scan {
            st.slots.free_where(free);
        } else {
            // (`Slots::free` ignores an offset given back already.)
            for at in let_go.into_iter().filter(|at| free(*at)) {
                st.slots.free(at);
            }
        }
    }

    /// Clears the retired bits no live slot names any more, and in the slots they name, the
    /// bits of receivers that can no longer let go themselves.
    fn sweep_retired(&self, st: &mut State) {
        let live: Vec<usize> = st.slots.live.keys().copied().collect();
        let mut freed = 0u64;
        st.retired.retain(|&(bit, pid)| {
            let mask = 1u64 << bit;
            let dead = !process_lives(pid);
            let mut named = false;
            for &off in &live {
                if self.holders(off).load(Ordering::Acquire) & mask == 0 {
                    continue;
                }
                // Take it in the receiver's place: if it had not, it never will.
                let took = self.taken_by(off).fetch_or(mask, Ordering::AcqRel) & mask != 0;
                if dead || !took {
                    self.holders(off).fetch_and(!mask, Ordering::AcqRel);
                } else {
                    named = true;
                }
            }
            if !named {
                freed |= mask;
            }
            named
        });
        st.bits &= !freed;
    }
}

/// Whether process `pid` exists (a zombie counts as gone only once reaped).
fn process_lives(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 checks for the process without sending anything.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// One receiver's place in a [`Broadcast`] (a worker connection's); retires its bit when
/// dropped.
pub struct Member {
    broadcast: Arc<Broadcast>,
    bit: u32,
    pid: u32,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member").field("bit", &self.bit).finish_non_exhaustive()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut st = self.broadcast.lock();
        st.retired.push((self.bit, self.pid));
    }
}

impl Member {
    /// What the receiver needs to map the segment.
    pub fn segment_offer(&self) -> Offer {
        self.broadcast.offer()
    }

    /// This receiver's bit.
    pub fn bit(&self) -> u32 {
        self.bit
    }

    /// Names `data` to this receiver: the slot already holding it if there is one, else a
    /// fresh slot it is copied into; `None` when no slot is free for it. Connections answering
    /// with the same `data` at the same time share the copy (each takes steps of it) and
    /// return once all of it is in place.
    pub fn place(&self, data: &Bytes) -> Option<Descriptor> {
        self.place_all(std::slice::from_ref(data)).and_then(|mut d| d.pop())
    }

    /// Names the values of an answer of several chunks to this receiver, one descriptor each:
    /// values living in value slots are named in place, the others are laid one after another
    /// in one slot — shared, like [`place`](Member::place)'s, with every connection answering
    /// with the same values at the same time. `None` (and nothing named) when no slot is free.
    pub fn place_all(&self, data: &[Bytes]) -> Option<Vec<Descriptor>> {
        let b = &self.broadcast;
        let mask = 1u64 << self.bit;
        let (named, fill) = {
            let mut st = b.lock();
            b.sweep(&mut st);
            let named: Vec<Option<Descriptor>> = data.iter().map(|d| self.name_value(&mut st, d)).collect();
            let rest: Vec<&Bytes> = data.iter().zip(&named).filter(|(_, n)| n.is_none()).map(|(d, _)| d).collect();
            let fill = if rest.is_empty() {
                None
            } else {
                match self.group_slot(&mut st, &rest) {
                    Some(fill) => Some(fill),
                    None => {
                        // Not told to the receiver yet: let go of what was named.
                        for d in named.iter().flatten() {
                            b.holders(d.offset as usize).fetch_and(!mask, Ordering::AcqRel);
                        }
                        return None;
                    }
                }
            };
            (named, fill)
        };
        if let Some(fill) = &fill {
            fill.copy_in(&b.map);
        }
        // The grouped values' descriptors, in order, fill the places not named in place.
        let mut grouped = fill.iter().flat_map(|f| {
            (0..f.sources.len()).map(|i| Descriptor {
                offset: f.offset as u64,
                seq: f.seq,
                start: f.at[i] as u64,
                len: f.sources[i].len() as u64,
            })
        });
        named.into_iter().map(|n| n.or_else(|| grouped.next())).collect()
    }

    /// The slot for `rest` (under the lock, named to this receiver): the one already holding
    /// the same values if this receiver is not holding it, else a fresh one. `None` when no
    /// slot is free.
    fn group_slot(&self, st: &mut State, rest: &[&Bytes]) -> Option<Arc<Placed>> {
        let b = &self.broadcast;
        let mask = 1u64 << self.bit;
        // A slot this receiver still holds (or has yet to take) for an earlier answer of
        // the same values cannot be named to it again: it takes each naming once.
        let same = |p: &Placed| {
            !p.in_value
                && p.sources.len() == rest.len()
                && p.sources.iter().zip(rest).all(|(a, b)| a.as_ptr() == b.as_ptr() && a.len() == b.len())
        };
        let found = st.placed.iter().find(|p| same(p) && b.holders(p.offset).load(Ordering::Acquire) & mask == 0).map(Arc::clone);
        let fill = match found {
            Some(fill) => fill,
            None => {
                let (mut at, mut cum, mut end, mut total) = (SmallVec::new(), SmallVec::new(), 0usize, 0usize);
                for r in rest {
                    at.push(end);
                    cum.push(total);
                    end = end.checked_add(r.len())?.next_multiple_of(GROUP_ALIGN);
                    total += r.len();
                }
                cum.push(total);
                let bytes = if rest.len() == 1 { total } else { end };
                // Its data is complete (IN_USE) once copied in.
                let (offset, seq) = b.new_slot(st, bytes, SENDER_HOLD, 0)?;
                let fill = Arc::new(Placed {
                    sources: rest.iter().map(|r| (*r).clone()).collect(),
                    at,
                    cum,
                    offset,
                    seq,
                    next: AtomicUsize::new(0),
                    copied: AtomicUsize::new(0),
                    in_value: false,
                });
                st.placed.push(Arc::clone(&fill));
                fill
            }
        };
        // Under the sender's hold (the slot cannot be let go meanwhile), and before the
        // receiver can know of the slot. A receiver named the slot before took it and let
        // go of it (its holder bit is clear): it may take it again.
        b.taken_by(fill.offset).fetch_and(!mask, Ordering::AcqRel);
        b.holders(fill.offset).fetch_or(mask, Ordering::AcqRel);
        Some(fill)
    }

    /// When `data` lies in this segment (a value in a value slot) and the slot can be named
    /// to this receiver now: names it, without a copy.
    fn name_value(&self, st: &mut State, data: &Bytes) -> Option<Descriptor> {
        let b = &self.broadcast;
        let base = b.map.ptr.as_ptr() as usize;
        let at = (data.as_ptr() as usize).checked_sub(base).filter(|at| at.checked_add(data.len()).is_some_and(|e| e <= b.map.len))?;
        let mask = 1u64 << self.bit;
        let (&offset, &total) = st.slots.live.range(..=at).next_back()?;
        let start = at.checked_sub(offset + SLOT_HEADER)?;
        if at + data.len() > offset + total {
            return None;
        }
        let holders = b.holders(offset).load(Ordering::Acquire);
        // Not a value slot, or named to this receiver and not let go of yet (it takes each
        // naming once): the caller copies it elsewhere.
        if holders & VALUE_HOLD == 0 || holders & mask != 0 {
            return None;
        }
        b.taken_by(offset).fetch_and(!mask, Ordering::AcqRel);
        b.holders(offset).fetch_or(mask, Ordering::AcqRel);
        let seq = b.map.u64_at(offset + 16).load(Ordering::Acquire);
        let len = data.len();
        st.placed.push(Arc::new(Placed {
            sources: smallvec![data.clone()],
            at: smallvec![0],
            cum: smallvec![0, len],
            offset,
            seq,
            next: AtomicUsize::new(len),
            copied: AtomicUsize::new(len),
            in_value: true,
        }));
        Some(Descriptor { offset: offset as u64, seq, start: start as u64, len: len as u64 })
    }
}

/// A slot holding a value the sender keeps ([`Broadcast::alloc_value`]); the slot is free
/// once this is dropped and no receiver holds it any more.
pub struct ValueSlot {
    broadcast: Arc<Broadcast>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for ValueSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueSlot").field("offset", &self.offset).field("len", &self.len).finish()
    }
}

impl ValueSlot {
    /// The slot's data as a buffer of `len` elements of `dtype` (which must fill the slot's
    /// bytes exactly), owned by the slot: the memory is the sender's, as a `Vec` would be,
    /// except that receivers read it while it is named to them, and the sender names it only
    /// through `Bytes` that share the buffer, while which the buffer is not written.
    pub fn into_buffer(self, dtype: crate::ndarray::DType, len: usize) -> Option<crate::ndarray::Buffer> {
        use crate::ndarray::{Buffer, Data};
        if len.checked_mul(dtype.size_of()) != Some(self.len) {
            return None;
        }
        // SAFETY: the slot's data lies inside the mapping (first_fit checked it), is 64-byte
        // aligned (slots and their headers are), and is initialised (a memfd's pages read as
        // zeros until written; every bit pattern is a valid element of these dtypes).
        let ptr = unsafe { self.broadcast.map.ptr.as_ptr().add(self.offset + SLOT_HEADER) };
        let owner: Arc<dyn std::any::Any + Send + Sync> = Arc::new(self);
        macro_rules! external {
            ($t:ty, $variant:ident) => {
                // SAFETY: `Data::external`'s contract: the memory stays valid while `owner`
                // (the slot, which keeps the mapping) lives; this process writes it only
                // through the buffer, and receivers only read it while the sender names it
                // to them, which it does while a `Bytes` sharing the buffer keeps it unwritten.
                unsafe { Data::external(ptr.cast::<$t>(), len, owner) }.map(Buffer::$variant)
            };
        }
        match dtype {
            crate::ndarray::DType::F32 => external!(f32, F32),
            crate::ndarray::DType::F64 => external!(f64, F64),
            crate::ndarray::DType::F16 => external!(half::f16, F16),
            crate::ndarray::DType::BF16 => external!(half::bf16, BF16),
            crate::ndarray::DType::I32 => external!(i32, I32),
            crate::ndarray::DType::I64 => external!(i64, I64),
        }
    }
}

impl Drop for ValueSlot {
    fn drop(&mut self) {
        self.broadcast.holders(self.offset).fetch_and(!VALUE_HOLD, Ordering::AcqRel);
        self.broadcast.values_dropped.store(true, Ordering::Release);
    }
}

/// Bytes a connection copies at a time into a slot others may be filling too.
const COPY_STEP: usize = 1 << 20;

impl Placed {
    /// Copies steps of the source into the slot until none is left, then waits until the
    /// steps other connections took are done too (each is at most [`COPY_STEP`] bytes, being
    /// copied right now), and marks the slot's data complete.
    fn copy_in(&self, map: &Map) {
        let len = self.cum.last().copied().unwrap_or(0);
        loop {
            let start = self.next.fetch_add(COPY_STEP, Ordering::Relaxed);
            if start >= len {
                break;
            }
            let end = (start + COPY_STEP).min(len);
            // The step `start..end` of the sources' concatenation, source by source.
            let mut pos = start;
            while pos < end {
                let i = self.cum.partition_point(|&c| c <= pos) - 1;
                let from = pos - self.cum[i];
                let n = (end - pos).min(self.sources[i].len() - from);
                // SAFETY: the slot's data [offset + SLOT_HEADER, + its length) lies inside the
                // mapping (first_fit checked it when the slot was made) and holds source `i`
                // at `at[i]`; `pos..pos + n` is part of a step only this call was given (`next`
                // hands each step out once), and no receiver was told of the slot before its
                // data is complete, so nothing else touches these bytes.
                let dst = unsafe { std::slice::from_raw_parts_mut(map.ptr.as_ptr().add(self.offset + SLOT_HEADER + self.at[i] + from), n) };
                crate::kernels::copy_bytes(dst, &self.sources[i][from..from + n]);
                pos += n;
            }
            self.copied.fetch_add(end - start, Ordering::Release);
        }
        while self.copied.load(Ordering::Acquire) < len {
            std::thread::yield_now();
        }
        // Publishes the data to receivers (who check the state with Acquire).
        map.u32_at(self.offset + 4).store(IN_USE, Ordering::Release);
    }
}

impl Incoming {
    /// Takes the broadcast slot `d` names, as receiver `bit`: the bytes `d` names as one
    /// [`Bytes`] that lets go of the slot when the last slice of it drops.
    pub fn take_broadcast(&self, d: &Descriptor, bit: u32) -> Result<Bytes, ShmError> {
        let slot = self.take_broadcast_slot(d, bit)?;
        Incoming::chunk(&slot, d)
    }

    /// Takes the broadcast slot `d` names, as receiver `bit`, once: all of its data (the
    /// descriptors of an answer naming the same slot are slices of it, [`Incoming::chunk`]),
    /// as one [`Bytes`] that lets go of the slot when the last slice of it drops.
    pub fn take_broadcast_slot(&self, d: &Descriptor, bit: u32) -> Result<Bytes, ShmError> {
        let bad = |what: String| Err(ShmError::Descriptor(what));
        let mask = (bit < MAX_MEMBERS).then(|| 1u64 << bit);
        let Some(mask) = mask else {
            return bad(format!("receiver bit {bit} is not a member's"));
        };
        let Ok(off) = usize::try_from(d.offset) else {
            return bad(format!("{d:?} does not fit this machine's addresses"));
        };
        let map = &self.map;
        if off < DATA_START || !off.is_multiple_of(SLOT_HEADER) || off.checked_add(SLOT_HEADER).is_none_or(|e| e > map.len) {
            return bad(format!("{d:?} lies outside the broadcast segment of {} bytes", map.len));
        }
        let (magic, state) = (map.u32_at(off).load(Ordering::Acquire), map.u32_at(off + 4).load(Ordering::Acquire));
        let (seq, holders) = (map.u64_at(off + 16).load(Ordering::Acquire), map.u64_at(off + HOLDERS).load(Ordering::Acquire));
        if magic != BROADCAST_MAGIC || state != IN_USE || seq != d.seq || holders & mask == 0 {
            return bad(format!("{d:?} does not name a broadcast slot held for this receiver (sequence {seq})"));
        }
        let slot_len = map.u64_at(off + 8).load(Ordering::Acquire);
        let len = usize::try_from(slot_len).ok().filter(|l| off + SLOT_HEADER + l <= map.len);
        let Some(len) = len else {
            return bad(format!("{d:?}: its slot's length {slot_len} runs past the segment"));
        };
        let range =
            usize::try_from(d.start).ok().zip(usize::try_from(d.len).ok()).filter(|(s, l)| s.checked_add(*l).is_some_and(|e| e <= len));
        if range.is_none() {
            return bad(format!("{d:?} runs past its broadcast slot ({slot_len} bytes)"));
        }
        if map.u64_at(off + TAKEN_BY).fetch_or(mask, Ordering::AcqRel) & mask != 0 {
            return bad(format!("{d:?} was taken by this receiver already"));
        }
        Ok(Bytes::from_owner(Held { map: Arc::clone(&self.map), offset: off, len, mask }))
    }
}

/// A taken broadcast slot; lets go of it (this receiver's bit) when dropped.
struct Held {
    map: Arc<Map>,
    offset: usize,
    /// The slot's data length.
    len: usize,
    mask: u64,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the range was checked to lie inside the mapping (`take_broadcast`), the
        // mapping lives as long as `self.map`, and the sender reuses the slot only once no
        // bit of `holders` is set, and this receiver's stays set until this drops.
        unsafe { std::slice::from_raw_parts(self.map.ptr.as_ptr().add(self.offset + SLOT_HEADER), self.len) }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.map.u64_at(self.offset + HOLDERS).fetch_and(!self.mask, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::super::MIN_SEGMENT;
    use super::*;

    fn opened(b: &Broadcast) -> Incoming {
        Incoming::open(&b.offer()).unwrap()
    }

    #[test]
    fn one_answer_is_copied_once_and_freed_once_every_receiver_let_go() {
        let b = Broadcast::create(MIN_SEGMENT).unwrap();
        let (x, y) = (b.join(std::process::id()).unwrap(), b.join(std::process::id()).unwrap());
        let (rx, ry) = (opened(&b), opened(&b));
        let answer = Bytes::from((0..10_000u32).map(|i| i as u8).collect::<Vec<u8>>());
        let dx = x.place(&answer).unwrap();
        let dy = y.place(&answer.clone()).unwrap();
        assert_eq!(dx, dy, "the second connection names the same slot");
        let (gx, gy) = (rx.take_broadcast(&dx, x.bit()).unwrap(), ry.take_broadcast(&dy, y.bit()).unwrap());
        assert_eq!((&gx[..], &gy[..]), (&answer[..], &answer[..]));
        assert!(rx.take_broadcast(&dx, x.bit()).is_err(), "taken once per receiver");
        drop(gx);
        assert!(b.in_use() > 0, "one receiver still holds it");
        drop(gy);
        // The sender lets go on its next sweep; the slot is then reused.
        assert_eq!(b.in_use(), 0);
        let other = Bytes::from(vec![9u8; 10_000]);
        assert_eq!(x.place(&other).unwrap().offset, dx.offset, "the free slot is reused");
    }

    #[test]
    fn one_receiver_named_the_same_answer_twice_takes_each_naming() {
        let b = Broadcast::create(MIN_SEGMENT).unwrap();
        let x = b.join(std::process::id()).unwrap();
        let rx = opened(&b);
        let answer = Bytes::from(vec![6u8; 4096]);
        // Two pulls of one value in flight: the first naming is still held, so the second
        // gets a slot of its own.
        let (d1, d2) = (x.place(&answer).unwrap(), x.place(&answer).unwrap());
        assert_ne!(d1.offset, d2.offset);
        let (g1, g2) = (rx.take_broadcast(&d1, x.bit()).unwrap(), rx.take_broadcast(&d2, x.bit()).unwrap());
        assert_eq!((&g1[..], &g2[..]), (&answer[..], &answer[..]));
        // Another receiver holds the first slot too; once this one let go of it, a third pull
        // is named that slot again, and this receiver takes it again.
        let y = b.join(std::process::id()).unwrap();
        let dy = y.place(&answer).unwrap();
        assert_eq!(dy.offset, d1.offset);
        let gy = opened(&b).take_broadcast(&dy, y.bit()).unwrap();
        drop(g1);
        let d3 = x.place(&answer).unwrap();
        assert_eq!((d3.offset, d3.seq), (d1.offset, d1.seq), "the same slot, still held by the other receiver");
        assert_eq!(&rx.take_broadcast(&d3, x.bit()).unwrap()[..], &answer[..]);
        drop((g2, gy));
    }

    #[test]
    fn another_answer_gets_another_slot_and_bad_descriptors_are_refused() {
        let b = Broadcast::create(MIN_SEGMENT).unwrap();
        let x = b.join(std::process::id()).unwrap();
        let y = b.join(std::process::id()).unwrap();
        let rx = opened(&b);
        let (one, two) = (Bytes::from(vec![1u8; 4096]), Bytes::from(vec![1u8; 4096]));
        let (d1, d2) = (x.place(&one).unwrap(), x.place(&two).unwrap());
        assert_ne!(d1.offset, d2.offset, "equal contents, different answers");
        for (d, bit) in [
            (Descriptor { seq: d1.seq + 7, ..d1 }, x.bit()),
            (Descriptor { start: 8, ..d1 }, x.bit()),
            (Descriptor { len: d1.len + 1, ..d1 }, x.bit()),
            (Descriptor { offset: d1.offset + 64, ..d1 }, x.bit()),
            (Descriptor { offset: u64::MAX, ..d1 }, x.bit()),
            (d1, y.bit()), // named to x only
            (d1, 62),
            (d1, 63),
            (d1, 99),
        ] {
            assert!(matches!(rx.take_broadcast(&d, bit), Err(ShmError::Descriptor(_))), "{d:?} bit {bit}");
        }
        let full = Bytes::from(vec![0u8; MIN_SEGMENT]);
        assert!(x.place(&full).is_none(), "no slot that large: the caller copies elsewhere");
        assert_eq!(&rx.take_broadcast(&d2, x.bit()).unwrap()[..], &two[..]);
    }

    #[test]
    fn a_closed_connections_slots_are_reclaimed_and_its_bit_given_out_again() {
        let b = Broadcast::create(MIN_SEGMENT).unwrap();
        let r = opened(&b);
        // Named but never taken: the closed receiver's bit is cleared by the sender.
        let gone = b.join(std::process::id()).unwrap();
        let bit = gone.bit();
        let d = gone.place(&Bytes::from(vec![3u8; 5000])).unwrap();
        drop(gone);
        assert_eq!(b.in_use(), 0, "an untaken slot of a closed connection is freed");
        assert!(r.take_broadcast(&d, bit).is_err(), "and cannot be taken any more");
        // Taken by a live process: kept until it lets go; the bit is not given out meanwhile.
        let m = b.join(std::process::id()).unwrap();
        assert_eq!(m.bit(), bit, "the retired bit was free again");
        let d = m.place(&Bytes::from(vec![4u8; 5000])).unwrap();
        let held = r.take_broadcast(&d, m.bit()).unwrap();
        drop(m);
        let next = b.join(std::process::id()).unwrap();
        assert_ne!(next.bit(), bit, "still named by a slot its receiver holds");
        assert!(b.in_use() > 0);
        assert_eq!(held[0], 4);
        drop(held);
        assert_eq!(b.in_use(), 0);
        // A dead receiver's taken slots are reclaimed too.
        let dead = b.join(u32::MAX - 1).unwrap();
        let d = dead.place(&Bytes::from(vec![5u8; 5000])).unwrap();
        let leaked = r.take_broadcast(&d, dead.bit()).unwrap();
        drop(dead);
        assert_eq!(b.in_use(), 0, "the process is gone: its hold is cleared");
        std::mem::forget(leaked);
    }

    #[test]
    fn a_value_in_a_value_slot_is_named_in_place_and_kept_unchanged_while_read() {
        use crate::ndarray::{Buffer, DType};
        let b = Broadcast::create(8 << 20).unwrap();
        let (x, y) = (b.join(std::process::id()).unwrap(), b.join(std::process::id()).unwrap());
        let (rx, ry) = (opened(&b), opened(&b));
        let slot = b.alloc_value(4 * 100_000).unwrap();
        let mut value = std::sync::Arc::new(slot.into_buffer(DType::F32, 100_000).unwrap());
        assert!(value.is_external());
        std::sync::Arc::get_mut(&mut value).unwrap().assign_cast(&Buffer::from_vec((0..100_000).map(|i| i as f32).collect::<Vec<f32>>()));
        let slots = b.in_use();
        // An answer carrying a part of the value (as a reply shares the value's memory).
        let whole = crate::ps::codec::shared_buffer_bytes(std::sync::Arc::clone(&value));
        let part = whole.slice(400..4000);
        let (dx, dy) = (x.place(&part).unwrap(), y.place(&part).unwrap());
        assert_eq!((dx.offset, dx.start, dx.len), (dy.offset, 400, 3600));
        assert_eq!(b.in_use(), slots, "named in place: no other slot");
        let (gx, gy) = (rx.take_broadcast(&dx, x.bit()).unwrap(), ry.take_broadcast(&dy, y.bit()).unwrap());
        assert_eq!((&gx[..], &gy[..]), (&part[..], &part[..]));
        drop((whole, part));
        assert!(std::sync::Arc::get_mut(&mut value).is_none(), "kept unchanged while a receiver reads it");
        drop(gx);
        assert!(std::sync::Arc::get_mut(&mut value).is_none());
        drop(gy);
        let _ = b.in_use(); // the sender's next sweep lets go of it
        assert!(std::sync::Arc::get_mut(&mut value).is_some(), "writable again once every receiver let go");
        // Named to the same receiver twice at once: the second naming is a copy in a slot of
        // its own (the receiver takes each naming once).
        let again = crate::ps::codec::shared_buffer_bytes(std::sync::Arc::clone(&value));
        let d = x.place(&again).unwrap();
        let copied = x.place(&again).unwrap();
        assert_ne!(copied.offset, d.offset);
        assert_eq!(&rx.take_broadcast(&copied, x.bit()).unwrap()[..], &again[..]);
        drop(again);
        drop(value);
        let _ = rx.take_broadcast(&d, x.bit()).unwrap();
        assert_eq!(b.in_use(), 0, "the value and its copies are gone: every slot is free");
    }

    #[test]
    fn a_many_chunk_answer_is_copied_once_into_one_slot_that_each_receiver_takes_once() {
        let b = Broadcast::create(MIN_SEGMENT).unwrap();
        let (x, y) = (b.join(std::process::id()).unwrap(), b.join(std::process::id()).unwrap());
        let (rx, ry) = (opened(&b), opened(&b));
        // Odd lengths: each value still starts aligned in the slot.
        let answer: Vec<Bytes> = [10usize, 4001, 1, 7000]
            .iter()
            .enumerate()
            .map(|(k, &n)| Bytes::from((0..n).map(|i| (i * 7 + k) as u8).collect::<Vec<u8>>()))
            .collect();
        let dx = x.place_all(&answer).unwrap();
        let dy = y.place_all(&answer.clone()).unwrap();
        assert_eq!(dx, dy, "the second connection names the same slot");
        assert!(dx.iter().all(|d| (d.offset, d.seq) == (dx[0].offset, dx[0].seq)), "one slot: {dx:?}");
        assert!(dx.iter().all(|d| d.start % GROUP_ALIGN as u64 == 0), "{dx:?}");
        for (r, m, ds) in [(&rx, &x, &dx), (&ry, &y, &dy)] {
            let slot = r.take_broadcast_slot(&ds[0], m.bit()).unwrap();
            assert!(r.take_broadcast_slot(&ds[1], m.bit()).is_err(), "the slot is taken once per receiver");
            for (d, want) in ds.iter().zip(&answer) {
                assert_eq!(&Incoming::chunk(&slot, d).unwrap()[..], &want[..]);
            }
        }
        assert_eq!(b.in_use(), 0, "both receivers let go (their slices dropped): the slot is free");
    }

    #[test]
    fn a_many_chunk_answer_names_values_in_place_and_groups_the_rest() {
        use crate::ndarray::{Buffer, DType};
        let b = Broadcast::create(8 << 20).unwrap();
        let x = b.join(std::process::id()).unwrap();
        let rx = opened(&b);
        let slot = b.alloc_value(4 * 50_000).unwrap();
        let mut value = std::sync::Arc::new(slot.into_buffer(DType::F32, 50_000).unwrap());
        std::sync::Arc::get_mut(&mut value).unwrap().assign_cast(&Buffer::from_vec((0..50_000).map(|i| i as f32).collect::<Vec<f32>>()));
        let in_place = crate::ps::codec::shared_buffer_bytes(std::sync::Arc::clone(&value));
        let (small, other) = (Bytes::from(vec![3u8; 5000]), Bytes::from(vec![4u8; 300]));
        let answer = vec![small.clone(), in_place.clone(), other.clone()];
        let d = x.place_all(&answer).unwrap();
        assert_eq!((d[1].start, d[1].len), (0, 200_000), "the value is named in place");
        assert_ne!(d[1].offset, d[0].offset);
        assert_eq!((d[0].offset, d[0].seq), (d[2].offset, d[2].seq), "the others share a slot");
        // Taken as the reader does: each slot once.
        let grouped = rx.take_broadcast_slot(&d[0], x.bit()).unwrap();
        assert!(rx.take_broadcast_slot(&d[2], x.bit()).is_err(), "the shared slot is taken once");
        let named = rx.take_broadcast(&d[1], x.bit()).unwrap();
        assert_eq!(&Incoming::chunk(&grouped, &d[0]).unwrap()[..], &small[..]);
        assert_eq!(&named[..], &in_place[..]);
        assert_eq!(&Incoming::chunk(&grouped, &d[2]).unwrap()[..], &other[..]);
        drop((grouped, named, in_place, answer));
        let _ = b.in_use();
        assert!(std::sync::Arc::get_mut(&mut value).is_some(), "writable again once the receiver let go");
    }

    #[test]
    fn a_many_chunk_answer_without_room_names_nothing() {
        use crate::ndarray::DType;
        let b = Broadcast::create(MIN_SEGMENT).unwrap();
        let x = b.join(std::process::id()).unwrap();
        let slot = b.alloc_value(4 * 1000).unwrap();
        let value = std::sync::Arc::new(slot.into_buffer(DType::F32, 1000).unwrap());
        let in_place = crate::ps::codec::shared_buffer_bytes(std::sync::Arc::clone(&value));
        let too_big = Bytes::from(vec![1u8; MIN_SEGMENT]);
        assert!(x.place_all(&[in_place.clone(), too_big]).is_none());
        // The value was let go of again: naming it now works, once.
        let d = x.place_all(std::slice::from_ref(&in_place)).unwrap();
        assert_eq!(d[0].len, 4000);
        assert!(b.holders(d[0].offset as usize).load(Ordering::Acquire) & (1 << x.bit()) != 0);
    }

    #[test]
    fn at_most_sixty_two_receivers_join() {
        let b = Broadcast::create(MIN_SEGMENT).unwrap();
        let members: Vec<Member> = (0..MAX_MEMBERS).map(|_| b.join(1).unwrap()).collect();
        assert!(b.join(1).is_none());
        drop(members);
        assert!(b.join(1).is_some(), "retired bits that no slot names are free again");
    }

    #[test]
    fn receivers_on_other_threads_see_the_whole_answer() {
        let b = Broadcast::create(8 << 20).unwrap();
        let members: Vec<Member> = (0..4).map(|_| b.join(std::process::id()).unwrap()).collect();
        let readers: Vec<Incoming> = (0..4).map(|_| opened(&b)).collect();
        for round in 0..50u8 {
            let answer = Bytes::from(vec![round; 1 << 20]);
            std::thread::scope(|s| {
                for (m, r) in members.iter().zip(&readers) {
                    let answer = answer.clone();
                    s.spawn(move || {
                        let d = m.place(&answer).unwrap();
                        let got = r.take_broadcast(&d, m.bit()).unwrap();
                        assert!(got.iter().all(|v| *v == round));
                    });
                }
            });
        }
        assert_eq!(b.in_use(), 0);
    }
}
