//! Moving frames: [`Connection`] (one framed byte stream) behind the [`Transport`] trait, the
//! bounded [`Outbox`] every connection writes from, and the one accept loop.
//!
//! ps-lite's `Van` split: the protocol (scheduler, cluster, server, worker) lives above; a
//! transport only binds, connects and carries whole [`Message`](super::proto::Message)s.
//! [`TcpTransport`] is the real one (TCP_NODELAY, autotuned socket buffers); [`MemTransport`]
//! connects tasks in one process through in-memory pipes, for tests that run on paused tokio
//! time (real sockets and paused time do not mix) and for single-process clusters. Peers on
//! one host move the bulk bytes of data frames through shared memory (`shm.rs`) under either.
//!
//! ## Organization
//! - `reader.rs` — [`FrameReader`]: frames held only as their bytes arrive; [`Ingress`], a
//!   process-wide budget of received, unprocessed bytes that pushes back on senders.
//! - `writer.rs` — [`FrameWriter`] (vectored, stall-bounded writes), [`Outbox`] (bounded in
//!   messages and bytes) and [`drain`], the single loop writing an outbox to a connection.
//! - `seal.rs` — [`Seal`]: after the handshake (`ps/auth.rs`), every frame carries a trailer
//!   proving its integrity and its place in the stream.
//! - `gate.rs` — [`Gate`]: bounds on connections pending their handshake (in total, per peer
//!   address, in time) and on established ones.
//! - `accept.rs` — [`accept_loop`], the single accept loop (a pending place per connection).
//! - `shm/` — shared-memory segments: a worker and a server on one host exchange the bulk
//!   bytes of data frames through them (`SYNKV_SHM`), the frames carrying descriptors; a
//!   server's broadcast segment (`shm/broadcast.rs`) holds answers every local worker reads;
//!   `share.rs` agrees on them when a worker connects.
//! - `ports.rs` — [`ports::free_port`]: ports for a job's listeners, outside the ephemeral range.
//!
//! Addresses are `host:port` strings throughout, as the `DMLC_*` variables give them.

mod accept;
mod connection;
mod gate;
pub mod landing;
mod mem;
pub mod ports;
mod reader;
mod seal;
pub mod share;
pub mod shm;
mod tcp;
mod writer;

use std::future::Future;

pub use accept::accept_loop;
pub use connection::Connection;
pub use gate::{Gate, Pending, HANDSHAKE_DEADLINE, PENDING_PER_PEER, PENDING_TOTAL};
pub use landing::{Landing, Target, LAND_MIN};
pub use mem::{MemListener, MemTransport};
pub use reader::{Admission, FrameReader, Ingress, Landings};
pub use seal::{Seal, TRAILER_LEN};
pub use tcp::{check_congestion, TcpFrameListener, TcpTransport};
pub use writer::{drain, Drained, FrameWriter, Outbox, OutboxError, OutboxRx, ShmOut};

use super::Result;

/// Something that can bind listeners and open connections (ps-lite's `Van`).
pub trait Transport: Clone + Send + Sync + 'static {
    /// The listener type [`bind`](Transport::bind) returns.
    type Listener: Listener;

    /// Listens on `addr` (`host:port`; port 0 picks a free one).
    fn bind(&self, addr: &str) -> impl Future<Output = Result<Self::Listener>> + Send;

    /// Connects to `addr` (`host:port`). Fails at once if nobody listens; callers retry.
    fn connect(&self, addr: &str) -> impl Future<Output = Result<Connection>> + Send;
}

/// A bound listener handing out framed connections.
pub trait Listener: Send + 'static {
    /// The address peers should connect to (`host:port`).
    fn local_addr(&self) -> Result<String>;

    /// Waits for the next connection; returns it and the peer's address.
    fn accept(&mut self) -> impl Future<Output = Result<(Connection, String)>> + Send;
}
