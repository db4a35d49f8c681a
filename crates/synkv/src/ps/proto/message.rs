//! [`Message`] (header fields + [`Meta`] + [`Chunk`]s) and its encoder.
//!
//! A message owns its chunks as `Bytes`: cloning a message or a chunk never copies tensor
//! bytes. [`Message::encode_head`] produces everything before the first chunk; the writer sends
//! the chunks themselves, each followed by [`Message::chunk_padding`] zero bytes.

use bytes::{BufMut, Bytes, BytesMut};

use super::header::{Command, Flags, Header, HEADER_LEN};
use super::{pad8, DecodeError, EncodeError, Limits};
use crate::ps::node::{Node, NodeId};

/// Element type of a chunk, as mshadow's type ids (spec K8.14) so they match MXNet's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DTypeCode {
    /// 32-bit float (0).
    F32,
    /// 64-bit float (1).
    F64,
    /// 16-bit float (2).
    F16,
    /// Unsigned byte (3); also raw bytes (auth tokens, command bodies, compressed words).
    U8,
    /// 32-bit signed integer (4).
    I32,
    /// 8-bit signed integer (5).
    I8,
    /// 64-bit signed integer (6).
    I64,
    /// Boolean byte (7).
    Bool,
    /// 16-bit signed integer (8).
    I16,
    /// 16-bit unsigned integer (9).
    U16,
    /// 32-bit unsigned integer (10).
    U32,
    /// 64-bit unsigned integer (11).
    U64,
    /// bfloat16 (12).
    BF16,
}

impl DTypeCode {
    /// The wire code (mshadow type id).
    pub const fn code(self) -> u8 {
        match self {
            DTypeCode::F32 => 0,
            DTypeCode::F64 => 1,
            DTypeCode::F16 => 2,
            DTypeCode::U8 => 3,
            DTypeCode::I32 => 4,
            DTypeCode::I8 => 5,
            DTypeCode::I64 => 6,
            DTypeCode::Bool => 7,
            DTypeCode::I16 => 8,
            DTypeCode::U16 => 9,
            DTypeCode::U32 => 10,
            DTypeCode::U64 => 11,
            DTypeCode::BF16 => 12,
        }
    }

    /// Bytes per element.
    pub const fn size(self) -> u64 {
        match self {
            DTypeCode::U8 | DTypeCode::I8 | DTypeCode::Bool => 1,
            DTypeCode::F16 | DTypeCode::BF16 | DTypeCode::I16 | DTypeCode::U16 => 2,
            DTypeCode::F32 | DTypeCode::I32 | DTypeCode::U32 => 4,
            DTypeCode::F64 | DTypeCode::I64 | DTypeCode::U64 => 8,
        }
    }
}

impl TryFrom<u8> for DTypeCode {
    type Error = DecodeError;
    fn try_from(code: u8) -> Result<DTypeCode, DecodeError> {
        Ok(match code {
            0 => DTypeCode::F32,
            1 => DTypeCode::F64,
            2 => DTypeCode::F16,
            3 => DTypeCode::U8,
            4 => DTypeCode::I32,
            5 => DTypeCode::I8,
            6 => DTypeCode::I64,
            7 => DTypeCode::Bool,
            8 => DTypeCode::I16,
            9 => DTypeCode::U16,
            10 => DTypeCode::U32,
            11 => DTypeCode::U64,
            12 => DTypeCode::BF16,
            other => return Err(DecodeError::UnknownDType(other)),
        })
    }
}

/// One tensor chunk: an element type and little-endian element bytes (a length that is a
/// multiple of the element size).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Element type.
    pub dtype: DTypeCode,
    /// The bytes; a slice of the received frame, or the sender's own buffer.
    pub data: Bytes,
}

impl Chunk {
    /// A chunk of raw bytes (dtype `U8`).
    pub fn bytes(data: impl Into<Bytes>) -> Chunk {
        Chunk { dtype: DTypeCode::U8, data: data.into() }
    }
}

/// The typed meta section (everything in the body before the chunks).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// Keys (ps key space, u64).
    pub keys: Vec<u64>,
    /// Byte length of each key's value; same length as `keys`.
    pub lens: Vec<u64>,
    /// Offset of each key's part within the key, in units (elements, or rows of a row_sparse
    /// key); empty means every offset is 0 (on the wire: flag `OFFSETS` absent).
    pub offsets: Vec<u64>,
    /// Round id of each key (the sender's count of earlier pushes of that key part); empty
    /// means none are carried (flag `ROUNDS` absent).
    pub rounds: Vec<u64>,
    /// Scheduling priority (higher first).
    pub priority: i32,
    /// Command-specific integer: barrier group bits, control command id, role code…
    pub head: i32,
    /// Node entries (registration, node list, dead node).
    pub nodes: Vec<Node>,
    /// Free text (error messages, reasons).
    pub text: String,
}

impl Meta {
    /// Appends a key part: its ps key, the byte length of its value and its offset within
    /// the key. `offsets` stays empty while every offset is 0.
    pub fn push_key(&mut self, key: u64, len: u64, offset: u64) {
        self.keys.push(key);
        self.lens.push(len);
        if offset != 0 || !self.offsets.is_empty() {
            self.offsets.resize(self.keys.len() - 1, 0);
            self.offsets.push(offset);
        }
    }
}

/// One frame's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// What it is.
    pub command: Command,
    /// Flag bits.
    pub flags: Flags,
    /// Sender's node id.
    pub sender: NodeId,
    /// Request id (replies echo it).
    pub request_id: u64,
    /// The server partition a data request is about (see [`Header::partition`]).
    pub partition: Option<u16>,
    /// The meta section.
    pub meta: Meta,
    /// Tensor chunks.
    pub chunks: Vec<Chunk>,
}

/// Fixed part of one node entry on the wire.
pub(crate) const NODE_FIXED_LEN: u64 = 20;
/// Rank / task id value meaning "none".
pub(crate) const NONE_U32: u32 = u32::MAX;

fn too_large(field: &'static str, value: usize, max: u64) -> EncodeError {
    EncodeError::TooLarge { field, value: u64::try_from(value).unwrap_or(u64::MAX), max }
}

fn count_u32(field: &'static str, n: usize, max: u32) -> Result<u32, EncodeError> {
    match u32::try_from(n) {
        Ok(v) if v <= max => Ok(v),
        _ => Err(too_large(field, n, max.into())),
    }
}

fn usize_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

impl Message {
    /// A message with no keys, chunks or text.
    pub fn new(command: Command) -> Message {
        Message {
            command,
            flags: Flags::NONE,
            sender: NodeId::NONE,
            request_id: 0,
            partition: None,
            meta: Meta::default(),
            chunks: Vec::new(),
        }
    }

    /// Zero bytes that follow a chunk of `len` bytes on the wire (0–7).
    pub fn chunk_padding(len: usize) -> usize {
        (8 - len % 8) % 8
    }

    /// Length of the meta section before padding, validating it against `limits`.
    fn meta_len(&self, limits: &Limits) -> Result<u64, EncodeError> {
        let m = &self.meta;
        let keys = usize_u64(m.keys.len());
        let chunks = usize_u64(self.chunks.len());
        let per_key = 16 + if m.offsets.is_empty() { 0 } else { 8 } + if m.rounds.is_empty() { 0 } else { 8 };
        let mut len = keys.saturating_mul(per_key).saturating_add(chunks.saturating_mul(9)).saturating_add(16 + usize_u64(m.text.len()));
        for node in &m.nodes {
            if usize_u64(node.host.len()) > u64::from(limits.max_string_len) {
                return Err(too_large("host length", node.host.len(), limits.max_string_len.into()));
            }
            len = len.saturating_add(NODE_FIXED_LEN + usize_u64(node.host.len()));
        }
        Ok(len)
    }

    /// Validates the message against `limits` and returns its header.
    pub fn header(&self, limits: &Limits) -> Result<Header, EncodeError> {
        let m = &self.meta;
        let key_count = count_u32("key count", m.keys.len(), limits.max_keys)?;
        let chunk_count = count_u32("chunk count", self.chunks.len(), limits.max_chunks)?;
        count_u32("node count", m.nodes.len(), limits.max_nodes)?;
        count_u32("text length", m.text.len(), limits.max_string_len)?;
        if m.lens.len() != m.keys.len() {
            return Err(EncodeError::LengthMismatch { field: "key count and key length count" });
        }
        if !m.offsets.is_empty() && m.offsets.len() != m.keys.len() {
            return Err(EncodeError::LengthMismatch { field: "key count and key offset count" });
        }
        if !m.rounds.is_empty() && m.rounds.len() != m.keys.len() {
            return Err(EncodeError::LengthMismatch { field: "key count and round id count" });
        }
        if self.flags.contains(Flags::OFFSETS) || self.flags.contains(Flags::ROUNDS) {
            return Err(EncodeError::LengthMismatch { field: "flags OFFSETS/ROUNDS (set by the encoder from the meta) and the meta" });
        }
        let mut body = pad8(self.meta_len(limits)?).unwrap_or(u64::MAX);
        let mut chunk_sum: u64 = 0;
        for c in &self.chunks {
            let len = usize_u64(c.data.len());
            if !len.is_multiple_of(c.dtype.size()) {
                return Err(EncodeError::LengthMismatch { field: "chunk length and dtype size" });
            }
            chunk_sum = chunk_sum.saturating_add(len);
            body = body.saturating_add(pad8(len).unwrap_or(u64::MAX));
        }
        // With SHM the chunks are descriptors; the receiving transport checks the real lengths.
        if !self.flags.contains(Flags::SHM)
            && !m.keys.is_empty()
            && !self.chunks.is_empty()
            && m.lens.iter().try_fold(0u64, |a, l| a.checked_add(*l)) != Some(chunk_sum)
        {
            return Err(EncodeError::LengthMismatch { field: "key lengths and chunk lengths" });
        }
        let max_body = limits.max_frame_bytes.saturating_sub(usize_u64(HEADER_LEN));
        if body > max_body {
            return Err(EncodeError::TooLarge { field: "body length", value: body, max: max_body });
        }
        let mut flags = self.flags;
        if !m.offsets.is_empty() {
            flags = flags.with(Flags::OFFSETS);
        }
        if !m.rounds.is_empty() {
            flags = flags.with(Flags::ROUNDS);
        }
        Ok(Header {
            command: self.command,
            flags,
            sender: self.sender,
            request_id: self.request_id,
            partition: self.partition,
            key_count,
            chunk_count,
            body_len: body,
        })
    }

    /// Header, meta section and its padding: everything before the first chunk.
    ///
    /// The chunks follow on the wire in order, each padded with
    /// [`chunk_padding`](Message::chunk_padding) zero bytes.
    pub fn encode_head(&self, limits: &Limits) -> Result<BytesMut, EncodeError> {
        let header = self.header(limits)?;
        let meta_len = self.meta_len(limits)?;
        let padded = pad8(meta_len).unwrap_or(meta_len);
        let mut out = BytesMut::with_capacity(HEADER_LEN + usize::try_from(padded).unwrap_or(0));
        header.encode_into(&mut out);
        let m = &self.meta;
        for k in &m.keys {
            out.put_u64_le(*k);
        }
        for l in m.lens.iter().chain(&m.offsets).chain(&m.rounds) {
            out.put_u64_le(*l);
        }
        for c in &self.chunks {
            out.put_u64_le(usize_u64(c.data.len()));
        }
        for c in &self.chunks {
            out.put_u8(c.dtype.code());
        }
        out.put_i32_le(m.priority);
        out.put_i32_le(m.head);
        // Counts below were validated by `header` against u32 limits.
        out.put_u32_le(u32::try_from(m.nodes.len()).unwrap_or(u32::MAX));
        for n in &m.nodes {
            out.put_u8(n.role.code());
            out.put_u8(0);
            out.put_u16_le(n.port);
            out.put_u32_le(n.id.0);
            out.put_u32_le(n.rank.unwrap_or(NONE_U32));
            out.put_u32_le(n.task_id.unwrap_or(NONE_U32));
            out.put_u32_le(u32::try_from(n.host.len()).unwrap_or(u32::MAX));
            out.put_slice(n.host.as_bytes());
        }
        out.put_u32_le(u32::try_from(m.text.len()).unwrap_or(u32::MAX));
        out.put_slice(m.text.as_bytes());
        out.put_bytes(0, Message::chunk_padding(out.len()));
        Ok(out)
    }

    /// The whole frame in one contiguous buffer. Copies the chunks: for tests and small
    /// messages; the transport writes [`encode_head`](Message::encode_head) + chunks instead.
    pub fn encode_to_bytes(&self, limits: &Limits) -> Result<Bytes, EncodeError> {
        let mut out = self.encode_head(limits)?;
        for c in &self.chunks {
            out.put_slice(&c.data);
            out.put_bytes(0, Message::chunk_padding(c.data.len()));
        }
        Ok(out.freeze())
    }

    /// Builder: sets the request id.
    #[must_use]
    pub fn with_request_id(mut self, id: u64) -> Message {
        self.request_id = id;
        self
    }

    /// Builder: sets the sender.
    #[must_use]
    pub fn with_sender(mut self, sender: NodeId) -> Message {
        self.sender = sender;
        self
    }

    /// Builder: sets the flags.
    #[must_use]
    pub fn with_flags(mut self, flags: Flags) -> Message {
        self.flags = flags;
        self
    }
}
