//! The wire format: one frame = a fixed 40-byte little-endian header, a typed meta section,
//! then zero or more tensor chunks carried as [`bytes::Bytes`].
//!
//! Modelled on ps-lite's `Message` (meta + data chunks) and mini-redis's two-phase decode, with
//! the limits both lack. This module only turns bytes into [`Message`]s and back; it does no
//! I/O ([`crate::ps::transport`] does) and gives commands no meaning beyond their fields
//! (the scheduler, server and worker do).
//!
//! # Decoding
//! [`check`] looks at a buffer and answers `Ok(None)` (incomplete: read more), `Ok(Some(len))`
//! (a whole frame of `len` bytes is buffered) or a [`DecodeError`]. It validates the header —
//! magic, version, command, flags, every count and the body length against [`Limits`] — before
//! anyone reserves memory for the body. [`parse`] then builds the [`Message`] from exactly one
//! frame, validating every remaining field; chunks are `Bytes::slice`s of the input, never
//! copies. Wire integers become enums through `TryFrom`; unknown values are errors; trailing
//! bytes, non-zero padding and lengths that do not add up are rejected.
//!
//! # Encoding
//! [`Message::encode_head`] writes the header, meta section and its padding into one small
//! buffer; the chunks follow as they are (plus 0–7 zero bytes of padding each), so a writer
//! hands `[head, chunk0, pad, chunk1, pad, …]` to vectored I/O and tensor bytes are never copied.
//! Encoding applies the same [`Limits`] as decoding, so we never send what a peer would refuse.
//!
//! # Header (40 bytes, little-endian)
//! | offset | field        | type    | allowed range                                          |
//! |-------:|--------------|---------|--------------------------------------------------------|
//! | 0      | magic        | [u8; 4] | `b"SKV1"`                                              |
//! | 4      | version      | u16     | [`PROTOCOL_VERSION`] (8)                               |
//! | 6      | command      | u16     | a [`Command`] code (table below)                       |
//! | 8      | flags        | u16     | known [`Flags`] bits only (`0x03FF`)                   |
//! | 10     | partition    | u16     | 0 = none; p + 1 = the server partition p it is about   |
//! | 12     | sender       | u32     | any; 0 = not assigned yet (ids as spec K8.5)           |
//! | 16     | request id   | u64     | any; a reply echoes its request's id                   |
//! | 24     | key count    | u32     | ≤ [`Limits::max_keys`]                                 |
//! | 28     | chunk count  | u32     | ≤ [`Limits::max_chunks`]                               |
//! | 32     | body length  | u64     | multiple of 8, ≤ [`Limits::max_frame_bytes`] − 40      |
//!
//! # Body
//! | field          | size                    | allowed range                                                   |
//! |----------------|-------------------------|-----------------------------------------------------------------|
//! | keys           | key count × u64         | any                                                             |
//! | key lengths    | key count × u64         | bytes of each key's value; if there are keys and chunks, Σ = Σ chunk lengths |
//! | key offsets    | key count × u64, only with flag `OFFSETS` | each key part's first unit within its key        |
//! | round ids      | key count × u64, only with flag `ROUNDS`  | each key part's round id (sender's push count)   |
//! | chunk lengths  | chunk count × u64       | each a multiple of its dtype's size                             |
//! | chunk dtypes   | chunk count × u8        | a [`DTypeCode`] (mshadow ids 0..=12)                            |
//! | priority       | i32                     | any                                                             |
//! | head           | i32                     | command-specific (barrier group, control command id, role…)     |
//! | node count     | u32                     | ≤ [`Limits::max_nodes`]                                         |
//! | nodes          | node count × 20 + host  | role u8 (1, 2, 4), reserved u8 (0), port u16, id u32, rank u32 (`u32::MAX` = none), task id u32 (`u32::MAX` = none), host length u32 (≤ [`Limits::max_string_len`]), host UTF-8 |
//! | text length    | u32                     | ≤ [`Limits::max_string_len`]                                   |
//! | text           | text length bytes       | UTF-8                                                           |
//! | padding        | 0–7 bytes               | zero; the meta section ends on an 8-byte boundary               |
//! | chunks         | Σ (length + 0–7 padding)| each chunk is followed by zero bytes up to an 8-byte boundary   |
//!
//! The frame ends exactly at `40 + body length`. Because every section is padded to 8 bytes,
//! a chunk starts 8-byte aligned relative to the frame, so a reader whose buffer is aligned can
//! view `f32`/`f64` chunks in place (callers must still check the alignment they get).
//!
//! # Commands
//! | code | [`Command`]        | direction            | fields used                                              |
//! |-----:|--------------------|----------------------|----------------------------------------------------------|
//! | 1    | `Register`         | node → scheduler     | nodes = [self, unassigned]                               |
//! | 2    | `NodeList`         | scheduler → node     | nodes = everyone (ranks, ids); head = recipient's id     |
//! | 3    | `Barrier`          | node → scheduler     | head = [`Group`](crate::ps::Group) bits; request id    |
//! | 4    | `BarrierRelease`   | scheduler → node     | head = group bits; request id of the `Barrier`           |
//! | 5    | `Heartbeat`        | node → scheduler     | —                                                        |
//! | 6    | `HeartbeatAck`     | scheduler → node     | —                                                        |
//! | 7    | `NodeDead`         | scheduler → node     | nodes = [dead node]; text = reason                       |
//! | 8    | `Shutdown`         | both                 | worker → scheduler: done; scheduler → node: exit now     |
//! | 9    | `Hello`            | connector → acceptor | head = role code; chunk 0 = Noise message 1 (u8; none without a secret) |
//! | 10   | `Welcome`          | acceptor → connector | chunk 0 = Noise message 2 (u8)                           |
//! | 11   | `AuthOk`           | acceptor → connector | — (no secret configured); connector → acceptor: first sealed frame |
//! | 12   | `Error`            | any                  | text = message; head = [`ErrorCode`]; request id of the failed request; keys = the key part it is about (optional) |
//! | 16   | `Push`             | worker → server      | keys, key lengths, chunks (values); flags                |
//! | 17   | `Pull`             | worker → server      | keys                                                     |
//! | 18   | `PushPull`         | worker → server      | as `Push`; the reply carries values                      |
//! | 19   | `Reply`            | server → worker      | request id; keys/chunks for pulls                        |
//! | 20   | `ServerCommand`    | worker → server      | head = command id (spec K8.13); chunk 0 = body (u8)      |
//! | 21   | `Notice`           | server → worker      | text (e.g. which workers a sync round waits for); keys   |
//! | 22   | `NodeDone`         | scheduler → node     | nodes = [the worker that finished]                       |
//! | 23   | `CheckpointAt`     | worker 0 → scheduler → workers | request id = the round (`push` calls) at which every worker takes the next periodic checkpoint |
//! | 24   | `Replicate`        | server → server      | a change of a partition for its backup copy (partition; request id = sequence number; priority = kind, see `server/partition/replica.rs`); acknowledged by a `Reply` with the same id |
//! | 25   | `Failover`         | scheduler → node     | nodes = [the dead server]; text = reason: its partitions moved to their backups (`SYNKV_SERVER_REPLICAS=1`) |
//! | 26   | `ReplicaReady`     | server → scheduler   | head = partition whose backup copy on the sender is complete |
//! | 27   | `WorkerAway`       | scheduler → node     | nodes = [the worker]: it died and may be restarted (`SYNKV_WORKER_RESTARTS=1`); rounds and barriers stop waiting for it |
//! | 28   | `WorkerBack`       | scheduler → node     | nodes = [the worker]: a restarted worker holds its rank again |
//! | 29   | `Shm`              | worker → server → worker | text = the sender's shared-memory segment as JSON (pid, fd, size, token); first frame after the handshake; the server answers with its own, or an `Error` (then both stay on the stream) |
//!
//! `NodeDead` also travels server → worker: a server that stops because a node died tells its
//! workers which one before it closes their connections.
//!
//! # Flags
//! | bit    | name         | meaning                                                                 |
//! |--------|--------------|-------------------------------------------------------------------------|
//! | 0x0001 | `REQUEST`    | the sender waits for a `Reply` or `Error` with the same request id      |
//! | 0x0002 | `ROW_SPARSE` | the values are rows: two chunks per key (row ids, then rows)            |
//! | 0x0004 | `COMPRESSED` | dense gradients as packed 2-bit/1-bit words (spec K7.10), see below     |
//! | 0x0008 | `INIT`       | a `Push` that creates its keys; a key the server holds is refused       |
//! | 0x0010 | `OFFSETS`    | the meta carries key offsets (set by the encoder when `Meta::offsets` is non-empty) |
//! | 0x0020 | `ROUNDS`     | the meta carries round ids (set by the encoder when `Meta::rounds` is non-empty); `OFFSETS` and `ROUNDS` on a frame without keys are refused |
//! | 0x0040 | `RETRY`      | a request re-sent after a failover: a push whose round was already applied is answered as done, not refused as a duplicate |
//! | 0x0080 | `ROUND_IDS`  | a `Pull` asking for the round id the sender's next push of each key part must carry (`meta.rounds` in the reply): a restarted worker continues its predecessor's count; with `meta.rounds` (one per key part, sync) it rejoins each part at that round (`server/round.rs`) |
//! | 0x0100 | `SHM`        | every chunk is a 32-byte descriptor (slot offset, slot sequence number, start, length; u64 LE) of bytes in a slot of the sender's shared-memory segment (all chunks of a frame in one slot); the receiving transport reads them in place and clears the flag |
//!
//! A worker's data request names its partition (header offset 10): the server rank the slicer
//! placed the key parts on. With replicas, a server may serve several partitions (its own and
//! those it took over), so the partition, not the connection, says which copy a request is for.
//!
//! # Data messages (worker ↔ server)
//! Keys are ps keys ([`crate::ps::slicer`]: an int key as a `u32`, a str key as FNV-1a 64
//! with the top bit set). A big key is split over the servers, and a part larger than the
//! partition bound is cut further; each part is a separate entry on its server, named by
//! (ps key, offset): the offset is the part's first unit within the key (flag `OFFSETS`;
//! absent means 0). Row ids are relative to the part's first row. Every push carries a round
//! id per key part (flag `ROUNDS`): the worker's count of its earlier accepted pushes of that
//! part, so the server places it in a sync round and refuses a duplicate
//! ([`ErrorCode::DuplicatePush`]) instead of applying it twice.
//!
//! | message                 | keys / key lengths                   | chunks per key                       | text |
//! |-------------------------|--------------------------------------|--------------------------------------|------|
//! | `Push`, `PushPull`      | keys; bytes of each key's chunks     | dense: the values (the key's dtype)  | —    |
//! | … with `ROW_SPARSE`     | keys; bytes of ids + rows            | ids (`i64`, sorted, unique), rows     | —    |
//! | … with `INIT`           | as above                             | as above (row_sparse: every row)     | JSON list of the keys' names |
//! | … with `COMPRESSED`     | keys; bytes of each key's words      | packed words (`u32`, MXNet's bytes)  | the configuration as JSON, e.g. `{"type":"2bit","threshold":0.5}` |
//! | `Pull`                  | keys; bytes expected per key         | none                                 | —    |
//! | `Pull` + `ROW_SPARSE`   | keys; bytes of the ids               | the requested ids (`i64`)            | —    |
//! | `Reply` to `Push`/init  | none                                 | none                                 | —    |
//! | `Reply` to a pull       | the request's keys (and offsets), in order | as the request's values        | —    |
//! | `Error`                 | the key part it is about, if any     | —                                    | why; names the key; head = [`ErrorCode`] |
//! | `Notice`                | —                                    | —                                    | what to log (a straggler report) |
//!
//! # Server commands (`ServerCommand`, `head` = id, body in chunk 0)
//! | id | [`ServerCmd`](crate::ps::ServerCmd) | body                        | reply                         |
//! |---:|--------------------------|-----------------------------|-------------------------------|
//! | 0  | `SetOptimizer`           | the optimizer's JSON        | empty; same optimizer again keeps the states |
//! | 3  | `SyncMode`               | `sync` or `async`           | empty                         |
//! | 6  | `GetOptimizerStates`     | JSON `{"after": key or null}` | chunk 0 = a page of states (`optimizer::format`); text = JSON `{"next": key or null}` |
//! | 7  | `SetOptimizerStates`     | a page of states (`optimizer::format`); text `replace` or `merge` | empty |
//! | 8  | `Stats`                  | empty                       | chunk 0 = JSON statistics (memory, entries, held bytes) |
//! | 9  | `Checkpoint`             | JSON `{"dir": path, "id": n}` | chunk 0 = JSON of the shard written (`ps::checkpoint::ShardFile`) |

mod code;
mod control;
mod decode;
mod error;
mod header;
mod message;
#[cfg(test)]
mod tests;

pub use code::ErrorCode;
pub use decode::{check, parse, parse_head};
pub use error::{DecodeError, EncodeError};
pub use header::{Command, Flags, Header, HEADER_LEN, MAGIC, PROTOCOL_VERSION};
pub use message::{Chunk, DTypeCode, Message, Meta};

/// Bounds applied to every frame, in both directions, before any memory is reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest whole frame (header + body) in bytes. Default 1 GiB (`SYNKV_MAX_FRAME_BYTES`).
    pub max_frame_bytes: u64,
    /// Most keys in one frame. Default 1 Mi.
    pub max_keys: u32,
    /// Most chunks in one frame. Default 64 Ki.
    pub max_chunks: u32,
    /// Most node entries in one frame. Default 65 536.
    pub max_nodes: u32,
    /// Longest string field (host, text) in bytes. Default 64 KiB.
    pub max_string_len: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_frame_bytes: 1 << 30, max_keys: 1 << 20, max_chunks: 1 << 16, max_nodes: 1 << 16, max_string_len: 64 << 10 }
    }
}

impl Limits {
    /// Largest frame accepted during the authentication handshake (64 KiB): an unauthenticated
    /// peer cannot make us reserve more than this.
    pub const HANDSHAKE_FRAME_BYTES: u64 = 64 << 10;
    /// Largest frame on a control connection (to or from the scheduler): 16 MiB.
    pub const CONTROL_FRAME_BYTES: u64 = 16 << 20;

    /// These limits with the frame size capped at `max_frame_bytes`.
    #[must_use]
    pub fn capped(self, max_frame_bytes: u64) -> Limits {
        Limits { max_frame_bytes: self.max_frame_bytes.min(max_frame_bytes), ..self }
    }
}

/// Rounds `n` up to a multiple of 8, or `None` on overflow.
pub(crate) fn pad8(n: u64) -> Option<u64> {
    n.checked_add(7).map(|v| v & !7)
}
