//! The store: one [`KVStore`] surface over every store type.
//!
//! [`create`] parses a type name and builds the store. `local` and `device` (and MXNet's
//! aliases `local_update_cpu`, `local_allreduce_cpu`, `local_allreduce_device`) are in-process
//! stores that sum per-device values on the CPU; they differ only in what `device` will accept
//! later (gradient compression). The distributed types (`dist_sync`, `dist_async`,
//! `dist_device_sync`) are the worker side of a parameter-server cluster (`dist/`).
//!
//! Layout:
//! - `key.rs` — [`Key`] (int or str) and [`Keys`], the one-or-many key argument;
//! - `args.rs` — [`Arrays`], the one-array / per-device-list / list-of-lists value argument,
//!   and the flattening rules (spec K3.1);
//! - `kind.rs` — [`StoreType`]: the accepted type names;
//! - `local.rs` — the in-process backend: entries, validation and the engine operations;
//! - `dist/` — the distributed backend (worker side): key registry, engine operations that
//!   talk to the servers through `crate::ps::Worker`;
//! - `kvstore.rs` — [`KVStore`], the public surface;
//! - `error.rs` — [`Error`].
//!
//! Semantics follow `spec/KVSTORE_SEMANTICS.md` (K0–K5); the deliberate differences from
//! MXNet are listed in `docs/mxnet-differences.md`.
#![deny(unsafe_code)]

mod args;
mod distributed;
mod error;
mod key;
mod kind;
mod kvstore;
mod local;

pub use args::Arrays;
pub use distributed::{CheckpointInfo, ServerStats};
pub use error::Error;
pub use key::{Key, KeyKind, Keys};
pub use kind::StoreType;
pub use kvstore::{create, KVStore, PullOptions, PullReport, Updater};
