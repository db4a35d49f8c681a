//! The fixed 40-byte frame header, the [`Command`] enum and the [`Flags`] bits.
//!
//! [`Header::decode`] validates every header field against [`Limits`] so a reader knows the
//! frame's total length — and that it is acceptable — before reserving memory for it.

use super::{DecodeError, Limits};
use crate::ps::node::NodeId;

/// The four bytes every frame starts with.
pub const MAGIC: [u8; 4] = *b"SKV1";
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u16 = 8;
/// Size of the fixed header in bytes.
pub const HEADER_LEN: usize = 40;
/// [`HEADER_LEN`] as a `u64`, for length arithmetic.
const HEADER_LEN_U64: u64 = 40;

/// What a frame asks for or answers (the header's `command` field); see the module table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Command {
    /// Node → scheduler: here I am (role, host, port, task id).
    Register,
    /// Scheduler → node: the assembled cluster, with ranks and ids.
    NodeList,
    /// Node → scheduler: I reached a barrier of a group.
    Barrier,
    /// Scheduler → node: every member reached the barrier.
    BarrierRelease,
    /// Node → scheduler: I am alive.
    Heartbeat,
    /// Scheduler → node: so am I.
    HeartbeatAck,
    /// Scheduler → node: a node died; carries the node and a reason.
    NodeDead,
    /// Worker → scheduler: I am done. Scheduler → node: exit now.
    Shutdown,
    /// Connector → acceptor, first frame of a connection: who I am (role in `head`) and, with
    /// a secret, the first Noise handshake message (chunk 0).
    Hello,
    /// Acceptor → connector: the second Noise handshake message (chunk 0), proving the
    /// acceptor holds the secret too.
    Welcome,
    /// Acceptor → connector: no authentication configured. Connector → acceptor: the first
    /// sealed frame, confirming the handshake.
    AuthOk,
    /// Any direction: a request failed; text says why.
    Error,
    /// Worker → server: values for keys.
    Push,
    /// Worker → server: send me the values of keys.
    Pull,
    /// Worker → server: push, then reply with the updated values.
    PushPull,
    /// Server → worker: the answer to a request (same request id).
    Reply,
    /// Worker → server: a control command (optimizer, sync mode, stop…), body in chunk 0.
    ServerCommand,
    /// Server → worker: something worth logging that answers no request (a sync round
    /// waiting for stragglers); text says what.
    Notice,
    /// Scheduler → node: a worker finished (closed its store); it takes part in no later
    /// sync round or barrier.
    NodeDone,
    /// Worker rank 0 → scheduler → every worker: take a checkpoint at round (request id).
    CheckpointAt,
    /// Server → server: a partition's change (an init, a completed round, an async push, a
    /// command, a snapshot) for its backup copy; answered with a `Reply` once queued.
    Replicate,
    /// Scheduler → node: a server died and its partitions moved to their backups; carries
    /// the dead server and a reason.
    Failover,
    /// Server → scheduler: this server's backup copy of partition `head` is complete.
    ReplicaReady,
    /// Scheduler → node: a worker died and may be restarted (`SYNKV_WORKER_RESTARTS=1`);
    /// until it is back, rounds and barriers do not wait for it.
    WorkerAway,
    /// Scheduler → node: a restarted worker took its rank again.
    WorkerBack,
    /// Worker → server, first after the handshake, and the server's answer: here is my
    /// shared-memory segment (text: pid, fd, size, token as JSON); map it if you can.
    Shm,
}

impl Command {
    /// Every command, for tests and documentation.
    pub const ALL: [Command; 26] = [
        Command::Register,
        Command::NodeList,
        Command::Barrier,
        Command::BarrierRelease,
        Command::Heartbeat,
        Command::HeartbeatAck,
        Command::NodeDead,
        Command::Shutdown,
        Command::Hello,
        Command::Welcome,
        Command::AuthOk,
        Command::Error,
        Command::Push,
        Command::Pull,
        Command::PushPull,
        Command::Reply,
        Command::ServerCommand,
        Command::Notice,
        Command::NodeDone,
        Command::CheckpointAt,
        Command::Replicate,
        Command::Failover,
        Command::ReplicaReady,
        Command::WorkerAway,
        Command::WorkerBack,
        Command::Shm,
    ];

    /// The wire code.
    pub const fn code(self) -> u16 {
        match self {
            Command::Register => 1,
            Command::NodeList => 2,
            Command::Barrier => 3,
            Command::BarrierRelease => 4,
            Command::Heartbeat => 5,
            Command::HeartbeatAck => 6,
            Command::NodeDead => 7,
            Command::Shutdown => 8,
            Command::Hello => 9,
            Command::Welcome => 10,
            Command::AuthOk => 11,
            Command::Error => 12,
            Command::Push => 16,
            Command::Pull => 17,
            Command::PushPull => 18,
            Command::Reply => 19,
            Command::ServerCommand => 20,
            Command::Notice => 21,
            Command::NodeDone => 22,
            Command::CheckpointAt => 23,
            Command::Replicate => 24,
            Command::Failover => 25,
            Command::ReplicaReady => 26,
            Command::WorkerAway => 27,
            Command::WorkerBack => 28,
            Command::Shm => 29,
        }
    }
}

impl TryFrom<u16> for Command {
    type Error = DecodeError;
    fn try_from(code: u16) -> Result<Command, DecodeError> {
        Command::ALL.into_iter().find(|c| c.code() == code).ok_or(DecodeError::UnknownCommand(code))
    }
}

/// Header flag bits. Unknown bits are rejected so a newer peer cannot be misread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Flags(u16);

impl Flags {
    /// No flags.
    pub const NONE: Flags = Flags(0);
    /// The sender waits for a `Reply`/`Error` with the same request id.
    pub const REQUEST: Flags = Flags(0x1);
    /// The values are row-sparse (keys are rows; spec K8.10).
    pub const ROW_SPARSE: Flags = Flags(0x2);
    /// The values are gradient-compressed (spec K7.10).
    pub const COMPRESSED: Flags = Flags(0x4);
    /// A `Push` that initialises its keys (rank 0's `init`); the server refuses a key it
    /// already holds.
    pub const INIT: Flags = Flags(0x8);
    /// The meta section carries each key's offset (in units) within the key: the key's part
    /// held as its own entry by the server (a slice of a big key, or a piece of one).
    pub const OFFSETS: Flags = Flags(0x10);
    /// The meta section carries each key's round id (the sender's push count of that key
    /// part), so a retried or duplicated push is refused instead of applied twice.
    pub const ROUNDS: Flags = Flags(0x20);
    /// A request sent again to the server that took over a dead server's partition: a push
    /// it already applied (through the dead server's replication) is acknowledged, not
    /// refused as a duplicate.
    pub const RETRY: Flags = Flags(0x40);
    /// A `Pull` asking, per key part, for the round id the sender's next push must carry
    /// (a restarted worker picking up its predecessor's count); answered in `meta.rounds`.
    pub const ROUND_IDS: Flags = Flags(0x80);
    /// Every chunk is a descriptor of bytes in the sender's shared-memory segment
    /// (`transport/shm.rs`), read in place by the receiving transport, which clears the flag.
    pub const SHM: Flags = Flags(0x100);
    /// With `SHM`: the descriptors name slots of the sender's broadcast segment, which every
    /// local receiver reads (`transport/shm/broadcast.rs`), not of the connection's own.
    pub const BROADCAST: Flags = Flags(0x200);
    /// Every bit this version understands.
    pub const KNOWN: Flags = Flags(0x3FF);
    /// Local only, never on the wire (outside [`KNOWN`](Flags::KNOWN), so a frame carrying
    /// it is refused): the transport wrote this reply's chunks straight into the request's
    /// destinations (`transport/landing.rs`); its chunks carry their dtypes and no bytes.
    pub const LANDED: Flags = Flags(0x8000);

    /// The raw bits.
    pub const fn bits(self) -> u16 {
        self.0
    }

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// These flags without the bits of `other`.
    #[must_use]
    pub const fn without(self, other: Flags) -> Flags {
        Flags(self.0 & !other.0)
    }

    /// The union of both sets.
    #[must_use]
    pub const fn with(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }
}

impl TryFrom<u16> for Flags {
    type Error = DecodeError;
    fn try_from(bits: u16) -> Result<Flags, DecodeError> {
        match bits & !Flags::KNOWN.0 {
            0 => Ok(Flags(bits)),
            unknown => Err(DecodeError::UnknownFlags(unknown)),
        }
    }
}

/// A decoded, validated header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The command.
    pub command: Command,
    /// Flag bits.
    pub flags: Flags,
    /// Sender's node id ([`NodeId::NONE`] before rendezvous).
    pub sender: NodeId,
    /// Request id; replies echo it.
    pub request_id: u64,
    /// The server partition a data request is about (`None` on the wire as 0, partition `p`
    /// as `p + 1`): the rank of the server whose key parts it names, which is another server
    /// once that one died and its backup took over.
    pub partition: Option<u16>,
    /// Number of keys in the meta section.
    pub key_count: u32,
    /// Number of chunks after the meta section.
    pub chunk_count: u32,
    /// Bytes after the header.
    pub body_len: u64,
}

fn le_u16(buf: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([buf[at], buf[at + 1]])
}
fn le_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}
fn le_u64(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

impl Header {
    /// Decodes and validates the first [`HEADER_LEN`] bytes of `buf`.
    ///
    /// Returns [`DecodeError::Truncated`] if `buf` is shorter than a header.
    pub fn decode(buf: &[u8], limits: &Limits) -> Result<Header, DecodeError> {
        let buf = buf.get(..HEADER_LEN).ok_or(DecodeError::Truncated { field: "header" })?;
        if buf[..4] != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let version = le_u16(buf, 4);
        if version != PROTOCOL_VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let command = Command::try_from(le_u16(buf, 6))?;
        let flags = Flags::try_from(le_u16(buf, 8))?;
        let header = Header {
            command,
            flags,
            sender: NodeId(le_u32(buf, 12)),
            request_id: le_u64(buf, 16),
            partition: le_u16(buf, 10).checked_sub(1),
            key_count: le_u32(buf, 24),
            chunk_count: le_u32(buf, 28),
            body_len: le_u64(buf, 32),
        };
        if header.key_count > limits.max_keys {
            return Err(DecodeError::TooLarge { field: "key count", value: header.key_count.into(), max: limits.max_keys.into() });
        }
        if header.key_count == 0 && (header.flags.contains(Flags::OFFSETS) || header.flags.contains(Flags::ROUNDS)) {
            // Per-key arrays without keys: the encoder never sets these flags then, so a
            // message keeps one wire form.
            return Err(DecodeError::InvalidField { field: "flags OFFSETS/ROUNDS without keys", value: u64::from(header.flags.bits()) });
        }
        if header.chunk_count > limits.max_chunks {
            return Err(DecodeError::TooLarge { field: "chunk count", value: header.chunk_count.into(), max: limits.max_chunks.into() });
        }
        let max_body = limits.max_frame_bytes.saturating_sub(HEADER_LEN_U64);
        if header.body_len > max_body {
            return Err(DecodeError::TooLarge { field: "body length", value: header.body_len, max: max_body });
        }
        if !header.body_len.is_multiple_of(8) {
            return Err(DecodeError::InvalidField { field: "body length (not a multiple of 8)", value: header.body_len });
        }
        Ok(header)
    }

    /// Total frame length (header + body) as a `usize`.
    pub fn frame_len(&self) -> Result<usize, DecodeError> {
        let total = self.body_len.checked_add(HEADER_LEN_U64).ok_or(DecodeError::Overflow { field: "frame length" })?;
        usize::try_from(total).map_err(|_| DecodeError::Overflow { field: "frame length" })
    }

    /// Appends the 40 header bytes to `out`.
    pub fn encode_into(&self, out: &mut bytes::BytesMut) {
        use bytes::BufMut;
        out.put_slice(&MAGIC);
        out.put_u16_le(PROTOCOL_VERSION);
        out.put_u16_le(self.command.code());
        out.put_u16_le(self.flags.bits());
        out.put_u16_le(self.partition.map_or(0, |p| p.saturating_add(1)));
        out.put_u32_le(self.sender.0);
        out.put_u64_le(self.request_id);
        out.put_u32_le(self.key_count);
        out.put_u32_le(self.chunk_count);
        out.put_u64_le(self.body_len);
    }
}
