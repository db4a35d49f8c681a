//! # synkv — a parameter-synchronisation key-value store
//!
//! synkv is MXNet's KVStore rebuilt in Rust: a store keeps one n-d array per key; workers
//! `push` gradients (a list of per-device values is summed, then an updater or optimizer is
//! applied) and `pull` weights back. Every operation is asynchronous and ordered per key by a
//! dependency engine, so communication overlaps computation.
//!
//! ## Brief overview
//! - [`NDArray`] — shape, [`DType`], [`Context`] and storage; a cheap handle (`Arc`) whose
//!   reads and writes are ordered by the engine.
//! - [`engine`] — the mutation-aware dataflow scheduler ([`engine::Engine`], [`engine::Var`]).
//! - [`kernels`] — vectorised, parallel loops over slices (sum, copy, axpy).
//! - [`KVStore`] — `init`, `push`, `pull`, `pushpull`, `broadcast`, `set_updater`, created by
//!   [`create`] from a type name (`local`, `device`, and MXNet's aliases).
//!
//! ## Example
//! ```
//! use synkv::{create, Context, NDArray, Key};
//!
//! let kv = create("local")?;
//! kv.init(3, &NDArray::ones(&[2, 3]))?;
//! // two devices push a gradient each: they are summed, then assigned
//! let grads = [NDArray::ones_on(&[2, 3], Context::cpu(0)), NDArray::ones_on(&[2, 3], Context::cpu(1))];
//! kv.push(3, &grads[..])?;
//! let out = NDArray::zeros(&[2, 3]);
//! kv.pull(3, &out)?;
//! assert_eq!(out.to_vec::<f32>()?, vec![2.0; 6]);
//! # Ok::<(), synkv::Error>(())
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod compression;
pub mod durable;
pub mod engine;
mod error;
pub mod kernels;
pub mod ndarray;
pub mod optimizer;
pub mod ps;
pub mod store;

pub use error::{Error, Result};
pub use ndarray::{Context, DType, NDArray, Shape, StorageType};
pub use store::{create, KVStore, Key};

/// The README's Rust example, compiled and run as a doctest.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
