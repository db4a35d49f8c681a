//! Two-phase decoding: [`check`] (is a whole, acceptable frame buffered?) then [`parse`]
//! (build the [`Message`], splitting chunks out of the input without copying).
//!
//! Every length read from the wire is bounded by [`Limits`] and by the bytes actually present
//! before anything is allocated; all arithmetic is checked.

use bytes::Bytes;

use super::header::{Flags, Header, HEADER_LEN, MAGIC};
use super::message::{Chunk, DTypeCode, Message, Meta, NODE_FIXED_LEN, NONE_U32};
use super::{pad8, DecodeError, Limits};
use crate::ps::node::{Node, NodeId, Role};

/// Is a whole frame at the start of `buf`?
///
/// `Ok(None)`: not yet (read more). `Ok(Some(len))`: the first `len` bytes are one frame whose
/// header is valid and within `limits`. `Err`: the stream is not acceptable; close it. A wrong
/// magic is reported as soon as the first bytes arrive.
pub fn check(buf: &[u8], limits: &Limits) -> Result<Option<usize>, DecodeError> {
    let seen = buf.len().min(MAGIC.len());
    if buf[..seen] != MAGIC[..seen] {
        return Err(DecodeError::BadMagic);
    }
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let len = Header::decode(buf, limits)?.frame_len()?;
    Ok((buf.len() >= len).then_some(len))
}

/// A bounds-checked little-endian cursor over the meta section.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = usize::try_from(n).map_err(|_| DecodeError::Truncated { field })?;
        let end = self.pos.checked_add(n).ok_or(DecodeError::Overflow { field })?;
        let bytes = self.buf.get(self.pos..end).ok_or(DecodeError::Truncated { field })?;
        self.pos = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, field)?);
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }
    fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        self.array(field).map(u16::from_le_bytes)
    }
    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        self.array(field).map(u32::from_le_bytes)
    }
    fn i32(&mut self, field: &'static str) -> Result<i32, DecodeError> {
        self.array(field).map(i32::from_le_bytes)
    }

    /// `count` u64s; the bytes must be present before the vector is allocated.
    fn u64s(&mut self, count: u32, field: &'static str) -> Result<Vec<u64>, DecodeError> {
        let raw = self.take(u64::from(count).checked_mul(8).ok_or(DecodeError::Overflow { field })?, field)?;
        Ok(raw.chunks_exact(8).map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect())
    }

    fn string(&mut self, len: u32, max: u32, field: &'static str) -> Result<String, DecodeError> {
        if len > max {
            return Err(DecodeError::TooLarge { field, value: len.into(), max: max.into() });
        }
        let raw = self.take(len.into(), field)?;
        std::str::from_utf8(raw).map(str::to_owned).map_err(|_| DecodeError::InvalidUtf8 { field })
    }

    fn zeros(&mut self, n: u64, field: &'static str) -> Result<(), DecodeError> {
        if self.take(n, field)?.iter().any(|b| *b != 0) {
            return Err(DecodeError::NonZeroPadding { field });
        }
        Ok(())
    }
}

fn opt_u32(v: u32) -> Option<u32> {
    (v != NONE_U32).then_some(v)
}

fn node(c: &mut Cursor<'_>, limits: &Limits) -> Result<Node, DecodeError> {
    let code = c.u8("node role")?;
    let role = Role::try_from(code).map_err(|_| DecodeError::UnknownRole(code))?;
    if c.u8("node reserved byte")? != 0 {
        return Err(DecodeError::NonZeroPadding { field: "node reserved byte" });
    }
    let port = c.u16("node port")?;
    let id = NodeId(c.u32("node id")?);
    let rank = opt_u32(c.u32("node rank")?);
    let task_id = opt_u32(c.u32("node task id")?);
    let host_len = c.u32("node host length")?;
    let host = c.string(host_len, limits.max_string_len, "node host")?;
    Ok(Node { role, id, rank, host, port, task_id })
}

/// Builds the [`Message`] in `frame`, which must hold exactly one frame (as measured by
/// [`check`]). Chunks are zero-copy slices of `frame`.
pub fn parse(frame: Bytes, limits: &Limits) -> Result<Message, DecodeError> {
    let header = Header::decode(&frame, limits)?;
    let frame_len = header.frame_len()?;
    if frame.len() < frame_len {
        return Err(DecodeError::Truncated { field: "body" });
    }
    if frame.len() > frame_len {
        return Err(DecodeError::TrailingBytes { count: u64::try_from(frame.len() - frame_len).unwrap_or(u64::MAX) });
    }
    let mut c = Cursor { buf: &frame, pos: HEADER_LEN };
    let (meta, chunk_lens, dtypes) = parse_meta(&mut c, &header, limits)?;

    let mut chunks = Vec::with_capacity(dtypes.len());
    let mut chunk_sum: u64 = 0;
    for (len, dtype) in chunk_lens.iter().zip(dtypes) {
        if len % dtype.size() != 0 {
            return Err(DecodeError::LengthMismatch { field: "chunk length and dtype size" });
        }
        let start = c.pos;
        c.take(*len, "chunk")?;
        let data = frame.slice(start..c.pos);
        c.zeros(pad8(*len).ok_or(DecodeError::Overflow { field: "chunk padding" })? - len, "chunk padding")?;
        chunk_sum = chunk_sum.checked_add(*len).ok_or(DecodeError::Overflow { field: "chunk lengths" })?;
        chunks.push(Chunk { dtype, data });
    }
    if c.pos != frame.len() {
        return Err(DecodeError::TrailingBytes { count: u64::try_from(frame.len() - c.pos).unwrap_or(u64::MAX) });
    }
    if header.flags.contains(Flags::SHM) {
        // Descriptors: the transport checks the lengths once it read the bytes in place.
        if chunks.is_empty() || chunks.iter().any(|c| c.data.len() != SHM_DESCRIPTOR_LEN) {
            return Err(DecodeError::LengthMismatch { field: "shared-memory descriptors" });
        }
    } else if header.flags.contains(Flags::BROADCAST) {
        return Err(DecodeError::InvalidField { field: "flags BROADCAST without SHM", value: u64::from(header.flags.bits()) });
    } else {
        check_key_lengths(&meta.lens, chunks.is_empty(), chunk_sum)?;
    }
    Ok(message(&header, meta, chunks))
}

/// The message of `header` with `meta` and `chunks`.
fn message(header: &Header, meta: Meta, chunks: Vec<Chunk>) -> Message {
    Message {
        command: header.command,
        // OFFSETS and ROUNDS say which meta arrays are present; in memory that is the arrays.
        flags: header.flags.without(Flags::OFFSETS.with(Flags::ROUNDS)),
        sender: header.sender,
        request_id: header.request_id,
        partition: header.partition,
        meta,
        chunks,
    }
}

/// Parses the meta section at the cursor, up to and including its padding: the meta, and the
/// lengths and dtypes of the chunks that follow it.
fn parse_meta(c: &mut Cursor<'_>, header: &Header, limits: &Limits) -> Result<(Meta, Vec<u64>, Vec<DTypeCode>), DecodeError> {
    let keys = c.u64s(header.key_count, "keys")?;
    let lens = c.u64s(header.key_count, "key lengths")?;
    let offsets = if header.flags.contains(Flags::OFFSETS) { c.u64s(header.key_count, "key offsets")? } else { Vec::new() };
    let rounds = if header.flags.contains(Flags::ROUNDS) { c.u64s(header.key_count, "round ids")? } else { Vec::new() };
    let chunk_lens = c.u64s(header.chunk_count, "chunk lengths")?;
    let dtype_codes = c.take(header.chunk_count.into(), "chunk dtypes")?;
    let dtypes = dtype_codes.iter().map(|d| DTypeCode::try_from(*d)).collect::<Result<Vec<_>, _>>()?;
    let priority = c.i32("priority")?;
    let head = c.i32("head")?;

    let node_count = c.u32("node count")?;
    if node_count > limits.max_nodes {
        return Err(DecodeError::TooLarge { field: "node count", value: node_count.into(), max: limits.max_nodes.into() });
    }
    // Each node needs at least NODE_FIXED_LEN bytes: bound the allocation by what is present.
    let remaining = u64::try_from(c.buf.len() - c.pos).unwrap_or(u64::MAX);
    if u64::from(node_count).saturating_mul(NODE_FIXED_LEN) > remaining {
        return Err(DecodeError::Truncated { field: "nodes" });
    }
    let mut nodes = Vec::with_capacity(usize::try_from(node_count).unwrap_or(0));
    for _ in 0..node_count {
        nodes.push(node(c, limits)?);
    }
    let text_len = c.u32("text length")?;
    let text = c.string(text_len, limits.max_string_len, "text")?;
    let meta_end = u64::try_from(c.pos).map_err(|_| DecodeError::Overflow { field: "meta length" })?;
    c.zeros(pad8(meta_end).ok_or(DecodeError::Overflow { field: "meta padding" })? - meta_end, "meta padding")?;
    Ok((Meta { keys, lens, offsets, rounds, priority, head, nodes, text }, chunk_lens, dtypes))
}

/// Parses the head of a frame — its header and meta section with padding, exactly `head` —
/// without its chunks, for a reader that writes the chunks straight into their destinations
/// (`transport::landing`). Returns the message, whose chunks have their dtypes and no bytes,
/// and the chunks' lengths. The frame's length must be the head plus the chunks with their
/// padding, and the key lengths must add up to the chunks, as [`parse`] checks.
pub fn parse_head(head: &[u8], limits: &Limits) -> Result<(Message, Vec<u64>), DecodeError> {
    let header = Header::decode(head, limits)?;
    if header.flags.contains(Flags::SHM) || header.flags.contains(Flags::BROADCAST) {
        return Err(DecodeError::InvalidField { field: "flags of a frame read in parts", value: u64::from(header.flags.bits()) });
    }
    let mut c = Cursor { buf: head, pos: HEADER_LEN };
    let (meta, chunk_lens, dtypes) = parse_meta(&mut c, &header, limits)?;
    if c.pos != head.len() {
        return Err(DecodeError::TrailingBytes { count: u64::try_from(head.len() - c.pos).unwrap_or(u64::MAX) });
    }
    let mut total = u64::try_from(head.len()).map_err(|_| DecodeError::Overflow { field: "meta length" })?;
    let mut chunk_sum: u64 = 0;
    for (len, dtype) in chunk_lens.iter().zip(&dtypes) {
        if len % dtype.size() != 0 {
            return Err(DecodeError::LengthMismatch { field: "chunk length and dtype size" });
        }
        let padded = pad8(*len).ok_or(DecodeError::Overflow { field: "chunk padding" })?;
        total = total.checked_add(padded).ok_or(DecodeError::Overflow { field: "chunk lengths" })?;
        chunk_sum = chunk_sum.checked_add(*len).ok_or(DecodeError::Overflow { field: "chunk lengths" })?;
    }
    if u64::try_from(header.frame_len()?).ok() != Some(total) {
        return Err(DecodeError::LengthMismatch { field: "body length and chunk lengths" });
    }
    check_key_lengths(&meta.lens, dtypes.is_empty(), chunk_sum)?;
    let chunks = dtypes.into_iter().map(|dtype| Chunk { dtype, data: Bytes::new() }).collect();
    Ok((message(&header, meta, chunks), chunk_lens))
}

/// Length of one shared-memory descriptor chunk (`Flags::SHM`).
pub(super) const SHM_DESCRIPTOR_LEN: usize = crate::ps::transport::shm::DESCRIPTOR_LEN;

/// The key lengths must add up to the chunk bytes when a message has both.
fn check_key_lengths(lens: &[u64], no_chunks: bool, chunk_sum: u64) -> Result<(), DecodeError> {
    if lens.is_empty() || no_chunks {
        return Ok(());
    }
    let key_sum = lens.iter().try_fold(0u64, |a, l| a.checked_add(*l)).ok_or(DecodeError::Overflow { field: "key lengths" })?;
    if key_sum != chunk_sum {
        return Err(DecodeError::LengthMismatch { field: "key lengths and chunk lengths" });
    }
    Ok(())
}

impl Message {
    /// Checks a message whose chunks the transport replaced (shared memory): each chunk's
    /// length fits its dtype, and the key lengths add up to the chunks' bytes.
    pub fn check_chunks(&self) -> Result<(), DecodeError> {
        let mut sum: u64 = 0;
        for c in &self.chunks {
            let len = u64::try_from(c.data.len()).map_err(|_| DecodeError::Overflow { field: "chunk length" })?;
            if len % c.dtype.size() != 0 {
                return Err(DecodeError::LengthMismatch { field: "chunk length and dtype size" });
            }
            sum = sum.checked_add(len).ok_or(DecodeError::Overflow { field: "chunk lengths" })?;
        }
        check_key_lengths(&self.meta.lens, self.chunks.is_empty(), sum)
    }
}
