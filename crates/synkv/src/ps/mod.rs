//! The distributed layer (`ps`, for parameter server): ps-lite's roles rebuilt on tokio. (Not
//! named `dist`: common ignore files and tools treat a `dist/` folder as build output.)
//!
//! ## Organization
//! - [`proto`] — the wire format: a fixed header, a typed meta section, zero-copy chunks.
//! - [`transport`] — [`Connection`] (one framed stream, vectored writes) behind the
//!   [`Transport`] trait: [`TcpTransport`] and the in-process [`MemTransport`].
//! - [`auth`] — the handshake every connection starts with: mutual authentication from the
//!   shared secret (Noise `NNpsk0`), the identity bound to the connection, sealed frames after.
//! - [`checkpoint`] — the servers' checkpoint files (shards) and manifests.
//! - [`config`] — [`Config`] from `DMLC_*`/`SYNKV_*` variables (table in `docs/dist-env.md`).
//! - [`metrics`] — Prometheus series of every role and their `GET /metrics` endpoint
//!   (`SYNKV_METRICS_ADDR`, `docs/metrics.md`).
//! - [`orchestrator`] — without `DMLC_PS_ROOT_URI`, a worker's rank, the cluster's size and
//!   what the process hosts (scheduler, a server) from torchrun's, Slurm's or MPI's variables.
//! - [`scheduler`] — [`Scheduler`]: rendezvous, rank assignment, barriers, heartbeats,
//!   failure detection and the shutdown sequence.
//! - [`cluster`] — [`Cluster`], a node's view of the cluster (ps-lite's `Postoffice` as a value):
//!   join, ranks, barriers, failure notification, finish.
//! - [`slicer`] — where keys live: ps keys (int keys, FNV-1a for str keys), the server of a
//!   small key, the slices of a big one.
//! - [`topology`] — which live server holds each partition and its backup copy
//!   (`SYNKV_SERVER_REPLICAS`).
//! - [`codec`] — array buffers ↔ chunk bytes.
//! - [`server`] — [`Server`]: key shards, sync rounds, the optimizer, [`ServerCmd`]s.
//! - [`trace`] — Chrome-trace timelines of every role (`SYNKV_TRACE_DIR`) and the flight
//!   recorder dumped when a peer dies or a wait times out (`docs/tracing.md`).
//! - [`worker`] — [`Worker`]: a worker's membership and its [`Client`] connections to every
//!   server (requests with ids and deadlines).
//!
//! The ps layer sits below the store: nothing here imports `store`. The worker *store*
//! (`store::distributed`) builds on [`Worker`]; the server uses `ndarray` buffers and the
//! `optimizer`, which sit below it.
#![deny(unsafe_code)]

pub mod auth;
pub mod checkpoint;
pub mod cluster;
pub mod codec;
pub mod config;
mod error;
pub mod metrics;
mod node;
pub mod orchestrator;
pub mod proto;
pub mod scheduler;
pub mod server;
pub mod slicer;
pub mod topology;
pub mod trace;
pub mod transport;
pub mod worker;

pub use auth::Secret;
pub use cluster::Cluster;
pub use config::{CheckpointInterval, Config};
pub use error::{AuthError, ConfigError, Error};
pub use node::{Group, Node, NodeId, ParseRoleError, Rank, Role, UnknownRole};
pub use orchestrator::{Launch, Placement, Source};
pub use scheduler::Scheduler;
pub use server::{Server, ServerCmd};
pub use topology::Topology;
pub use transport::{Connection, Listener, MemTransport, TcpTransport, Transport};
pub use worker::{wait_each, Client, Worker};

/// A `Result` whose error is [`ps::Error`](Error).
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}

    #[test]
    fn public_handles_are_send_and_sync() {
        send_sync::<super::Cluster>();
        send::<super::Connection>(); // used through `&mut`, so `Sync` is not needed
        send_sync::<super::Error>();
        send_sync::<super::Scheduler>();
        send_sync::<super::TcpTransport>();
        send_sync::<super::MemTransport>();
        send_sync::<super::proto::Message>();
        send_sync::<super::Server>();
        send_sync::<super::Worker>();
        send_sync::<super::Client>();
    }
}
